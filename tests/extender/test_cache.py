"""The cluster cache: which records count, binds in flight counted once, unusable nodes."""

from __future__ import annotations

import json

from scheduler.backend import Change, Kind
from scheduler.core.allocation import Allocation, DeviceShare, encode_record
from scheduler.core.inventory import SharingMode
from scheduler.extender.cache import ClusterCache

from .kit import PREFIX, k8s_node, k8s_pod


def share(node: str, index: int = 0, memory: int = 8192, compute: int = 100) -> Allocation:
    return Allocation(node, (DeviceShare(f"{node}-gpu{index}", index, SharingMode.MPS, memory, compute),), 0, 0)


def with_record(pod: dict, alloc: Allocation, node: str | None = None) -> dict:
    """The pod as a gpuslice bind leaves it: record, and when bound, the phase its Binding wrote."""
    pod["metadata"]["annotations"][PREFIX + "allocation"] = encode_record(alloc, "2025-01-01T00:00:00Z")
    if node:
        pod["spec"]["nodeName"] = node
        pod["metadata"]["annotations"][PREFIX + "bind-phase"] = "bound"
    return pod


def cache_with(*nodes: str) -> ClusterCache:
    cache = ClusterCache(PREFIX)
    for name in nodes:
        cache.on_change(Change(Kind.NODE, name, k8s_node(name, gpus=2)))
    return cache


def used(cache: ClusterCache, node: str) -> list[int]:
    state = cache.state(node)
    assert state is not None
    return [u.memory_mib for u in state.usage]


def pod_change(pod: dict | None, key: str = "default/p") -> Change:
    return Change(Kind.POD, key, pod)


def test_only_records_on_the_pods_node_count() -> None:
    cache = cache_with("a", "b")
    cache.on_change(pod_change(with_record(k8s_pod("p"), share("a"))))  # record, not bound: not counted
    assert used(cache, "a") == [0, 0]
    cache.on_change(pod_change(with_record(k8s_pod("p"), share("a"), node="b")))  # record for a, bound to b
    assert used(cache, "a") == [0, 0] and used(cache, "b") == [0, 0]
    cache.on_change(pod_change(with_record(k8s_pod("p"), share("a"), node="a")))
    assert used(cache, "a") == [8192, 0]


def test_ending_or_deleting_a_pod_frees_its_share() -> None:
    cache = cache_with("a")
    bound = with_record(k8s_pod("p"), share("a"), node="a")
    cache.on_change(pod_change(bound))
    assert used(cache, "a") == [8192, 0]
    cache.on_change(pod_change(with_record(k8s_pod("p", phase="Succeeded"), share("a"), node="a")))
    assert used(cache, "a") == [0, 0]
    cache.on_change(pod_change(bound))
    cache.on_change(pod_change(None))
    assert used(cache, "a") == [0, 0] and "default/p" not in cache.pods


def test_a_bind_in_flight_counts_once_through_the_watch() -> None:
    cache = cache_with("a")
    cache.on_change(pod_change(k8s_pod("p")))
    cache.reserve("default/p", "uid-default-p", share("a"))
    assert used(cache, "a") == [8192, 0]
    # the backend's patch arrives (record, not yet bound), then the binding: still one share
    cache.on_change(pod_change(with_record(k8s_pod("p", version="2"), share("a"))))
    assert used(cache, "a") == [8192, 0]
    cache.on_change(pod_change(with_record(k8s_pod("p", version="3"), share("a"), node="a")))
    assert used(cache, "a") == [8192, 0] and cache.inflight() == {}
    cache.reserve("default/p", "uid-default-p", share("a"))  # a late duplicate changes nothing
    assert used(cache, "a") == [8192, 0] and cache.inflight() == {}


def test_a_failed_bind_is_forgotten() -> None:
    cache = cache_with("a")
    cache.on_change(pod_change(k8s_pod("p")))
    cache.reserve("default/p", "uid-default-p", share("a", index=1))
    assert used(cache, "a") == [0, 8192]
    cache.unreserve("default/p")
    assert used(cache, "a") == [0, 0]


