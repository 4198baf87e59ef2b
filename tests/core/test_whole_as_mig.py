"""Whole GPUs as MIG instances: only for a pod listing ``mig`` in ``sharing``.

A request for whole GPUs never lands on MIG slices unless the pod lists mig (the default, any,
does not count); then each GPU asked is served by one MIG instance on its own physical GPU,
the largest free instance of a static GPU or the largest profile of a dynamic one (the whole
GPU in MIG mode). Every expected value below is worked out by hand from the geometry.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from scheduler.core.allocation import MigSlot
from scheduler.core.board import Board
from scheduler.core.catalog import ProfileSpec
from scheduler.core.fit import fit
from scheduler.core.inventory import Node, SharingMode
from scheduler.core.policies import REGISTRY, make_policy
from scheduler.core.preempt import Candidate, Preemption, choose_victims
from scheduler.core.request import Demand, GpuKind, GpuRequest, parse_pod
from scheduler.core.select import rank
from scheduler.core.state import NodeState
from tests.builders import make_device, make_node, make_state, static_mig

MIG_ONLY = frozenset({SharingMode.MIG})


def whole(count: int, sharing: frozenset[SharingMode] = MIG_ONLY) -> Demand:
    return Demand(0, 0, GpuRequest(GpuKind.WHOLE, count, sharing=sharing))


def pod_of(annotations: dict[str, str], limits: dict[str, Any] | None = None) -> Demand:
    container: dict[str, Any] = {"name": "c"}
    if limits:
        container["resources"] = {"limits": limits}
    return parse_pod(
        {"metadata": {"name": "p", "annotations": annotations}, "spec": {"containers": [container]}}
    ).demand


def static_node() -> Node:
    # GPU 0: 3g.40gb at 4, 2g.20gb at 0, 1g.10gb at 2; GPU 1: 3g.40gb at 4, 4g.40gb at 0 (the
    # 3g listed first: GPU 1's order must come from the sizes, not the listing)
    first = static_mig("A100-80GB", ("3g.40gb", 4), ("2g.20gb", 0), ("1g.10gb", 2))
    second = static_mig("A100-80GB", ("3g.40gb", 4), ("4g.40gb", 0))
    devices = (
        make_device(0, "A100-80GB", "mig", uuid="gpu0", mig_instances=first),
        make_device(1, "A100-80GB", "mig", uuid="gpu1", mig_instances=second),
    )
    return Node("n1", 64_000, 512_000, devices)


@pytest.mark.parametrize(
    ("annotations", "limits"),
    [
        ({"gpuslice.io/gpu-count": "2", "gpuslice.io/sharing": "mig"}, None),
        ({"gpuslice.io/gpu-count": "2", "gpuslice.io/sharing": "mig|exclusive"}, None),
        ({"gpuslice.io/sharing": "mig"}, {"nvidia.com/gpu": 2}),  # a container's plain request, opted in
    ],
)
def test_the_opt_in_parses_as_whole_gpus_listing_mig(annotations: dict[str, str], limits: dict[str, Any]) -> None:
    gpu = pod_of(annotations, limits).gpu
    assert (gpu.kind, gpu.count) == (GpuKind.WHOLE, 2) and SharingMode.MIG in gpu.sharing


def test_static_mig_gives_each_gpu_asked_its_largest_free_instance() -> None:
    state = NodeState.empty(static_node())
    demand = pod_of({"gpuslice.io/gpu-count": "2", "gpuslice.io/sharing": "mig"})
    expected = [
        # GPU 0's largest is 3g.40gb (4 slots), GPU 1's 4g.40gb (4 slots, 4 slices: more than 3g's 3)
        [("MIG-3g.40gb-4-0", 0, MigSlot(4, 4, 3, "3g.40gb")), ("MIG-4g.40gb-0-1", 1, MigSlot(0, 4, 4, "4g.40gb"))],
        # then the next largest free on each
        [("MIG-2g.20gb-0-1", 0, MigSlot(0, 2, 2, "2g.20gb")), ("MIG-3g.40gb-4-0", 1, MigSlot(4, 4, 3, "3g.40gb"))],
    ]
    for k, want in enumerate(expected):
        found = fit(demand, state)
        assert len(found.allocations) == 1
        shares = found.allocations[0].shares
        assert [(s.uuid, s.index, s.mig) for s in shares] == want
        assert {s.mode for s in shares} == {SharingMode.MIG}
        state = state.apply(f"p{k}", found.allocations[0])
    # GPU 0 keeps its 1g.10gb, GPU 1 has nothing free: one MIG GPU is fewer than the two asked
    found = fit(demand, state)
    assert not found and found.reason.startswith("needs 2 GPUs for 2 whole GPUs, not that many available")
    one = fit(whole(1), state)
    assert [(s.uuid, s.mig) for a in one.allocations for s in a.shares] == [
        ("MIG-1g.10gb-2-2", MigSlot(2, 1, 1, "1g.10gb"))
    ]


@pytest.mark.parametrize("sharing", [{}, {"gpuslice.io/sharing": "any"}])
def test_whole_gpus_without_the_opt_in_never_take_mig(sharing: dict[str, str]) -> None:
    demand = pod_of({"gpuslice.io/gpu-count": "1", **sharing})
    assert not demand.gpu.sharing  # any is no list
    for state in (NodeState.empty(static_node()), make_state(gpus=2, mode="mig", model="A100-80GB")):
        found = fit(demand, state)
        assert not found
        assert found.reason == "GPU 0 is partitioned by MIG; whole GPUs need another mode, or sharing listing mig"


def test_dynamic_mig_gives_the_whole_gpu_as_its_full_instance() -> None:
    state = make_state(gpus=2, mode="mig", model="A100-80GB")
    found = fit(whole(1), state)
    # one candidate per GPU, each the full profile 7g.80gb at slot 0 (8 memory slots, 7 slices)
    assert [(a.shares[0].index, a.shares[0].mig) for a in found.allocations] == [
        (0, MigSlot(0, 8, 7, "7g.80gb")),
        (1, MigSlot(0, 8, 7, "7g.80gb")),
    ]
    # a 1g.10gb on GPU 0 leaves no room for its full instance (nor a smaller one, for a whole GPU)
    small = fit(Demand(0, 0, GpuRequest(GpuKind.MIG, 1, profile=ProfileSpec.parse("1g.10gb"))), state)
    state = state.apply("small", small.allocations[0])
    assert not fit(whole(2), state)
    assert [a.shares[0].index for a in fit(whole(1), state).allocations] == [1]


def test_a_mig_gpu_serves_one_gpu_of_a_pod_not_two() -> None:
    # one static GPU with two 3g.40gb: two whole GPUs asked are two physical GPUs, not two slices
    node = make_node(
        gpus=1,
        model="A100-80GB",
        mode="mig",
        device_options={"mig_instances": static_mig("A100-80GB", ("3g.40gb", 0), ("3g.40gb", 4))},
    )
    found = fit(whole(2), NodeState.empty(node))
    assert not found and "needs 2 GPUs" in found.reason
    assert fit(whole(1), NodeState.empty(node))


def test_preemption_for_a_mig_whole_gpu_evicts_one_instance_not_the_gpu() -> None:
    node = make_node(
        gpus=1,
        model="A100-80GB",
        mode="mig",
        device_options={"mig_instances": static_mig("A100-80GB", ("3g.40gb", 0), ("3g.40gb", 4))},
    )
    state = NodeState.empty(node)
    three = Demand(0, 0, GpuRequest(GpuKind.MIG, 1, profile=ProfileSpec.parse("3g.40gb")))
    for key in ("a", "b"):
        state = state.apply(key, fit(three, state).allocations[0])
    found = choose_victims(whole(1), state, [Candidate("a"), Candidate("b")])
    assert isinstance(found, Preemption)
    assert found.victims == ("a",) and found.fewest


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_the_board_scores_mig_whole_gpus_as_the_plain_oracle(name: str) -> None:
    """The board works out a whole GPU's share on a MIG GPU as fit does (an instance, not the
    GPU), so every policy scores each node as select's node-by-node oracle does."""
    small = Demand(0, 0, GpuRequest(GpuKind.MIG, 1, profile=ProfileSpec.parse("1g.10gb")))
    static = NodeState.empty(replace(static_node(), name="static"))
    partly = NodeState.empty(replace(static_node(), name="partly"))
    partly = partly.apply("a", fit(whole(2), partly).allocations[0])
    dynamic = make_state(name="dynamic", gpus=2, mode="mig", model="A100-80GB")
    used = make_state(name="used", gpus=2, mode="mig", model="A100-80GB")
    used = used.apply("s", fit(small, used).allocations[0])
    states = [static, partly, dynamic, used]
    for demand in (whole(1), whole(2)):
        oracle = rank(make_policy(name), demand, states)  # a fresh policy each: random's draws alike
        want = {p.node: p.score for p in oracle.placements}
        got = Board(states).scores(make_policy(name), demand).tolist()
        assert got == [want.get(s.node.name, float("-inf")) for s in states], (name, demand)
        assert set(oracle.failures) == {s.node.name for s in states} - set(want)
