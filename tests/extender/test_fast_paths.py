"""The answers of the fast paths (remembered NodeNames lists, pre-encoded HostPriorityList,
remembered unresolvable nodes) equal the answers worked out node by node from the core."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.backend import Change, Kind
from scheduler.core.fit import fit
from scheduler.core.request import GpuKind
from scheduler.core.select import evaluate, rank
from scheduler.core.state import NodeState
from scheduler.extender import wire

from .kit import PREFIX, binding, filter_args, k8s_node, k8s_pod

BROKEN = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {"name": "broken", "annotations": {PREFIX + "inventory": "{not json"}},
    "status": {"allocatable": {"cpu": "8", "memory": "16Gi"}},
}


@given(st.lists(st.tuples(st.text(min_size=1), st.integers(0, wire.MAX_PRIORITY)), max_size=40))
def test_host_priorities_encode_like_the_plain_encoder(pairs: list[tuple[str, int]]) -> None:
    import numpy as np

    names = [n for n, _ in pairs]
    scores = np.array([s for _, s in pairs], dtype=np.int64)
    encoded = wire.HostPriorities([wire.host_entry(n) for n in names]).encode(scores)
    assert orjson.loads(encoded) == orjson.loads(wire.host_priorities(names, scores.tolist()))


def test_host_priorities_refuse_scores_out_of_range_or_count() -> None:
    import numpy as np

    template = wire.HostPriorities([wire.host_entry("a"), wire.host_entry("b")])
    assert orjson.loads(template.encode(np.array([10, 0]))) == [{"Host": "a", "Score": 10}, {"Host": "b", "Score": 0}]
    with pytest.raises(ValueError, match=r"0\.\.10"):
        template.encode(np.array([11, 0]))
    with pytest.raises(ValueError, match=r"0\.\.10"):
        template.encode(np.array([-1, 0]))
    with pytest.raises(ValueError, match="1 scores for 2 hosts"):
        template.encode(np.array([1]))


@pytest.mark.parametrize("names", [["a", 1], ["a", None], [["a"]], "a"])
def test_node_names_must_be_strings(names: Any) -> None:
    body = orjson.dumps({"Pod": {}, "NodeNames": names})
    with pytest.raises(wire.WireError, match="NodeNames must be an array of strings"):
        wire.parse_args(body)


def cluster() -> list[dict[str, Any]]:
    return [
        k8s_node("mps-a", gpus=4),
        k8s_node("mps-b", gpus=2, cpu="8"),
        k8s_node("t4", gpus=2, model="T4", mode="time-slicing", replicas=2),
        k8s_node("mig-a", gpus=2, model="A100-80GB", mode="mig"),
        k8s_node("mig-b", gpus=1, model="H100-80GB", mode="mig"),
        k8s_node("whole", gpus=4, mode="exclusive"),
        k8s_node("small", gpus=1),
        k8s_node("cpu", gpus=0),
        BROKEN,
    ]


NAMES = ["mps-a", "mps-b", "t4", "mig-a", "mig-b", "whole", "small", "cpu", "broken", "ghost"]
KINDS: list[dict[str, str]] = [
    {"gpu_fraction": "0.25"},
    {"gpu_fraction": "0.5"},
    {"gpu_memory": "20Gi"},
    {"gpu_memory": "30Gi", "gpu_compute": "40"},
    {"gpu_count": "1"},
    {"gpu_count": "2"},
    {"mig_profile": "1g.10gb"},
    {"mig_profile": "3g.40gb"},
    {},
]


def reference_filter(extender: Any, pod: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """Filter worked out node by node, as the service did before it remembered anything."""
    request = extender.parse(pod)
    policy = extender.policy_for(request)
    cache = extender.cache
    passed: list[str] = []
    failed: dict[str, str] = {}
    never: dict[str, str] = {}
    for name in names:
        state = cache.state(name)
        if state is None:
            problem = cache.problem(name)
            if problem:
                never[name] = problem
            else:
                failed[name] = "node unknown to gpuslice"
            continue
        placed = evaluate(policy, request.demand, state)
        if not isinstance(placed, str):
            passed.append(name)
            continue
        empty = fit(request.demand, NodeState.empty(state.node))
        if empty:
            failed[name] = placed
        else:
            never[name] = empty.reason
    if request.demand.gpu.kind is GpuKind.NONE:  # passes everywhere
        passed, failed, never = list(names), {}, {}
    return {
        "Nodes": None,
        "NodeNames": passed,
        "FailedNodes": failed or None,
        "FailedAndUnresolvableNodes": never or None,
        "Error": "",
    }


def reference_priorities(extender: Any, pod: dict[str, Any], names: list[str]) -> list[dict[str, Any]]:
    """Prioritize worked out node by node: the core's plain ranking of the listed nodes (equal
    scores to the lowest board position), rescaled to 0..9, and 10 for the node ranked first."""
    request = extender.parse(pod)
    policy = extender.policy_for(request)
    board = extender.cache.board
    states = [s for n in names if (s := extender.cache.state(n)) is not None]
    order = {s.node.name: int(board.positions([s.node.name])[0]) for s in states}
    ranking = rank(policy, request.demand, states, order, gaps=board.gaps)
    scaled = {p.node: min(9, max(0, int(p.score * 10 / 100 + 0.5))) for p in ranking.placements}
    if ranking.placements:
        scaled[ranking.placements[0].node] = 10
    return [{"Host": n, "Score": scaled.get(n, 0)} for n in names]


@pytest.mark.parametrize(("policy", "seed"), [("binpack", 1), ("fgd", 2), ("spread", 3)])
def test_filter_and_prioritize_equal_the_node_by_node_answers(serve: Any, policy: str, seed: int) -> None:
    rng = random.Random(seed)
    pods = [k8s_pod(f"p{i}", cpu=rng.choice(["1", "2", "4"]), **rng.choice(KINDS)) for i in range(60)]
    served = serve(*cluster(), *pods, policy=policy)
    extender = served.extender
    for i, pod in enumerate(pods):
        if i == 20:  # t4 becomes an MPS H100 node: what could never fit there now may
            extender.cache.on_change(Change(Kind.NODE, "t4", k8s_node("t4", gpus=2)))
        if i == 30:  # a node goes (positions move), another breaks
            extender.cache.on_change(Change(Kind.NODE, "mps-b", None))
            extender.cache.on_change(
                Change(Kind.NODE, "small", BROKEN | {"metadata": BROKEN["metadata"] | {"name": "small"}})
            )
        if i == 45:  # and they come back
            extender.cache.on_change(Change(Kind.NODE, "mps-b", k8s_node("mps-b", gpus=2, cpu="8")))
            extender.cache.on_change(Change(Kind.NODE, "small", k8s_node("small", gpus=1)))
        got = served.post("filter", filter_args(pod, NAMES))
        assert got == reference_filter(extender, pod, NAMES), i
        survivors = got["NodeNames"]
        if not survivors:
            continue
        # (the references first: prioritize holds the node it ranks first for the pod)
        expected = reference_priorities(extender, pod, survivors)
        scores = served.post("prioritize", filter_args(pod, survivors))
        assert scores == expected, i
        extender.cache.unreserve(f"default/{pod['metadata']['name']}")  # its own hold does not count against it
        expected = reference_priorities(extender, pod, NAMES)
        assert served.post("prioritize", filter_args(pod, NAMES)) == expected, i
        top = max(scores, key=lambda hp: hp["Score"])["Host"]
        assert served.post("bind", binding(pod, top)) == {"Error": ""}, i


@pytest.mark.parametrize(("policy", "seed"), [("binpack", 4), ("fgd", 5)])
def test_failed_nodes_follow_binds_and_deletions(serve: Any, policy: str, seed: int) -> None:
    # FailedNodes is kept per demand and only the nodes changed since are asked again: pods of
    # a few kinds come back and forth, nodes fill up (join the map), change while full (their
    # reason may change) and empty again when pods go (leave the map).
    rng = random.Random(seed)
    kinds = [{"cpu": "2", **KINDS[2]}, {"cpu": "4", **KINDS[5]}, {"cpu": "1", **KINDS[6]}]
    pods = [k8s_pod(f"p{i}", **rng.choice(kinds)) for i in range(80)]
    probes = [k8s_pod(f"probe{k}", **kind) for k, kind in enumerate(kinds)]
    served = serve(*cluster(), *pods, *probes, policy=policy)
    extender = served.extender
    bound: list[str] = []
    for i, pod in enumerate(pods):
        if bound and rng.random() < 0.3:  # a pod ends: its node may fit again
            gone = bound.pop(rng.randrange(len(bound)))
            served.backend.delete_pod(f"default/{gone}")
        got = served.post("filter", filter_args(pod, NAMES))
        if got["NodeNames"]:
            top = max(served.post("prioritize", filter_args(pod, got["NodeNames"])), key=lambda hp: hp["Score"])
            assert served.post("bind", binding(pod, top["Host"])) == {"Error": ""}, i
            bound.append(pod["metadata"]["name"])
        for probe in probes:
            assert served.post("filter", filter_args(probe, NAMES)) == reference_filter(extender, probe, NAMES), i


def test_a_node_that_changes_model_is_judged_again(serve: Any) -> None:
    big, pod = k8s_pod("big", gpu_memory="70000"), k8s_pod("p", gpu_memory="20Gi")
    served = serve(k8s_node("a", gpus=1), k8s_node("t4", gpus=1, model="T4", mode="time-slicing"), big, pod)
    assert served.post("bind", binding(big, "a")) == {"Error": ""}
    got = served.post("filter", filter_args(pod, ["a", "t4"]))
    assert list(got["FailedNodes"]) == ["a"] and list(got["FailedAndUnresolvableNodes"]) == ["t4"]
    # a becomes a T4 node (same place on the board): 20 GiB can never fit there now
    served.extender.cache.on_change(Change(Kind.NODE, "a", k8s_node("a", gpus=1, model="T4", mode="time-slicing")))
    got = served.post("filter", filter_args(pod, ["a", "t4"]))
    assert got["FailedNodes"] is None and sorted(got["FailedAndUnresolvableNodes"]) == ["a", "t4"]


def test_bind_decides_against_the_backends_records_when_the_cache_counts_others(serve: Any) -> None:
    from scheduler.core.allocation import Allocation, DeviceShare
    from scheduler.core.inventory import SharingMode

    pod = k8s_pod("p", gpu_memory="60000")
    served = serve(k8s_node("a", gpus=1), pod)
    # the cache counts a bind in flight that the backend never saw: the GPU looks full
    ghost = Allocation("a", (DeviceShare("a-gpu0", 0, SharingMode.MPS, 81920, 1000, None),), 0, 0)
    served.extender.cache.reserve("default/ghost", "uid-ghost", ghost)
    assert served.post("filter", filter_args(pod, ["a"]))["NodeNames"] == []
    # bind reads the node's records from the backend, where the GPU is free
    assert served.post("bind", binding(pod, "a")) == {"Error": ""}