def test_records_before_their_node_and_node_changes() -> None:
    cache = ClusterCache(PREFIX)
    cache.on_change(pod_change(with_record(k8s_pod("p"), share("a"), node="a")))
    assert cache.state("a") is None
    cache.on_change(Change(Kind.NODE, "a", k8s_node("a", gpus=2)))
    assert used(cache, "a") == [8192, 0]
    cache.on_change(Change(Kind.NODE, "a", k8s_node("a", gpus=3)))  # a GPU more: rebuilt with the record
    assert used(cache, "a") == [8192, 0, 0]
    broken = k8s_node("a")
    broken["metadata"]["annotations"][PREFIX + "inventory"] = "[{"
    cache.on_change(Change(Kind.NODE, "a", broken))
    assert cache.state("a") is None and "inventory annotation is not JSON" in cache.unusable()["a"]
    cache.on_change(Change(Kind.NODE, "a", k8s_node("a", gpus=2)))
    assert used(cache, "a") == [8192, 0] and cache.unusable() == {}
    cache.on_change(Change(Kind.NODE, "a", None))
    assert cache.state("a") is None and "a" not in cache.board


def test_conflicting_records_are_reported_with_the_pod() -> None:
    cache = cache_with("a")
    # two pods each claiming 60000 MiB of GPU 0 (81920 MiB): the second in name order is rejected
    cache.on_change(pod_change(with_record(k8s_pod("p1"), share("a", memory=60000), node="a"), "default/p1"))
    cache.on_change(pod_change(with_record(k8s_pod("p2"), share("a", memory=60000), node="a"), "default/p2"))
    assert used(cache, "a") == [60000, 0]
    errors = cache.record_errors()["a"]
    assert list(errors) == ["default/p2"] and "conflicts on node a" in errors["default/p2"]
    cache.on_change(pod_change(None, "default/p1"))  # p1 gone: p2's record now fits
    assert used(cache, "a") == [60000, 0] and cache.record_errors() == {}
    garbage = k8s_pod("p3", node="a")
    garbage["metadata"]["annotations"][PREFIX + "allocation"] = "{oops"
    garbage["metadata"]["annotations"][PREFIX + "bind-phase"] = "bound"
    cache.on_change(pod_change(garbage, "default/p3"))
    assert "not JSON" in cache.record_errors()["a"]["default/p3"]


def test_incremental_states_equal_a_rebuild() -> None:
    cache = cache_with("a")
    for i in range(6):
        pod = with_record(k8s_pod(f"p{i}"), share("a", index=i % 2, memory=1000 + i), node="a")
        cache.on_change(pod_change(pod, f"default/p{i}"))
    cache.on_change(pod_change(None, "default/p3"))
    fresh = cache_with("a")
    for key, pod in cache.pods.items():
        fresh.on_change(pod_change(json.loads(json.dumps(pod.obj)), key))
    assert fresh.state("a") == cache.state("a")


def test_nodes_join_and_leave_the_board_in_place() -> None:
    cache = cache_with("a", "b", "c")
    assert [s.node.name for s in cache.board.states] == ["a", "b", "c"]
    layout = cache.board.layout
    cache.on_change(Change(Kind.NODE, "d", k8s_node("d", gpus=2)))
    cache.on_change(Change(Kind.NODE, "e", k8s_node("e", gpus=1)))
    cache.on_change(Change(Kind.NODE, "e", k8s_node("e", gpus=3)))
    cache.on_change(Change(Kind.NODE, "b", None))
    cache.on_change(Change(Kind.NODE, "d", None))
    assert cache.board.layout > layout
    assert [s.node.name for s in cache.board.states] == ["a", "c", "e"]
    state = cache.state("e")
    assert state is not None and len(state.node.devices) == 3
    # positions stay where they were: a node that leaves frees its own, the next to join takes it
    assert cache.board.positions(["e", "d", "a", "c"]).tolist() == [4, -1, 0, 2]
    cache.on_change(Change(Kind.NODE, "f", k8s_node("f", gpus=1)))
    assert cache.board.positions(["f"]).tolist()[0] in (1, 3)


