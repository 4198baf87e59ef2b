"""Two replicas binding at once against one API server never over-allocate; a restart rebuilds the same state."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from scheduler.backend import BindResult, Kind, PodRef
from scheduler.core.allocation import Allocation, decode_record
from scheduler.core.k8s import parse_node
from scheduler.core.state import NodeState, rebuild
from scheduler.kube import KubeBackend
from tests.fakes import FakeApiServer
from tests.kube.conftest import Recorder, decide_for, gpu_node, gpu_pod, wait_until

Make = Callable[..., KubeBackend]
PREFIX = "gpuslice.io/"


def bound_records(apiserver: FakeApiServer, node: str) -> list[tuple[str, str]]:
    return sorted(
        (f"{p['metadata']['namespace']}/{p['metadata']['name']}", p["metadata"]["annotations"][PREFIX + "allocation"])
        for p in apiserver.pods()
        if p["spec"].get("nodeName") == node
    )


def test_two_replicas_binding_concurrently_never_exceed_capacity(apiserver: FakeApiServer, make_backend: Make) -> None:
    # 2 GPUs x 80 GiB, MPS; every pod wants 20 GiB (a quarter): exactly 8 fit. 20 pods race for them
    # through two backends, 4 threads each; the first decision of each backend waits for the other's,
    # so both decide against the same ledger and one compare-and-set must lose.
    node = apiserver.put_node(gpu_node("n1", gpus=2, cpu="64"))
    names = [f"p{i:02d}" for i in range(20)]
    pods = {name: apiserver.put_pod(gpu_pod(name)) for name in names}
    backends = [make_backend(conflict_retries=60), make_backend(conflict_retries=60)]
    meet = threading.Barrier(2, timeout=5)
    decisions: list[int] = [0, 0]
    lock = threading.Lock()

    def bind(i: int) -> tuple[str, BindResult]:
        name, which = names[i], i % 2
        decide = decide_for(node, pods[name])

        def racing(records: Sequence[tuple[str, str]]) -> Allocation | str:
            with lock:
                decisions[which] += 1
                first = decisions[which] == 1
            if first:
                meet.wait()
            return decide(records)

        return name, backends[which].bind(PodRef("default", name, f"uid-{name}"), "n1", racing)

    with ThreadPoolExecutor(8) as pool:
        results = dict(pool.map(bind, range(20)))

    won = {name for name, r in results.items() if r.allocation is not None}
    assert len(won) == 8
    assert all(r.error.startswith(f"no share for default/{n} on n1: ") for n, r in results.items() if n not in won)
    assert sum(decisions) > 20  # some decisions were redone after a lost compare-and-set
    # the API server's truth: 8 bound pods, each with exactly the record its bind returned, no conflict
    records = bound_records(apiserver, "n1")
    assert [k for k, _ in records] == sorted(f"default/{n}" for n in won)
    for key, text in records:
        assert decode_record(text, key) == results[key.removeprefix("default/")].allocation
    state, problems = rebuild(parse_node(node), records)
    assert problems == []
    assert [u.memory_mib for u in state.usage] == [81920, 81920]  # both GPUs exactly full, never over
    for name in set(names) - won:  # the losers carry nothing
        live = apiserver.pod("default", name)
        assert live is not None and PREFIX + "allocation" not in live["metadata"]["annotations"]
        assert "nodeName" not in live["spec"]


def test_a_new_replica_rebuilds_the_state_the_old_one_left(apiserver: FakeApiServer, make_backend: Make) -> None:
    nodes = {
        name: apiserver.put_node(gpu_node(name, gpus=1, sharing=sharing))
        for name, sharing in (("mps", "mps"), ("whole", "none"))
    }
    pods: dict[str, Any] = {}
    for i in range(3):
        pods[f"s{i}"] = apiserver.put_pod(gpu_pod(f"s{i}", gpu_memory="30Gi"))
    whole = gpu_pod("w")
    whole["metadata"]["annotations"] = {}
    whole["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 1
    pods["w"] = apiserver.put_pod(whole)

    first = make_backend()
    first.start(Recorder())
    before = {name: NodeState.empty(parse_node(n)) for name, n in nodes.items()}
    plan = [("s0", "mps"), ("s1", "mps"), ("s2", "mps"), ("w", "whole")]  # s2 does not fit: 90 > 80 GiB
    for name, node in plan:
        result = first.bind(PodRef("default", name, f"uid-{name}"), node, decide_for(nodes[node], pods[name]))
        if result.allocation is not None:
            before[node] = before[node].apply(f"default/{name}", result.allocation)
    first.stop()
    assert [k for k, _ in before["mps"].pods] == ["default/s0", "default/s1"]
    assert [k for k, _ in before["whole"].pods] == ["default/w"]

    second, view = make_backend(), Recorder()
    second.start(view)
    for name in nodes:
        after, problems = rebuild(parse_node(view.objects[(Kind.NODE, name)]), view.records(name))
        assert problems == []
        assert after == before[name]
    # and the new replica carries on from there: s2 still does not fit, a small one does
    apiserver.put_pod(gpu_pod("small", gpu_memory="10Gi"))
    wait_until(lambda: view.has(Kind.POD, "default/small"), "the new pod")
    assert "needs" in second.bind(PodRef("default", "s2", "uid-s2"), "mps", decide_for(nodes["mps"], pods["s2"])).error
    small = apiserver.pod("default", "small")
    assert small is not None
    assert second.bind(PodRef("default", "small", "uid-small"), "mps", decide_for(nodes["mps"], small)).error == ""
