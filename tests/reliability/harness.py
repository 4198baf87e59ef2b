"""What the reliability suites and their dedicated scripts share: a fake API server that counts
conflicts, service replicas (in this process, or ``gpuslice serve`` subprocesses), the
API server's truth (node states rebuilt from its objects), an audit of that truth
(over-allocations, lost shares, half-written records) and a driver playing kube-scheduler.

The scripts (benchmarks/fuzz_endpoints.py, benchmarks/soak.py) import this module, so it
holds no pytest fixtures; those are in ``conftest.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scheduler.cli.serving import service_mounts
from scheduler.core.allocation import decode_record
from scheduler.core.errors import GpusliceError
from scheduler.core.inventory import SharingMode
from scheduler.core.k8s import parse_node
from scheduler.core.request import MILLI
from scheduler.core.state import NodeState, rebuild
from scheduler.extender.client import ExtenderClient, ServiceError
from scheduler.extender.config import load_config
from scheduler.extender.server import Server
from scheduler.extender.service import Extender
from scheduler.kube import KubeBackend
from scheduler.kube.ledger import decode_entries, ledger_name
from tests.fakes import FakeApiServer
from tests.fakes.apiserver import ApiFailure

PREFIX = "gpuslice.io/"
LEDGER_NAMESPACE = "gpuslice"
REPO = Path(__file__).resolve().parents[2]
SERVE = (sys.executable, "-c", "from scheduler.cli import main; main()", "serve")  # `gpuslice serve`

# Short timeouts so faults show within seconds; the production defaults are in KubeOptions.
KUBE_FAST: dict[str, Any] = {
    "request_timeout_s": 2.0,
    "watch_timeout_s": 4,
    "watch_read_slack_s": 1.0,
    "watch_grace_s": 10.0,
    "backoff_initial_s": 0.02,
    "backoff_max_s": 0.3,
    "start_timeout_s": 10.0,
    "conflict_backoff_s": 0.002,
    "conflict_retries": 30,
    "stale_allocation_s": 60.0,
    "sweep_interval_s": 3600.0,  # tests call sweep() themselves, on a fake clock
}


# ---------------------------------------------------------------- the API server


class CountingApiServer(FakeApiServer):
    """The fake API server, counting the 409 Conflicts it answers of its own accord (not injected ones)."""

    def __init__(self) -> None:
        super().__init__()
        self._count_lock = threading.Lock()
        self.conflicts = 0

    def _counted(self, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except ApiFailure as exc:
            if exc.code == 409:
                with self._count_lock:
                    self.conflicts += 1
            raise

    def update(self, resource: str, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._counted(super().update, resource, namespace, name, body)  # type: ignore[no-any-return]

    def patch_pod(self, namespace: str, name: str, patch: Any) -> dict[str, Any]:
        return self._counted(super().patch_pod, namespace, name, patch)  # type: ignore[no-any-return]

    def create_configmap(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._counted(super().create_configmap, namespace, body)  # type: ignore[no-any-return]

    def bind(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._counted(super().bind, namespace, name, body)  # type: ignore[no-any-return]

    def faults_fired(self) -> int:
        with self._lock:
            return sum(f.fired for f in self._faults)


# ---------------------------------------------------------------- cluster objects


def node_json(name: str, gpus: int = 2, model: str = "H100-80GB", mode: str = "mps", **device: Any) -> dict[str, Any]:
    """A node whose GPUs come from the inventory annotation."""
    devices = [{"index": i, "uuid": f"{name}-gpu{i}", "model": model, "mode": mode, **device} for i in range(gpus)]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name},
            "annotations": {PREFIX + "inventory": json.dumps({"devices": devices})},
        },
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}},
    }


def pod_json(name: str, namespace: str = "default", cpu: str = "100m", **annotations: str) -> dict[str, Any]:
    """A pending pod of gpuslice's scheduler; keyword annotations are short keys (``gpu_fraction="0.5"``)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{namespace}-{name}",
            "annotations": {PREFIX + k.replace("_", "-"): v for k, v in annotations.items()},
        },
        "spec": {
            "schedulerName": "gpuslice",
            "containers": [{"name": "main", "image": "app:1", "resources": {"requests": {"cpu": cpu}}}],
        },
        "status": {"phase": "Pending"},
    }


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _notes(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    notes = _meta(obj).get("annotations")
    return notes if isinstance(notes, Mapping) else {}


def pod_key(obj: Mapping[str, Any]) -> str:
    meta = _meta(obj)
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"


def _live(obj: Mapping[str, Any]) -> bool:
    return (obj.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def _node_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("spec") or {}).get("nodeName") or "")


