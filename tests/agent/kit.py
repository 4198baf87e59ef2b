"""The agent's test bench: fake GPUs, a cluster in memory that the real extender schedules on, a
fake clock, a fake process runner and a fake ``/proc`` (whose cgroup files map PIDs to pods).

The cluster is a cluster file backend with the extender on top (its real filter and bind),
shared with the agent through an adapter that implements ``scheduler.agent.cluster.NodeCluster``:
what the agent publishes, the extender reads; what the extender binds, the agent sees.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from scheduler.agent.agent import Agent
from scheduler.agent.cluster import Json, ObjectRef, PodResources
from scheduler.agent.config import AgentConfig, load_config
from scheduler.agent.fake import FakeGpus
from scheduler.agent.mps import MpsDaemons
from scheduler.backend import Change, Kind
from scheduler.core.allocation import Allocation, decode_record
from scheduler.core.errors import GpusliceError
from scheduler.extender import wire
from scheduler.extender.config import load_config as serve_config
from scheduler.extender.service import Extender
from scheduler.filebackend import FileBackend

NODE = "gpu-1"
PREFIX = "gpuslice.io/"
SHARE = "gpuslice.io/share"
WALL = 1767225600.0  # 2026-01-01T00:00:00Z: the agent's wall clock in tests


def pod_uid(name: str) -> str:
    """The UID of the kit's pod ``name`` (a UUID, as the API server gives, so cgroup paths name it)."""
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, name))


def container_id(pod: str, container: str = "main0") -> str:
    """The runtime ID of a kit pod's container: 64 hex digits, as containerd's."""
    return hashlib.sha256(f"{pod}/{container}".encode()).hexdigest()


class FakeProc:
    """A ``/proc`` directory with a ``cgroup`` and ``comm`` file per PID (cgroup v2, systemd driver,
    containerd: the most common form; tests/agent/test_procs.py reads the others)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def _write(self, pid: int, cgroup: str, command: str) -> None:
        base = self.root / str(pid)
        base.mkdir(exist_ok=True)
        (base / "cgroup").write_text(cgroup + "\n")
        (base / "comm").write_text(command + "\n")

    def pod_process(self, pid: int, pod: str, container: str = "main0", command: str = "python3") -> None:
        """A process of the kit pod ``pod`` (by name), in its container."""
        slice_uid = pod_uid(pod).replace("-", "_")
        self._write(
            pid,
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{slice_uid}.slice/"
            f"cri-containerd-{container_id(pod, container)}.scope",
            command,
        )

    def host_process(self, pid: int, command: str = "python3") -> None:
        self._write(pid, "0::/user.slice/user-1000.slice/session-2.scope", command)

    def gone(self, pid: int) -> None:
        for name in ("cgroup", "comm"):
            (self.root / str(pid) / name).unlink(missing_ok=True)


class FakeClock:
    """Monotonic time that moves only when something sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.001)
        self.slept += seconds


@dataclass
class FakeProcess:
    argv: tuple[str, ...]
    env: dict[str, str]
    exit: int | None = None

    def poll(self) -> int | None:
        return self.exit

    def stop(self) -> None:
        self.exit = -15


@dataclass
class FakeRunner:
    """Records what would be started or run; nothing is."""

    started: list[FakeProcess] = field(default_factory=list)
    ran: list[tuple[tuple[str, ...], str]] = field(default_factory=list)

    def start(self, argv: Sequence[str], env: Mapping[str, str]) -> FakeProcess:
        process = FakeProcess(tuple(argv), dict(env))
        self.started.append(process)
        return process

    def run(self, argv: Sequence[str], env: Mapping[str, str], stdin: str) -> str:
        self.ran.append((tuple(argv), stdin))
        return ""


class _SharedBackend(FileBackend):
    """A cluster file backend whose changes reach the extender's cache and any other listener."""

    listeners: list[Callable[[Change], None]]

    def start(self, on_change: Callable[[Change], None]) -> None:
        self.listeners = []

        def fan_out(change: Change) -> None:
            on_change(change)
            for listener in list(self.listeners):
                listener(change)

        super().start(fan_out)


def k8s_node(name: str = NODE) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": {"kubernetes.io/hostname": name}},
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", SHARE: "128"}},
    }


