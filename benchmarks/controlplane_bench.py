"""Scheduling throughput and latency through the real control plane (tests/e2e/controlplane.py):
kube-apiserver, the real kube-scheduler with the shipped KubeSchedulerConfiguration (its
defaults, node sampling included) and, as its extender, gpuslice (default policy or binpack), a
do-nothing extender (passes every node, scores 0, binds through the API), the do-nothing
extender binding as gpuslice binds (``noop-ledger``), or none at all.

    python benchmarks/controlplane_bench.py [--nodes 5000] [--pods 20000] [--runs 3]
        [--modes default,binpack,noop,noop-ledger,none] [--fitting-only] [--max-backoff SECONDS]
        [--ledger-calls 2|3]

Each run starts a fresh control plane, creates the nodes (8 GPUs each, the driver's mix of
kinds) and then the pods (the driver's "many" mix: MIG, MPS, time-slicing, whole GPUs,
CPU-only and pods that fit nowhere) as fast as a pool of clients can, and watches them: pods
bound per second (bound pods over the time from the first creation to the last bind),
creation-to-bound latency p50 / p99 (the pod's POST sent to its bind seen on a watch), the
extender's peak resident memory and its CPU time per bound pod, and for gpuslice the filter calls
per bound pod (from its /metrics: above 1 where kube-scheduler asks again about pods it could not
place). Modes alternate run by run; the table gives medians and ranges. Two knobs measure what
the pods that fit nowhere cost (kube-scheduler asks the extender about them again after every
back-off): ``--fitting-only`` leaves them out of the mix, ``--max-backoff`` sets kube-scheduler's
``podMaxBackoffSeconds`` (the shipped configuration keeps its default, 10 s).

``noop-ledger`` splits gpuslice's gap in two: it decides nothing, as the do-nothing extender,
but binds through gpuslice's own :class:`~scheduler.kube.binder.Binder` (the same client, the
node's ledger written by compare-and-set, the Binding carrying the record), each
pod given a record of no GPU. What it loses against ``noop`` is the cost of gpuslice's bind
protocol; what gpuslice loses against it is the cost of its accounting. ``--ledger-calls 3``
adds the pod read gpuslice makes where its watch does not show the pod pending (see
:func:`ledger_bind`), to measure what it is worth.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.extender_driver import HOPELESS, make_node, make_pod, many_shapes, node_inventory  # noqa: E402
from tests.e2e.controlplane import ApiError, Client, ControlPlane, build, free_port  # noqa: E402
from tests.e2e.deployed import Gpuslice, apply_all, config_map, put_node, shipped  # noqa: E402

NAMESPACE = "bench"
MODES = ("default", "binpack", "noop", "noop-ledger", "none")


def peak_rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def filter_calls(port: int, keep: Path) -> float:
    """Filter calls gpuslice answered so far (its /metrics, kept in ``keep``)."""
    text = httpx.get(f"https://127.0.0.1:{port}/metrics", verify=False, timeout=10).text
    keep.write_text(text)
    prefix = 'gpuslice_extender_request_seconds_count{verb="filter"}'
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))


def retried(call: Any, *args: Any, tries: int = 3) -> Any:
    """``call(*args)``, tried again after a transport error (a connection the API server closed, a
    TLS record cut short under many concurrent clients): the cluster is made once per run and a
    lost node or pod would change what is measured. A creation that did land before the error is
    seen again as a conflict (409): put_node then updates the node, a pod is taken as made."""
    for attempt in range(tries):
        try:
            return call(*args)
        except httpx.TransportError:
            if attempt == tries - 1:
                raise
            time.sleep(0.5 * (attempt + 1))
        except ApiError as exc:
            if exc.status != 409 or attempt == 0:
                raise
            return None
    return None


def ledger_bind(api: str, ca: Path | None, token: str | None, calls: int = 2) -> Any:
    """A bind through gpuslice's own Binder (in a worker thread, as gpuslice's bind runs), the
    pod given a record of no GPU: gpuslice's bind protocol without its accounting. An async
    function of the bind's arguments, returning the bind's error or "". It follows no watch, so
    a node's first bind reads the node's ledger before making it (gpuslice, whose watch knows
    the ledgers, makes it at once).

    ``calls``: 2, as gpuslice binds a pod its watch shows pending (the ledger's compare-and-set,
    the Binding): each pod is taken as such a watch would show it, pending, with the uid
    kube-scheduler sent and no annotation of gpuslice's (the benchmark's pods have none); 3 reads
    the pod first, as gpuslice does where its watch does not show it so (what that read costs)."""
    import asyncio

    from scheduler.backend import PodRef
    from scheduler.core.allocation import Allocation
    from scheduler.kube.api import KubeApi
    from scheduler.kube.binder import Binder, WatchedPod
    from scheduler.kube.clock import SYSTEM_CLOCK
    from scheduler.kube.options import KubeOptions

    options = KubeOptions.build(namespace="gpuslice")
    pending: dict[str, WatchedPod] = {}  # what a watch would show of the pods being bound
    binder = Binder(
        KubeApi.from_url(api, token, str(ca) if ca else None, True, options.request_timeout_s),
        options,
        SYSTEM_CLOCK,
        random.Random(),
        watched=pending.get if calls == 2 else None,
    )

    async def bind(args: dict[str, Any]) -> str:
        pod = PodRef(args["PodNamespace"], args["PodName"], args["PodUID"])
        node = args["Node"]
        pending[pod.key] = WatchedPod(pod.uid, "", False)
        try:
            result = await asyncio.to_thread(binder.bind, pod, node, lambda _records: Allocation(node))
        finally:
            pending.pop(pod.key, None)
        return result.error or ""

    return bind


def noop_extender(port: int, tls: Path, api: str, ca: Path, token: str, ledger_calls: int | None = None) -> None:
    """The do-nothing extender: every node passes, every score is 0, the bind is the Binding
    (with ``ledger_calls``: gpuslice's bind protocol, :func:`ledger_bind`)."""
    import uvicorn

    from benchmarks.extender_driver import noop_app

    client = httpx.AsyncClient(
        base_url=api, verify=ssl.create_default_context(cafile=str(ca)), headers={"Authorization": f"Bearer {token}"}
    )

    async def bind(args: dict[str, Any]) -> str:
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": args["PodName"], "namespace": args["PodNamespace"], "uid": args["PodUID"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": args["Node"]},
        }
        path = f"/api/v1/namespaces/{args['PodNamespace']}/pods/{args['PodName']}/binding"
        answer = await client.post(path, json=binding)
        return "" if answer.status_code < 300 else answer.text[:200]

    app = noop_app(bind if ledger_calls is None else ledger_bind(api, ca, token, ledger_calls))
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        ssl_certfile=str(tls / "tls.crt"),
        ssl_keyfile=str(tls / "tls.key"),
        log_level="warning",
    )