# ---------------------------------------------------------------- truth and audit


Canon = tuple[Any, ...]


def canon(state: NodeState | None) -> Canon | None:
    """A node state in a form that does not depend on the order its records were applied in."""
    if state is None:
        return None
    usage = tuple(
        (u.memory_mib, u.compute_milli, u.shares, u.whole, tuple(sorted((s.start, s.size, s.profile) for s in u.mig)))
        for u in state.usage
    )
    return (state.node.name, state.cpu_milli, state.memory_mib, usage, tuple(sorted(state.pods)))


def truth(api: FakeApiServer, prefix: str = PREFIX) -> dict[str, Canon | None]:
    """Every node's state rebuilt from the API server's objects: the records of the live pods
    bound there by gpuslice (phase ``bound``), as a freshly started replica would count them."""
    return {name: canon(state) for name, state in truth_states(api, prefix).items()}


def truth_states(api: FakeApiServer, prefix: str = PREFIX) -> dict[str, NodeState | None]:
    """Like :func:`truth`, the states themselves."""
    pods = api.pods()
    out: dict[str, NodeState | None] = {}
    for obj in api.nodes():
        try:
            node = parse_node(obj, prefix)
        except GpusliceError:
            out[_meta(obj)["name"]] = None
            continue
        records = [
            (pod_key(p), _notes(p)[prefix + "allocation"])
            for p in pods
            if _node_of(p) == node.name
            and _live(p)
            and isinstance(_notes(p).get(prefix + "allocation"), str)
            and _notes(p).get(prefix + "bind-phase") == "bound"
        ]
        out[node.name] = rebuild(node, records)[0]
    return out


Shown = tuple[tuple[str, ...], tuple[tuple[int, int, int], ...]]


def shown_by_state(state: NodeState) -> Shown:
    """(pods, per device (memory MiB, compute milli, shares)): what ``/debug/nodes`` shows of a state."""
    return (
        tuple(sorted(k for k, _ in state.pods)),
        tuple((u.memory_mib, u.compute_milli, u.shares) for u in state.usage),
    )


def shown_by_service(described: Mapping[str, Any]) -> Shown:
    """The same, from one node of a running service's ``/debug/nodes``."""
    return (
        tuple(sorted(p["pod"] for p in described.get("pods", []))),
        tuple((d["memoryAllocatedMiB"], d["computeAllocatedMilli"], d["shares"]) for d in described.get("devices", [])),
    )


def cache_view(extender: Extender, names: Sequence[str]) -> dict[str, Canon | None]:
    with extender.cache.lock:
        return {name: canon(extender.cache.state(name)) for name in names}


def wait_for(predicate: Callable[[], bool], what: str, timeout_s: float = 10.0, step_s: float = 0.02) -> float:
    """Wait until ``predicate()``; returns the seconds it took, or raises AssertionError naming ``what``."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(step_s)
    return time.monotonic() - started


@dataclass
class Audit:
    """The API server's objects checked against what gpuslice promises."""

    bound: int = 0  # live pods bound with a record
    over_allocations: list[str] = field(default_factory=list)  # a device given beyond its capacity
    half_written: list[str] = field(default_factory=list)  # records of ours on pods that are not bound
    lost_shares: list[str] = field(default_factory=list)  # ledger entries no live pod backs
    shares_by_node: dict[str, int] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return not (self.over_allocations or self.half_written or self.lost_shares)

    def summary(self) -> str:
        return (
            f"bound {self.bound}, over-allocations {len(self.over_allocations)}, "
            f"half-written records {len(self.half_written)}, lost shares {len(self.lost_shares)}"
        )


