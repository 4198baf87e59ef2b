"""Play kube-scheduler against ``gpuslice serve`` and measure it (figures: docs/serving.md, Speed).

For each cluster size (nodes of 8 GPUs) and policy, the driver writes a cluster file
(nodes in all four sharing modes, plus the pending pods it will schedule), starts
``gpuslice serve --cluster-file FILE`` as a user does (a subprocess on 127.0.0.1), and
for every pod: POST filter (with NodeNames, or in the second mode with full Nodes),
prioritize on the survivors, choose the top score, and bind asynchronously in a thread
pool, as kube-scheduler does. It prints p50/p99 of filter and prioritize and the
sustained pods/s, and the same figures for a do-nothing endpoint (same HTTP stack,
answers without looking) measured in the same run, with the ratios.

    python benchmarks/extender_driver.py                       # 100, 1000, 5000 nodes; binpack, fgd
    python benchmarks/extender_driver.py --nodes 100 --pods 200 --policy binpack --mode names
    python benchmarks/extender_driver.py --nodes 5000 --mode names --warmup 200 --server-cpus 1  # server: own CPU
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from scheduler.extender.client import ExtenderClient
from scheduler.extender.run import GC_THRESHOLDS

PREFIX = "gpuslice.io/"
BODY_CAP = 256 * 1024 * 1024  # full Nodes at 5,000 nodes are several MiB

# (share of nodes, inventory of one 8-GPU node)
NODE_KINDS = (
    (0.4, {"model": "H100-80GB", "mode": "exclusive"}),
    (0.3, {"model": "A100-80GB", "mode": "mps"}),
    (0.2, {"model": "L4", "mode": "time-slicing", "replicas": 4}),
    (0.1, {"model": "H100-80GB", "mode": "mig"}),
)
# (weight, annotations) of the pod stream
POD_KINDS: tuple[tuple[float, dict[str, str]], ...] = (
    (0.25, {"gpu-fraction": "0.25"}),
    (0.20, {"gpu-fraction": "0.5"}),
    (0.10, {"gpu-memory": "10Gi", "gpu-compute": "20"}),
    (0.20, {"gpu-count": "1"}),
    (0.05, {"gpu-count": "2"}),
    (0.10, {"mig-profile": "1g.10gb"}),
    (0.05, {"mig-profile": "3g.40gb"}),
    (0.05, {}),  # CPU only
)


# ---------------------------------------------------------------- the cluster


def make_node(i: int, rng: random.Random) -> dict[str, Any]:
    kind = rng.choices([k for _, k in NODE_KINDS], [w for w, _ in NODE_KINDS])[0]
    name = f"node-{i:05d}"
    devices = [
        {
            "index": g,
            "uuid": f"GPU-{i:05d}-{g}",
            **kind,
            **({"nvlinkPeers": [h for h in range(8) if h != g]} if kind["mode"] == "exclusive" else {}),
        }
        for g in range(8)
    ]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"node-uid-{i}",
            "resourceVersion": "1",
            "labels": {"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": f"zone-{i % 3}"},
            "annotations": {PREFIX + "inventory": json.dumps({"devices": devices}, separators=(",", ":"))},
        },
        "spec": {"podCIDR": f"10.{i // 256 % 256}.{i % 256}.0/24"},
        "status": {
            "allocatable": {"cpu": "128", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": "8"},
            "capacity": {"cpu": "128", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            "nodeInfo": {"kubeletVersion": "v1.31.0", "osImage": "Ubuntu 22.04", "architecture": "amd64"},
        },
    }


def make_pod(i: int, rng: random.Random) -> dict[str, Any]:
    annotations = rng.choices([a for _, a in POD_KINDS], [w for w, _ in POD_KINDS])[0]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"pod-{i:06d}",
            "namespace": "bench",
            "uid": f"pod-uid-{i:06d}",
            "resourceVersion": "1",
            "labels": {"app": "bench"},
            "annotations": {PREFIX + k: v for k, v in annotations.items()},
        },
        "spec": {
            "schedulerName": "gpuslice",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/app:1",
                    "resources": {"requests": {"cpu": rng.choice(["1", "2", "4"]), "memory": "8Gi"}},
                }
            ],
        },
        "status": {"phase": "Pending"},
    }


def write_cluster(path: Path, nodes: int, pods: int, seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rng = random.Random(seed)
    node_list = [make_node(i, rng) for i in range(nodes)]
    pod_list = [make_pod(i, rng) for i in range(pods)]
    path.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "List", "items": node_list + pod_list}))
    return node_list, pod_list


# ---------------------------------------------------------------- the servers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def gpuslice_command() -> list[str]:
    script = Path(sys.executable).with_name("gpuslice")
    if script.exists():
        return [str(script)]
    found = shutil.which("gpuslice")
    return [found] if found else [sys.executable, "-c", "from scheduler.cli import main; main()"]


@contextmanager
def running(
    command: list[str], port: int, log: Path, cpus: set[int] | None = None
) -> Iterator[tuple[ExtenderClient, int]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        if cpus:
            os.sched_setaffinity(proc.pid, cpus)
        client = ExtenderClient(f"http://127.0.0.1:{port}", timeout=120)
        try:
            deadline = time.monotonic() + 300
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"{command[0]} exited with {proc.returncode}; see {log}")
                try:
                    if client.request("GET", "/readyz")[0] == 200:
                        break
                except Exception:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"not ready after 300 s; see {log}")
                time.sleep(0.1)
            yield client, proc.pid
        finally:
            client.close()
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def noop_app() -> Any:
    """The do-nothing extender: the same uvicorn and JSON work, no decision."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def filter_(request: Request) -> Response:
        args = orjson.loads(await request.body())
        nodes, names = args.get("Nodes"), args.get("NodeNames")
        body = {
            "Nodes": nodes,
            "NodeNames": names,
            "FailedNodes": None,
            "FailedAndUnresolvableNodes": None,
            "Error": "",
        }
        return Response(orjson.dumps(body), media_type="application/json")

    async def prioritize(request: Request) -> Response:
        args = orjson.loads(await request.body())
        names = args.get("NodeNames") or [n["metadata"]["name"] for n in (args.get("Nodes") or {}).get("items", [])]
        return Response(orjson.dumps([{"Host": n, "Score": 0} for n in names]), media_type="application/json")

    async def bind(request: Request) -> Response:
        await request.body()
        return Response(b'{"Error":""}', media_type="application/json")

    async def readyz(request: Request) -> Response:
        return Response(b"ready")

    return Starlette(
        routes=[
            Route("/filter", filter_, methods=["POST"]),
            Route("/prioritize", prioritize, methods=["POST"]),
            Route("/bind", bind, methods=["POST"]),
            Route("/readyz", readyz),
        ]
    )