def run_once(binary: Path, mode: str, args: argparse.Namespace, tls: Path, seed: int) -> dict[str, Any]:

    workdir = Path(tempfile.mkdtemp(prefix=f"bench-{mode}-"))
    port = free_port()
    plane = ControlPlane(binary, workdir / "cp", {})
    plane.start()
    extender_pid = None
    noop = None
    service = None
    try:
        admin = plane.client()
        objects = shipped()
        apply_all(admin, objects)
        admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        rng = random.Random(seed)
        nodes = [make_node(i, node_inventory(i, rng)) for i in range(args.nodes)]
        for node in nodes:
            for key in ("uid", "resourceVersion"):
                node["metadata"].pop(key, None)
            node["metadata"]["labels"]["nvidia.com/gpu.present"] = "true"
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda n: retried(put_node, admin, n), nodes))
        settings = config_map(objects)
        service = Gpuslice(plane, port, tls, workdir, settings)
        scheduler = yaml.safe_load(service.scheduler_config())
        if mode in ("default", "binpack"):
            service.start(policy=None if mode == "default" else "binpack")
            assert service.process is not None
            extender_pid = service.process.pid
        elif mode in ("noop", "noop-ledger"):
            token = admin.account_token("gpuslice", "gpuslice")
            noop = subprocess.Popen(
                [sys.executable, __file__, "noop-extender", str(port), str(tls), plane.url, str(plane.ca), token]
                + (["ledger", str(args.ledger_calls)] if mode == "noop-ledger" else [])
            )
            extender_pid = noop.pid
            deadline = time.monotonic() + 60
            while True:
                try:
                    httpx.get(f"https://127.0.0.1:{port}/readyz", verify=False, timeout=1)
                    break
                except httpx.HTTPError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        else:
            scheduler.pop("extenders")
        if args.max_backoff is not None:
            scheduler["podMaxBackoffSeconds"] = args.max_backoff
        token = admin.account_token("gpuslice", "gpuslice")
        plane.start_scheduler(yaml.safe_dump(scheduler), token)
        got = measure(plane, admin, args, rng, extender_pid)
        bound = max(got["bound"], 1)
        got["cpu_ms_per_pod"] = cpu_seconds(extender_pid) * 1000 / bound if extender_pid else float("nan")
        gpuslice = mode in ("default", "binpack")
        got["filters_per_pod"] = filter_calls(port, workdir / "metrics.txt") / bound if gpuslice else float("nan")
        return got
    finally:
        plane.stop("kube-scheduler")
        if service is not None:
            service.stop()
        if noop is not None:
            noop.terminate()
            noop.wait()
        plane.stop_all()