def _device_overuse(node: Any, shares: Sequence[tuple[str, Any]]) -> list[str]:
    """Independent of the core's capacity model: per device, what its shares add up to."""
    problems = []
    by_index: dict[int, list[tuple[str, Any]]] = {}
    for key, share in shares:
        by_index.setdefault(share.index, []).append((key, share))
    for index, held in sorted(by_index.items()):
        if index >= len(node.devices):
            problems.append(f"{node.name} GPU {index} does not exist ({[k for k, _ in held]})")
            continue
        device = node.devices[index]
        pods = sorted(k for k, _ in held)
        if device.mode is SharingMode.MIG:
            taken: set[int] = set()
            for _, s in held:
                slots = set(range(s.mig.start, s.mig.start + s.mig.size)) if s.mig else set()
                if slots & taken:
                    problems.append(f"{node.name} GPU {index}: MIG slots given twice ({pods})")
                taken |= slots
            continue
        memory = sum(s.memory_mib for _, s in held)
        limit = device.memory_mib * (node.ts_memory_oversub_pct if device.mode is SharingMode.TIME_SLICING else 100)
        if memory * 100 > limit:
            problems.append(f"{node.name} GPU {index}: {memory} MiB given of {device.memory_mib} ({pods})")
        if device.mode is SharingMode.EXCLUSIVE and len(held) > 1:
            problems.append(f"{node.name} GPU {index}: exclusive GPU given {len(held)} times ({pods})")
        if device.mode is SharingMode.MPS:
            compute = sum(s.compute_milli for _, s in held)
            if compute * 100 > MILLI * node.mps_compute_oversub_pct:
                problems.append(f"{node.name} GPU {index}: {compute} milli compute given ({pods})")
        if device.mode is SharingMode.TIME_SLICING and len(held) > device.replicas:
            problems.append(f"{node.name} GPU {index}: {len(held)} pods on {device.replicas} replicas ({pods})")
    return problems


def audit(api: FakeApiServer, prefix: str = PREFIX, namespace: str = LEDGER_NAMESPACE) -> Audit:
    """Check every node's devices from the records of the pods running there (any phase: what
    their containers would read), every unbound pod for a record, every ledger entry for its pod."""
    result = Audit()
    pods = api.pods()
    by_key = {pod_key(p): p for p in pods}
    nodes = {_meta(n)["name"]: n for n in api.nodes()}
    for name, obj in sorted(nodes.items()):
        try:
            node = parse_node(obj, prefix)
        except GpusliceError:
            continue
        shares: list[tuple[str, Any]] = []
        for p in pods:
            text = _notes(p).get(prefix + "allocation")
            if _node_of(p) != name or not _live(p) or not isinstance(text, str):
                continue
            result.bound += 1
            try:
                alloc = decode_record(text, pod_key(p))
            except GpusliceError as exc:
                result.over_allocations.append(f"{pod_key(p)} on {name}: unreadable record: {exc}")
                continue
            shares.extend((pod_key(p), s) for s in alloc.shares)
        result.shares_by_node[name] = len(shares)
        result.over_allocations.extend(_device_overuse(node, shares))
    for p in pods:
        notes = _notes(p)
        ours = notes.get(prefix + "bind-phase") == "allocating"  # a forged record is not gpuslice's to clean
        if isinstance(notes.get(prefix + "allocation"), str) and ours and not _node_of(p) and _live(p):
            result.half_written.append(f"{pod_key(p)}: record ({notes.get(prefix + 'bind-phase')}) but no Binding")
    for name in sorted(set(nodes) | _ledger_nodes(api, namespace)):
        cm = api.configmap(namespace, ledger_name(name))
        if cm is None:
            continue
        for key, entry in decode_entries(name, (cm.get("data") or {}).get("ledger")).items():
            live = by_key.get(key)
            if live is None or _meta(live).get("uid") != entry.uid or not _live(live):
                result.lost_shares.append(f"ledger of {name}: {key} is gone")
            elif _node_of(live) not in ("", name):
                result.lost_shares.append(f"ledger of {name}: {key} runs on {_node_of(live)}")
            elif not _node_of(live):
                result.lost_shares.append(f"ledger of {name}: {key} is not bound ({entry.phase})")
    return result


def _ledger_nodes(api: FakeApiServer, namespace: str) -> set[str]:
    with api._lock:
        configmaps = list(api._objects["configmaps"].values())
    out = set()
    for cm in configmaps:
        if _meta(cm).get("namespace") == namespace:
            node = _notes(cm).get(PREFIX + "node")
            if isinstance(node, str):
                out.add(node)
    return out


# ---------------------------------------------------------------- replicas in this process