# ---------------------------------------------------------------- kube-scheduler's part


@dataclass
class Result:
    filter_ms: list[float]
    prioritize_ms: list[float]
    server_cpu_ms: float  # the server's CPU time per measured pod (nan where /proc is not there)
    driver_cpu_ms: float  # the driver's, likewise
    pods_per_s: float
    bound: int
    unschedulable: int
    bind_errors: int


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


class Connection:
    """One keep-alive HTTP/1.1 connection on a raw socket: kube-scheduler's Go client costs
    next to nothing, so the load generator must not either (http.client parses every
    response's headers with the email package)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""

    def post(self, path: bytes, body: bytes) -> bytes:
        head = b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        self.sock.sendall(head % (path, len(body)) + body)
        while (end := self.buffer.find(b"\r\n\r\n")) < 0:
            self._read()
        lines = self.buffer[:end].split(b"\r\n")
        if not lines[0].startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"POST {path.decode()}: {lines[0].decode()}")
        length = next(
            int(v) for k, _, v in (line.partition(b":") for line in lines[1:]) if k.lower() == b"content-length"
        )
        start = end + 4
        while len(self.buffer) < start + length:
            self._read()
        data, self.buffer = self.buffer[start : start + length], self.buffer[start + length :]
        return data

    def _read(self) -> None:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise RuntimeError("the server closed the connection")
        self.buffer += chunk

    def close(self) -> None:
        self.sock.close()


NAMES_KEY = b'"NodeNames":'


def split_filter_answer(data: bytes) -> tuple[dict[str, Any], bytes]:
    """Filter's answer decoded, except its NodeNames array, given back as its raw bytes.

    kube-scheduler (Go) decodes the survivors and encodes them again for prioritize at next to
    no cost; in Python, decoding thousands of names per pod would make the driver the
    bottleneck it measures. Node names hold no ``]`` (DNS subdomains), so the array ends at the
    first one; the rest is decoded in full, which proves the cut fell between two members
    (else the answer is decoded whole)."""
    at = data.find(NAMES_KEY)
    if at >= 0:
        begin = at + len(NAMES_KEY)
        end = data.find(b"]", begin) + 1
        if data[begin : begin + 1] == b"[" and end:
            try:
                return orjson.loads(data[:begin] + b"null" + data[end:]), data[begin:end]
            except orjson.JSONDecodeError:
                pass
    result = orjson.loads(data)
    return result, orjson.dumps(result.get("NodeNames"))


def top_host(data: bytes) -> str | None:
    """The first host with the highest score in prioritize's answer (``max`` over the decoded
    list gives the same), None for an empty list.

    Decoding thousands of ``{"Host", "Score"}`` objects per pod would make the driver the
    bottleneck it measures. Host names hold no ``}``, so where every entry ends with its score
    (``"Score":N}``, or ``"Score": N}`` as gpuslice pads them) the scores are read at the
    closing braces; any other shape is decoded in full."""
    buf = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(buf == ord("}"))
    if len(ends) and ends[0] >= 3:
        ones = buf[ends - 1].astype(np.int64) - ord("0")
        before = buf[ends - 2]
        tens = before == ord("1")
        if (
            ((ones >= 0) & (ones <= 9)).all()
            and (tens | (before == ord(":")) | (before == ord(" "))).all()
            and (buf[ends[tens] - 3] == ord(":")).all()
        ):
            end = int(ends[np.argmax(ones + 10 * tens)])
            key = data.rfind(b'"Host":', 0, end)
            if key >= 0:
                start = data.index(b'"', key + len(b'"Host":')) + 1
                return data[start : data.index(b'"', start)].decode()
    scores = orjson.loads(data)
    return str(max(scores, key=itemgetter("Score"))["Host"]) if scores else None


def play(
    port: int,
    server: int,
    nodes: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    mode: str,
    warmup: int,
    binders: int = 8,
) -> Result:
    names = [n["metadata"]["name"] for n in nodes]
    by_name = {n["metadata"]["name"]: n for n in nodes}
    all_names = orjson.dumps(names)
    all_nodes = orjson.dumps({"metadata": {}, "items": nodes})
    encoded = [orjson.dumps(pod) for pod in pods]  # as kube-scheduler's informer holds them, encoded once
    binds = [
        orjson.dumps({"PodName": p["metadata"]["name"], "PodNamespace": "bench", "PodUID": p["metadata"]["uid"]})[:-1]
        for p in pods
    ]

    def args(pod: bytes, listed: bytes | None) -> bytes:
        """The ExtenderArgs body: ``listed`` is the survivors' NodeNames array or NodeList as
        JSON, None for every node."""
        if mode == "names":
            return b'{"Pod":' + pod + b',"Nodes":null,"NodeNames":' + (listed or all_names) + b"}"
        return b'{"Pod":' + pod + b',"Nodes":' + (listed or all_nodes) + b',"NodeNames":null}'

    filter_ms: list[float] = []
    prioritize_ms: list[float] = []
    unschedulable = 0
    pending: list[Future[str]] = []
    local = threading.local()
    opened: list[Connection] = []

    def bind(i: int, node: str) -> str:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = Connection(port)
            opened.append(conn)
        return str(orjson.loads(conn.post(b"/bind", binds[i] + b',"Node":' + orjson.dumps(node) + b"}"))["Error"])

    conn = Connection(port)
    # As gpuslice serve does after its sync: the cluster and pods held here are hidden from the
    # collector, which then runs less often (else its full collections walked them mid-run).
    gc.collect()
    gc.freeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    with ThreadPoolExecutor(binders) as pool:
        started = server_cpu0 = driver_cpu0 = 0.0
        for i, pod in enumerate(encoded):
            if i == warmup:
                for f in pending:
                    f.result()
                pending.clear()
                started = time.perf_counter()
                server_cpu0, driver_cpu0 = cpu_seconds(server), time.process_time()
            body = args(pod, None)
            t0 = time.perf_counter()
            data = conn.post(b"/filter", body)
            t1 = time.perf_counter()
            if mode == "names":
                result, survivors = split_filter_answer(data)
                empty = survivors in (b"[]", b"null")
            else:
                result = orjson.loads(data)
                items = (result["Nodes"] or {}).get("items", [])
                survivors = orjson.dumps({"metadata": {}, "items": [by_name[n["metadata"]["name"]] for n in items]})
                empty = not items
            if result.get("Error"):
                raise RuntimeError(f"filter failed: {data[:300]!r}")
            if i >= warmup:
                filter_ms.append((t1 - t0) * 1000)
            if empty:
                unschedulable += i >= warmup
                continue
            body = args(pod, survivors)
            t2 = time.perf_counter()
            data = conn.post(b"/prioritize", body)
            t3 = time.perf_counter()
            if i >= warmup:
                prioritize_ms.append((t3 - t2) * 1000)
            top = top_host(data)
            if top is None:
                raise RuntimeError(f"prioritize answered no host: {data[:300]!r}")
            pending.append(pool.submit(bind, i, top))
        errors = sum(1 for f in pending if f.result())
        elapsed = time.perf_counter() - started
    for c in [conn, *opened]:
        c.close()
    gc.set_threshold(*thresholds)
    gc.unfreeze()
    measured = len(pods) - warmup
    server_cpu = (cpu_seconds(server) - server_cpu0) * 1000 / measured
    driver_cpu = (time.process_time() - driver_cpu0) * 1000 / measured
    return Result(
        filter_ms,
        prioritize_ms,
        server_cpu,
        driver_cpu,
        measured / elapsed,
        len(pending) - errors,
        unschedulable,
        errors,
    )


def pin(server_cpus: int) -> set[int] | None:
    """Split this machine's CPUs: the first ``server_cpus`` for the server, the rest for this
    driver (set here at once); None when ``server_cpus`` is 0. kube-scheduler and the
    extender run in separate containers, so they do not take each other's cores."""
    if not server_cpus:
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if server_cpus >= len(cpus):
        raise SystemExit(f"--server-cpus {server_cpus}: this machine has {len(cpus)} CPUs; leave the driver one")
    os.sched_setaffinity(0, set(cpus[server_cpus:]))
    return set(cpus[:server_cpus])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and its threads so far (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def over_allocated(client: ExtenderClient) -> int:
    """Records the service refused as conflicting (0 means nothing is over capacity)."""
    nodes = client.get("/debug/nodes")["nodes"]
    return sum(len(n.get("recordErrors") or {}) for n in nodes)


# ---------------------------------------------------------------- main


def both_p99(got: Result) -> float:
    """p99 of filter + prioritize per pod."""
    return pct([f + p for f, p in zip(got.filter_ms, got.prioritize_ms, strict=False)], 99)


def row(n: int, mode: str, policy: str, got: Result, base: Result | None, bad: str) -> tuple[str, ...]:
    """One line of the table; ``base``, the noop's run, gives the ratios."""
    both = both_p99(got)
    return (
        str(n),
        mode,
        policy,
        f"{pct(got.filter_ms, 50):.2f}",
        f"{pct(got.filter_ms, 99):.2f}",
        f"{pct(got.prioritize_ms, 50):.2f}",
        f"{pct(got.prioritize_ms, 99):.2f}",
        f"{both:.2f}",
        f"{got.pods_per_s:.0f}",
        f"{got.server_cpu_ms:.2f}",
        f"{got.driver_cpu_ms:.2f}",
        f"{both / both_p99(base):.2f}" if base else "-",
        f"{got.pods_per_s / base.pods_per_s:.2f}" if base else "-",
        str(got.bound),
        str(got.unschedulable),
        str(got.bind_errors),
        bad,
        f"{os.getloadavg()[0]:.2f}",
    )


def run(args: argparse.Namespace) -> None:
    server_cpus = pin(args.server_cpus)
    work = Path(tempfile.mkdtemp(prefix="gpuslice-bench-"))
    header = (
        "nodes",
        "mode",
        "policy",
        "filter p50",
        "filter p99",
        "prio p50",
        "prio p99",
        "f+p p99",
        "pods/s",
        "srv cpu/pod",
        "drv cpu/pod",
        "ratio p99",
        "ratio pods/s",
        "bound",
        "unsched",
        "bind err",
        "over-alloc",
        "load 1m",
    )
    print(" | ".join(header), flush=True)
    for n in args.nodes:
        cluster = work / f"cluster-{n}.json"
        nodes, pods = write_cluster(cluster, n, args.pods + args.warmup, args.seed)
        for mode in args.mode:
            port = free_port()
            noop = [sys.executable, __file__, "--noop-port", str(port)]
            with running(noop, port, work / f"noop-{n}-{mode}.log", server_cpus) as (_, pid):
                base = play(port, pid, nodes, pods, mode, args.warmup)
            print(" | ".join(row(n, mode, "(noop)", base, None, "-")), flush=True)
            for policy in args.policy:
                port = free_port()
                command = [
                    *gpuslice_command(),
                    "serve",
                    "--cluster-file",
                    str(cluster),
                    "--port",
                    str(port),
                    "--policy",
                    policy,
                    "--max-body-bytes",
                    str(BODY_CAP),
                ]
                with running(command, port, work / f"serve-{n}-{mode}-{policy}.log", server_cpus) as (client, pid):
                    got = play(port, pid, nodes, pods, mode, args.warmup)
                    bad = over_allocated(client)
                print(" | ".join(row(n, mode, policy, got, base, str(bad))), flush=True)
    print(
        f"\n(times in ms, client side over HTTP; {args.pods} measured pods after {args.warmup} warm-up pods; "
        "cpu/pod: CPU ms the server (srv) and this driver (drv) spent per measured pod, binds included; "
        "(noop) = a do-nothing endpoint on the same HTTP stack, run just before; ratio = the policy's f+p p99 and "
        f"pods/s over the noop's; load 1m: the machine's load average; logs in {work})"
    )
    if not args.keep:
        for path in work.glob("cluster-*.json"):
            path.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[100, 1000, 5000])
    parser.add_argument("--policy", nargs="+", default=["binpack", "fgd"])
    parser.add_argument("--mode", nargs="+", choices=["names", "nodes"], default=["names", "nodes"])
    parser.add_argument("--pods", type=int, default=400, help="measured pods per run")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the generated cluster files")
    parser.add_argument(
        "--server-cpus",
        type=int,
        default=0,
        help="give the server (gpuslice or the noop) this many CPUs of its own and the driver the rest "
        "(Linux; 0: share them all, the default)",
    )
    parser.add_argument("--noop-port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.noop_port:
        import uvicorn

        uvicorn.run(
            noop_app(), host="127.0.0.1", port=args.noop_port, log_level="warning", access_log=False, lifespan="off"
        )
        return
    os.environ.setdefault("PYTHONHASHSEED", "0")
    run(args)


if __name__ == "__main__":
    main()