def shape(rng: random.Random, fitting_only: bool) -> dict[str, str]:
    """One pod's GPU request of the driver's "many" mix; ``fitting_only``: a pod of a shape no
    node kind could ever host (the mix's pods that fit nowhere) is drawn again."""
    while True:
        wanted = many_shapes(rng)
        if not fitting_only or wanted not in HOPELESS:
            return wanted


def measure(
    plane: ControlPlane, admin: Client, args: argparse.Namespace, rng: random.Random, pid: int | None
) -> dict[str, Any]:
    sent: dict[str, float] = {}
    bound: dict[str, float] = {}
    stop = threading.Event()

    def watch() -> None:
        """Binds as a watch sees them; a watch the API server closes is opened again (its
        first events list the pods again, and those already seen bound are skipped)."""
        context = ssl.create_default_context(cafile=str(plane.ca))
        access = httpx.Client(verify=context, headers={"Authorization": f"Bearer {admin.token}"}, timeout=None)
        while not stop.is_set():
            try:
                with access.stream(
                    "GET", f"{plane.url}/api/v1/namespaces/{NAMESPACE}/pods", params={"watch": "1"}
                ) as stream:
                    for line in stream.iter_lines():
                        if stop.is_set():
                            return
                        pod = json.loads(line)["object"]
                        if pod.get("spec", {}).get("nodeName") and pod["metadata"]["name"] not in bound:
                            bound[pod["metadata"]["name"]] = time.monotonic()
            except httpx.HTTPError:
                time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    time.sleep(1)
    pods = [
        make_pod(f"p{i:06d}", shape(rng, args.fitting_only), rng.choice([1, 2, 4]), rng.choice([4, 16, 64]))
        for i in range(args.pods)
    ]
    for pod in pods:
        for key in ("uid", "resourceVersion"):
            pod["metadata"].pop(key, None)
        pod.pop("status", None)
        pod["spec"]["tolerations"] = [{"operator": "Exists"}]

    def create(pod: dict[str, Any]) -> None:
        sent[pod["metadata"]["name"]] = time.monotonic()
        retried(admin.post, f"/api/v1/namespaces/{NAMESPACE}/pods", pod)

    start = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, pods))
    last, count = time.monotonic(), 0
    while time.monotonic() - last < args.settle and len(bound) < len(pods):
        time.sleep(1)
        if len(bound) != count:
            last, count = time.monotonic(), len(bound)
    stop.set()
    latencies = sorted(bound[n] - sent[n] for n in bound if n in sent)
    end = max(bound.values()) if bound else start
    return {
        "bound": len(bound),
        "pods_per_s": len(bound) / (end - start) if end > start else 0.0,
        "p50_s": latencies[len(latencies) // 2] if latencies else float("nan"),
        "p99_s": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] if latencies else float("nan"),
        "rss_mib": peak_rss_mib(pid) if pid else float("nan"),
    }