class Replica:
    """One service: Extender + KubeBackend + HTTP server in a thread, against ``api``."""

    def __init__(
        self,
        api_url: str,
        *,
        clock: Any = None,
        seed: int = 0,
        serve: Mapping[str, Any] | None = None,
        **kube: Any,
    ) -> None:
        self.config = load_config(env={}, flags={"port": 0, **(serve or {})})
        options = {**KUBE_FAST, **kube}
        extra: dict[str, Any] = {"rng": random.Random(seed)}
        if clock is not None:
            extra["clock"] = clock
        self.backend = KubeBackend.from_url(api_url, prefix=self.config.prefix, **extra, **options)
        self.extender = Extender(self.config, self.backend)
        self.extender.start()
        self.server = Server(self.extender, service_mounts(self.extender.config)).start_in_thread()
        self.url = self.server.url
        self.client = ExtenderClient(self.url, self.config.url_prefix, timeout=15.0)

    def stop(self) -> None:
        self.client.close()
        self.server.stop()
        self.extender.stop()


# ---------------------------------------------------------------- replicas as processes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_kubeconfig(path: Path, url: str) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": url}}],
                "users": [{"name": "gpuslice", "user": {"token": "test-token"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "gpuslice"}}],
                "current-context": "fake",
            }
        )
    )
    return path


class ServeProcess:
    """``gpuslice serve`` as a user starts it, against the (fake) API server at ``api_url``."""

    def __init__(self, workdir: Path, api_url: str, name: str = "gpuslice", **kube: Any) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / f"{name}.log"
        config = workdir / f"{name}.yaml"
        config.write_text(json.dumps({"host": "127.0.0.1", "port": self.port, "log_level": "info", "kube": kube}))
        kubeconfig = write_kubeconfig(workdir / f"{name}.kubeconfig", api_url)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSLICE_", "KUBERNETES_"))}
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [*SERVE, "--config", str(config), "--kubeconfig", str(kubeconfig)],
            cwd=REPO,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.client = ExtenderClient(self.url, timeout=15.0)

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_ready(self, timeout_s: float = 60.0) -> float:
        def ready() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"gpuslice serve exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                status, _ = self.client.request("GET", "/readyz")
            except ServiceError:
                return False
            return status == 200

        return wait_for(ready, f"gpuslice serve on port {self.port} to be ready", timeout_s, 0.1)

    def rss_kib(self) -> int:
        """The resident memory of the process, from /proc (0 where there is no /proc)."""
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def kill(self) -> None:
        """SIGKILL: no cleanup of any kind runs."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        self.client.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.client.close()
        self._log.close()

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""


# ---------------------------------------------------------------- kube-scheduler's part


@dataclass
class Attempt:
    pod: str
    node: str = ""  # where it was bound ("" if not)
    outcome: str = ""  # bound | unschedulable | bind-failed | filter-error | unreachable
    error: str = ""
    filter_s: float = 0.0
    prioritize_s: float = 0.0
    bind_s: float = 0.0


def schedule_once(client: ExtenderClient, pod: Mapping[str, Any], names: Sequence[str], rng: random.Random) -> Attempt:
    """One scheduling cycle as kube-scheduler runs it: filter, prioritize the survivors, pick the
    best score (ties at random), bind. A failed bind is reported; the caller decides on retries."""
    attempt = Attempt(pod_key(pod))
    try:
        started = time.perf_counter()
        result = client.filter(pod, names)
        attempt.filter_s = time.perf_counter() - started
        if result.get("Error"):
            attempt.outcome, attempt.error = "filter-error", str(result["Error"])
            return attempt
        passed = result.get("NodeNames") or []
        if not passed:
            attempt.outcome = "unschedulable"
            reasons = {**(result.get("FailedNodes") or {}), **(result.get("FailedAndUnresolvableNodes") or {})}
            attempt.error = next(iter(reasons.values()), "no node")
            return attempt
        started = time.perf_counter()
        scores = client.prioritize(pod, passed)
        attempt.prioritize_s = time.perf_counter() - started
        best = max(s["Score"] for s in scores) if scores else 0
        node = rng.choice([s["Host"] for s in scores if s["Score"] == best] or list(passed))
        started = time.perf_counter()
        error = client.bind(pod, node)
        attempt.bind_s = time.perf_counter() - started
    except ServiceError as exc:
        attempt.outcome, attempt.error = "unreachable", str(exc)
        return attempt
    if error:
        attempt.outcome, attempt.error = "bind-failed", error
    else:
        attempt.outcome, attempt.node = "bound", node
    return attempt


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextlib.contextmanager
def running(api: FakeApiServer) -> Iterator[FakeApiServer]:
    api.start()
    try:
        yield api
    finally:
        api.stop()
