"""Fixtures for the Kubernetes side: a fake API server on 127.0.0.1, a fake clock, fast backends."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pytest

from scheduler.backend import Change, Decide, Kind
from scheduler.core.allocation import Allocation
from scheduler.core.fit import fit
from scheduler.core.k8s import parse_node
from scheduler.core.request import parse_pod
from scheduler.core.state import rebuild
from scheduler.kube import API_CALLS, KubeBackend
from tests.builders import pod
from tests.fakes import FakeApiServer, FakeClock, audited

# Short timeouts so that faults show within a second; the production defaults are in KubeOptions.
FAST: dict[str, Any] = {
    "request_timeout_s": 1.0,
    "watch_timeout_s": 2,
    "watch_read_slack_s": 0.5,
    "watch_grace_s": 5.0,
    "backoff_initial_s": 0.02,
    "backoff_max_s": 0.2,
    "start_timeout_s": 1.0,
    "conflict_backoff_s": 0.005,
    "stale_allocation_s": 60.0,
}


def gpu_node(
    name: str = "n1",
    gpus: int = 1,
    sharing: str = "mps",
    product: str = "H100-80GB",
    cpu: str = "8",
    memory: str = "64Gi",
) -> dict[str, Any]:
    """A node as GPU feature discovery labels it: ``gpus`` GPUs of 80 GiB, shared by MPS by default."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.count": str(gpus),
                "nvidia.com/gpu.sharing-strategy": sharing,
            },
        },
        "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": "110"}},
    }


def gpu_pod(name: str, gpu_memory: str = "20Gi", namespace: str = "default", uid: str | None = None) -> dict[str, Any]:
    """A pending pod asking for ``gpu_memory`` of one GPU (20 GiB: a quarter of an H100-80GB) and 1 CPU."""
    body = pod(name, namespace, annotations={"gpu-memory": gpu_memory}, cpu="1")
    body["metadata"]["uid"] = uid or f"uid-{name}"
    body["spec"]["schedulerName"] = "gpuslice"
    body["status"] = {"phase": "Pending"}
    return body


def gpu_quota(namespace: str, name: str = "q", **limits: Any) -> dict[str, Any]:
    """A GPUQuota (gpuslice.io/v1alpha1); no limits given: one whole GPU."""
    return {
        "apiVersion": "gpuslice.io/v1alpha1",
        "kind": "GPUQuota",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"limits": limits or {"gpus": 1}},
    }


def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.01)


class Recorder:
    """Collects the Changes a backend reports, and keeps the latest object per key."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.changes: list[Change] = []
        self.objects: dict[tuple[Kind, str], Mapping[str, Any]] = {}

    def __call__(self, change: Change) -> None:
        with self._lock:
            self.changes.append(change)
            if change.obj is None:
                self.objects.pop((change.kind, change.key), None)
            else:
                self.objects[(change.kind, change.key)] = change.obj

    def has(self, kind: Kind, key: str, obj_is_none: bool = False) -> bool:
        with self._lock:
            return any(c.kind is kind and c.key == key and (c.obj is None) == obj_is_none for c in self.changes)

    def keys(self, kind: Kind) -> set[str]:
        with self._lock:
            return {k for (kd, k) in self.objects if kd is kind}

    def records(self, node: str, prefix: str = "gpuslice.io/") -> list[tuple[str, str]]:
        """(pod key, allocation record) of the pods this view shows bound to ``node``."""
        with self._lock:
            out = []
            for (kind, key), obj in self.objects.items():
                record = (obj.get("metadata", {}).get("annotations") or {}).get(prefix + "allocation")
                if kind is Kind.POD and obj.get("spec", {}).get("nodeName") == node and record:
                    out.append((key, record))
            return sorted(out)


def decide_for(
    node: Mapping[str, Any], pod_json: Mapping[str, Any], seen: list[Sequence[tuple[str, str]]] | None = None
) -> Decide:
    """What the extender's bind does: rebuild the node's state from the records, fit, apply."""
    inventory = parse_node(node)
    request = parse_pod(pod_json)

    def decide(records: Sequence[tuple[str, str]]) -> Allocation | str:
        if seen is not None:
            seen.append(list(records))
        state, problems = rebuild(inventory, records)
        if problems:
            return f"records conflict: {problems[0]}"
        result = fit(request.demand, state)
        if not result:
            return result.reason
        state.apply(request.key, result.allocations[0])  # raises if the core's fit and apply disagree
        return result.allocations[0]

    return decide


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    with audited(API_CALLS, "API_CALLS") as server:
        yield server


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_backend(apiserver: FakeApiServer, clock: FakeClock) -> Iterator[Callable[..., KubeBackend]]:
    made: list[KubeBackend] = []

    def make(**options: Any) -> KubeBackend:
        backend = KubeBackend.from_url(apiserver.url, clock=clock, rng=random.Random(len(made)), **{**FAST, **options})
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.stop()