class Cluster:
    """The API server and the extender, in memory; also the agent's ``NodeCluster``."""

    def __init__(self, tmp: Path, node: str = NODE, flags: Mapping[str, Any] | None = None) -> None:
        path = tmp / "cluster.json"
        path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [k8s_node(node)]}))
        self.node = node
        self.backend = _SharedBackend(path, PREFIX, clock=lambda: "2026-01-01T00:00:00Z")
        # the stories name the GPUs and MIG slots binpack picks (lowest free slot first)
        given = {"policy": "binpack", **dict(flags or {})}
        self.extender = Extender(serve_config(env={}, flags=given), self.backend)
        self.extender.start()
        self.events: list[tuple[ObjectRef, str, str, str]] = []
        self.patches: Counter[str] = Counter()  # Node annotation writes, by annotation (without the prefix)
        self.evictions: list[ObjectRef] = []  # every Eviction call
        self.refuse_evictions = ""  # a PodDisruptionBudget's refusal, while set
        self.slow_termination = False  # an evicted pod stays, terminating (a long grace period)
        self._follower: Callable[[Change], None] | None = None
        self.lagging = False  # the agent's watch does not see pod changes (a slow watch)
        self.ledger: dict[str, tuple[str, str]] = {}  # what gpuslice bound (pod -> uid, record), as its ledger
        self.ledger_error = ""  # the ledger cannot be read, while set

    # ------------------------------------------------------------ NodeCluster

    def get_node(self) -> Json:
        return self.backend.nodes()[self.node]

    def set_node_annotations(self, annotations: Mapping[str, str | None]) -> None:
        node = json.loads(json.dumps(self.get_node()))
        current = node["metadata"].setdefault("annotations", {})
        for key, value in annotations.items():
            if value is None:
                current.pop(key, None)
            else:
                current[key] = value
        self.patches.update(k.removeprefix(PREFIX) for k in annotations)
        self.backend.put_node(node)

    def list_pods(self) -> list[Json]:
        return [p for p in self.backend.pods().values() if (p.get("spec") or {}).get("nodeName") == self.node]

    def follow_pods(self, on_change: Callable[[str, Json | None], None]) -> None:
        if self._follower is not None:
            self.backend.listeners.remove(self._follower)

        def follow(change: Change) -> None:
            if change.kind is not Kind.POD or self.lagging:
                return
            if change.obj is None or (change.obj.get("spec") or {}).get("nodeName") == self.node:
                on_change(change.key, change.obj)

        self._follower = follow
        self.backend.listeners.append(follow)
        for pod in self.list_pods():
            meta = pod["metadata"]
            on_change(f"{meta['namespace']}/{meta['name']}", pod)

    def event(self, about: ObjectRef, kind: str, reason: str, message: str) -> None:
        self.events.append((about, kind, reason, message))

    def bound_records(self) -> Mapping[str, tuple[str, str]] | None:
        if self.ledger_error:
            raise GpusliceError(self.ledger_error)
        return dict(self.ledger)

    def evict(self, pod: ObjectRef) -> None:
        self.evictions.append(pod)
        if self.refuse_evictions:
            raise GpusliceError(f"create pods/eviction: HTTP 429 TooManyRequests: {self.refuse_evictions}")
        key = f"{pod.namespace}/{pod.name}"
        if not self.slow_termination:
            self.backend.delete_pod(key)
            return
        terminating = json.loads(json.dumps(self.backend.pods()[key]))
        terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:30Z"
        self.backend.put_pod(terminating)

    def stop(self) -> None:
        if self._follower is not None:
            self.backend.listeners.remove(self._follower)
            self._follower = None

    # ------------------------------------------------------------ what users and the scheduler do

    def inventory(self) -> dict[str, Any]:
        text = self.get_node()["metadata"].get("annotations", {}).get(PREFIX + "inventory")
        assert isinstance(text, str)
        loaded: dict[str, Any] = json.loads(text)
        return loaded

    def create_pod(
        self, name: str, containers: int = 1, init_containers: int = 0, namespace: str = "default", **request: str
    ) -> str:
        """A pod as the webhook leaves it: the request annotations, one share per GPU container."""

        def container(prefix: str, i: int) -> dict[str, Any]:
            return {"name": f"{prefix}{i}", "image": "app:1", "resources": {"limits": {SHARE: "1"}}}

        spec: dict[str, Any] = {
            "schedulerName": "gpuslice",
            "containers": [container("main", i) for i in range(containers)],
        }
        if init_containers:
            spec["initContainers"] = [container("init", i) for i in range(init_containers)]
        return self.backend.put_pod(
            {
                "apiVersion": "v1",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "uid": pod_uid(name),
                    "creationTimestamp": "2026-01-01T00:00:00Z",
                    "annotations": {PREFIX + k.replace("_", "-"): v for k, v in request.items()},
                },
                "spec": spec,
                "status": {"phase": "Pending"},
            }
        )

    def filter(self, key: str) -> dict[str, Any]:
        pod = self.backend.pods()[key]
        body = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": [self.node]}).encode()
        result: dict[str, Any] = json.loads(self.extender.filter(wire.parse_args(body)))
        return result

    def schedule(self, key: str) -> Allocation:
        """kube-scheduler's part: filter, then bind through the extender; the pod's record."""
        result = self.filter(key)
        assert result["NodeNames"] == [self.node], result
        pod = self.backend.pods()[key]
        meta = pod["metadata"]
        body = {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": self.node}
        error = self.extender.bind(wire.parse_binding(json.dumps(body).encode()))
        assert not error, error
        # what gpuslice's ledger holds after a bind: the pod's UID and the record it wrote
        self.ledger[key] = (meta["uid"], self.backend.pods()[key]["metadata"]["annotations"][PREFIX + "allocation"])
        return self.record(key)

    def record(self, key: str) -> Allocation:
        return decode_record(self.backend.pods()[key]["metadata"]["annotations"][PREFIX + "allocation"], key)

    def delete(self, key: str) -> None:
        self.backend.delete_pod(key)

    def fail_pod(self, key: str, reason: str, message: str) -> None:
        """What the kubelet does to a pod it cannot admit."""
        pod = json.loads(json.dumps(self.backend.pods()[key]))
        pod["status"] = {"phase": "Failed", "reason": reason, "message": message}
        self.backend.put_pod(pod)

    def start_containers(self, key: str) -> None:
        pod = json.loads(json.dumps(self.backend.pods()[key]))
        names = [c["name"] for c in pod["spec"]["containers"]]
        pod["status"] = {
            "phase": "Running",
            "containerStatuses": [
                {"name": n, "state": {"running": {}}, "containerID": f"containerd://{container_id(pod_name(key), n)}"}
                for n in names
            ],
        }
        self.backend.put_pod(pod)

    def run_foreign_pod(self, name: str, namespace: str = "default", scheduler: str = "default-scheduler") -> str:
        """A pod another scheduler placed on the node: running, no gpuslice record."""
        return self.backend.put_pod(
            {
                "apiVersion": "v1",
                "metadata": {"name": name, "namespace": namespace, "uid": pod_uid(name)},
                "spec": {"schedulerName": scheduler, "nodeName": self.node, "containers": [{"name": "main0"}]},
                "status": {"phase": "Running"},
            }
        )

    def usage(self) -> dict[str, Any]:
        """The Node's usage annotation, as the agent last wrote it."""
        text = self.get_node()["metadata"].get("annotations", {}).get(PREFIX + "usage")
        assert isinstance(text, str), "no usage annotation"
        loaded: dict[str, Any] = json.loads(text)
        return loaded

    def counted(self) -> dict[str, Allocation]:
        """The records the extender counts on the node."""
        with self.extender.cache.lock:
            state = self.extender.cache.state(self.node)
        assert state is not None
        return dict(state.pods)


def pod_name(key: str) -> str:
    return key.split("/", 1)[-1]


def write(tmp: Path, name: str, body: Any) -> str:
    path = tmp / name
    path.write_text(json.dumps(body) if not isinstance(body, str) else body)
    return str(path)


def agent_config(tmp: Path, **body: Any) -> AgentConfig:
    base: dict[str, Any] = {
        "node": NODE,
        "devicePluginDir": str(tmp / "dp"),
        "podResourcesSocket": "",
        "mps": {"root": str(tmp / "mps"), "daemon": "agent", "externalPipeDirectory": str(tmp / "nvidia-mps")},
        "admitWaitSeconds": 2,
        "measure": {"procRoot": str(tmp / "proc")},
    }
    for key, value in body.items():
        base[key] = {**base[key], **value} if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return load_config(write(tmp, "agent.yaml", base), "", {})


def make_agent(
    tmp: Path,
    hardware: FakeGpus,
    cluster: Cluster,
    pod_resources: PodResources | None = None,
    runner: FakeRunner | None = None,
    clock: FakeClock | None = None,
    **config: Any,
) -> Agent:
    settings = agent_config(tmp, **config)
    runner = runner or FakeRunner()
    agent = Agent(
        settings,
        hardware,
        cluster,
        MpsDaemons(settings.mps, runner),
        runner,
        pod_resources,
        clock or FakeClock(),
        wall=lambda: WALL,
    )
    agent.start()
    cluster.follow_pods(agent.on_pod)
    return agent


def fake_gpus(*gpus: dict[str, Any]) -> FakeGpus:
    return FakeGpus.from_mapping({"gpus": list(gpus)})


def no_nvml_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML's initialisation fails as it does on a machine without the NVIDIA driver, whatever
    this machine has."""
    import pynvml

    def missing() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", missing)