def table(results: dict[str, list[dict[str, Any]]]) -> str:
    lines = [
        "| extender | bound | pods/s | p50 (s) | p99 (s) | peak RSS (MiB) | CPU ms a bound pod"
        " | filter calls a bound pod |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def cell(runs: list[dict[str, Any]], key: str, fmt: str) -> str:
        values = [r[key] for r in runs]
        return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}–{max(values):{fmt}})"

    for mode, runs in results.items():
        lines.append(
            f"| {mode} | {cell(runs, 'bound', '.0f')} | {cell(runs, 'pods_per_s', '.1f')}"
            f" | {cell(runs, 'p50_s', '.2f')} | {cell(runs, 'p99_s', '.2f')} | {cell(runs, 'rss_mib', '.0f')}"
            f" | {cell(runs, 'cpu_ms_per_pod', '.1f')} | {cell(runs, 'filters_per_pod', '.2f')} |"
        )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "noop-extender":
        port, tls, api, ca, token = sys.argv[2:7]
        calls = int(sys.argv[8]) if sys.argv[7:8] == ["ledger"] else None
        noop_extender(int(port), Path(tls), api, Path(ca), token, calls)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated, of: " + ", ".join(MODES))
    parser.add_argument("--settle", type=float, default=30.0, help="stop once no pod bound for this many seconds")
    parser.add_argument(
        "--tls", type=Path, required=True, help="folder of ca.crt, tls.crt, tls.key for gpuslice.gpuslice.svc"
    )
    parser.add_argument(
        "--fitting-only",
        action="store_true",
        help="leave out the mix's pods that no node could ever host (to measure what their retries cost)",
    )
    parser.add_argument(
        "--max-backoff",
        type=int,
        help="kube-scheduler's podMaxBackoffSeconds (default: the shipped configuration's, kube-scheduler's 10 s)",
    )
    parser.add_argument(
        "--ledger-calls",
        type=int,
        default=2,
        help="noop-ledger's API calls a bind: 2 as gpuslice makes them for a pod its watch shows pending;"
        " 3 reading the pod first (what that call costs)",
    )
    args = parser.parse_args()
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"--modes {args.modes}: unknown {', '.join(unknown)}; accepted: {','.join(MODES)}")
    if args.ledger_calls not in (2, 3):
        parser.error(f"--ledger-calls {args.ledger_calls}: accepted: 2 or 3")
    if args.max_backoff is not None and args.max_backoff < 1:
        parser.error(f"--max-backoff {args.max_backoff}: accepted: a whole number of seconds, 1 or more")
    binary = build()
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for run in range(args.runs):
        for mode in results:
            got = run_once(binary, mode, args, args.tls, seed=run)
            results[mode].append(got)
            calls_of = {"ledger_calls": args.ledger_calls} if mode == "noop-ledger" else {}
            print(json.dumps({"mode": mode, **calls_of, "run": run, **got}), flush=True)
    calls = f" ({args.ledger_calls} API calls a bind)" if args.ledger_calls != 2 else ""
    print(table({mode + (calls if mode == "noop-ledger" else ""): runs for mode, runs in results.items()}))


if __name__ == "__main__":
    main()