def test_the_cache_keeps_what_it_reads_of_a_pod_and_parses_it_alike() -> None:
    from scheduler.core.request import parse_pod

    pod = k8s_pod("p", gpu_fraction="0.5", node="a")
    pod["spec"]["containers"][0] |= {"env": [{"name": "X", "value": "y" * 1000}], "image": "big:1"}
    pod["spec"]["initContainers"] = [{"name": "init", "image": "i", "resources": {"requests": {"cpu": "3"}}}]
    pod["spec"]["volumes"] = [{"name": "v", "emptyDir": {}}]
    pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}] * 20}
    pod["metadata"]["managedFields"] = [{"manager": "kubelet"}] * 50
    cache = cache_with("a")
    cache.on_change(pod_change(pod, "default/p"))
    kept = cache.pods["default/p"].obj
    assert len(json.dumps(kept)) < len(json.dumps(pod)) / 4
    assert parse_pod(kept) == parse_pod(pod)
    assert "managedFields" not in kept["metadata"] and "env" not in kept["spec"]["containers"][0]


def test_a_forged_record_never_displaces_the_record_of_a_bind_gpuslice_made() -> None:
    # gpuslice binds z-real to GPU 0 of node a, whole; then a-forged, which another scheduler
    # placed there, is given a hand-written record of the same GPU with bind-phase "bound" forged
    # too. It sorts first by name; the real record must still be the one counted.
    cache = ClusterCache(PREFIX)
    cache.on_change(Change(Kind.NODE, "a", k8s_node("a", gpus=2, mode="exclusive")))
    whole = Allocation("a", (DeviceShare("a-gpu0", 0, SharingMode.EXCLUSIVE, 81920, 1000),), 0, 0)
    cache.on_change(pod_change(k8s_pod("z-real"), "default/z-real"))
    cache.reserve("default/z-real", "uid-default-z-real", whole)
    cache.on_change(pod_change(with_record(k8s_pod("z-real", version="2"), whole, node="a"), "default/z-real"))
    cache.on_change(pod_change(with_record(k8s_pod("a-forged"), whole, node="a"), "default/a-forged"))
    errors = cache.record_errors()["a"]
    assert list(errors) == ["default/a-forged"], errors
    assert cache.placement("default/z-real").counted
    assert not cache.placement("default/a-forged").counted
    # a node read anew (a rebuild from every record) keeps the same order of trust
    cache.on_change(Change(Kind.NODE, "a", k8s_node("a", gpus=3, mode="exclusive")))
    assert list(cache.record_errors()["a"]) == ["default/a-forged"]
    assert cache.state("a").allocation_of("default/z-real") == whole  # type: ignore[union-attr]


def test_only_a_bind_that_went_through_or_the_same_pod_is_vouched_for() -> None:
    # z-failed's bind failed (its claim dropped), z-new replaced the pod gpuslice bound under its
    # name (another UID): each then carries the record by hand, and name order decides again.
    cache = ClusterCache(PREFIX)
    cache.on_change(Change(Kind.NODE, "a", k8s_node("a", gpus=2, mode="exclusive")))
    gpu = [Allocation("a", (DeviceShare(f"a-gpu{i}", i, SharingMode.EXCLUSIVE, 81920, 1000),), 0, 0) for i in (0, 1)]
    cache.on_change(pod_change(k8s_pod("z-failed"), "default/z-failed"))
    cache.reserve("default/z-failed", "uid-default-z-failed", gpu[0])
    cache.unreserve("default/z-failed")
    cache.on_change(pod_change(k8s_pod("z-new"), "default/z-new"))
    cache.reserve("default/z-new", "uid-default-z-new", gpu[1])
    cache.on_change(pod_change(with_record(k8s_pod("z-new", version="2"), gpu[1], node="a"), "default/z-new"))
    replaced = with_record(k8s_pod("z-new", version="3"), gpu[1], node="a")
    replaced["metadata"]["uid"] = "uid-another"
    cache.on_change(pod_change(replaced, "default/z-new"))
    for name, alloc in (("a-0", gpu[0]), ("a-1", gpu[1])):
        cache.on_change(pod_change(with_record(k8s_pod(name), alloc, node="a"), f"default/{name}"))
    cache.on_change(pod_change(with_record(k8s_pod("z-failed", version="2"), gpu[0], node="a"), "default/z-failed"))
    cache.on_change(Change(Kind.NODE, "a", k8s_node("a", gpus=3, mode="exclusive")))
    assert sorted(cache.record_errors()["a"]) == ["default/z-failed", "default/z-new"]
