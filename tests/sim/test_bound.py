"""The LP upper bound: derived by hand on tiny cases, never below what a policy achieves, and
never below the best integer placement found by exhaustive search on small cases."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.capacity import allocated_milli
from scheduler.core.fit import fit
from scheduler.core.inventory import Node
from scheduler.core.request import Demand, GpuKind, GpuRequest
from scheduler.core.state import NodeState
from scheduler.sim.bound import bound, lp_bound, relax, share_patterns
from scheduler.sim.engine import simulate
from scheduler.sim.load import embedded_scenario
from scheduler.sim.metrics import curves
from tests.builders import make_node
from tests.sim.helpers import TWO_GPUS, scenario


def share(milli: int, cpu: int = 1000) -> Demand:
    return Demand(cpu, 0, GpuRequest(GpuKind.SHARE, 1, fraction_milli=milli))


def memory_share(mib: int) -> Demand:
    return Demand(1000, 0, GpuRequest(GpuKind.SHARE, 1, memory_mib=mib))


def test_two_large_shares_on_one_gpu() -> None:
    # one GPU, two 0.6 pods: compute alone allows 1000/600 = 1.67 pods (1000 milli); the cut
    # "at most one share above 1/2 per GPU" allows 1: bound 600
    node = make_node(gpus=1, mode="mps", model="V100-16GB")
    assert lp_bound([node], [share(600), share(600)]) == pytest.approx(600)


def test_three_shares_of_six_tenths_on_two_gpus() -> None:
    # one per GPU: 2 x 600 = 1200 (the summed compute alone would allow 2000 / 600 = 3.3 pods)
    node = make_node(gpus=2, mode="mps", model="V100-16GB")
    assert lp_bound([node], [share(600)] * 3) == pytest.approx(1200)


def test_large_shares_leave_holes_only_small_ones_fill() -> None:
    # two GPUs, two pods of 0.81 and three of 0.3. Maximal patterns: {0.81} (0.81 + 0.3 > 1) and
    # {0.3, 0.3, 0.3}. With a GPUs on {0.81} and 2 - a on {0.3 x 3}:
    # 810 min(a, 2) + 300 min(3, 3 (2 - a)), largest at a = 1: 810 + 900 = 1710, the integer
    # optimum. The summed compute (2000) and the cuts (at most 2 shares above 1/2, 4 above 1/3,
    # 6 above 1/4 on two GPUs) all allow 2000: what the cap-hit fallback gives.
    node = make_node(gpus=2, mode="mps", model="V100-16GB")
    demands = [share(810)] * 2 + [share(300)] * 3
    assert lp_bound([node], demands) == pytest.approx(1710)
    fallback = relax([node], demands, pattern_cap=1)
    assert fallback.value == pytest.approx(2000)
    assert fallback.patterns == 0 and "more than 1 share patterns" in fallback.notes[0]


def test_fractional_patterns_still_bound_from_above() -> None:
    # two GPUs, two pods of 0.7 and two of 0.4: patterns {0.7} and {0.4, 0.4}. With a GPUs on
    # {0.7}: 700 min(a, 2) + 400 min(2, 2 (2 - a)); for a >= 1 that is 1600 - 100 a, for a <= 1
    # it is 700 a + 800: 1500 at a = 1, the integer optimum ({0.7} + {0.4, 0.4}); the summed
    # compute and the cuts allow 2000
    node = make_node(gpus=2, mode="mps", model="V100-16GB")
    assert lp_bound([node], [share(700)] * 2 + [share(400)] * 2) == pytest.approx(1500)


def test_share_patterns_are_the_maximal_multisets() -> None:
    # sizes (compute, memory MiB) 0.7 and 0.4 on one 16 GiB GPU: {0.7} and {0.4, 0.4};
    # {0.4} alone is dominated by {0.4, 0.4}, {0.7, 0.4} does not fit
    node = make_node(gpus=1, mode="mps", model="V100-16GB")
    sizes = [(700, 11468), (400, 6553)]
    assert sorted(share_patterns(node, node.devices[0], sizes) or []) == [(0, 2), (1, 0)]
    # 0.81 beside 0.19 and 0.05: {0.81, 0.19}, {0.81, 0.05 x 3}, {0.19 x 5, 0.05}, ... 0.05 x 20
    small = [(810, 13271), (190, 3112), (50, 819)]
    found = share_patterns(node, node.devices[0], small) or []
    assert (1, 1, 0) in found and (1, 0, 3) in found and (0, 5, 1) in found and (0, 0, 20) in found
    assert (0, 4, 1) not in found  # room for one more 0.05 (4 x 190 + 50 = 810)
    assert share_patterns(node, node.devices[0], small, cap=3) is None


@pytest.mark.parametrize(
    ("replicas", "oversub", "expected"),
    [
        # T4, 15360 MiB; pods of 6144 MiB take ceil(6144 / 15360 * 1000) = 400 milli compute each.
        # 150% memory: 23040 MiB holds 3 (18432), not 4 (24576): 3 x 400
        (4, 150, 1200),
        # 2 replicas: 2 x 400, whatever the memory
        (2, 150, 800),
        # 100% memory: 15360 MiB holds 2 (12288): 2 x 400
        (4, 100, 800),
    ],
)
def test_time_slicing_replicas_and_memory_oversubscription(replicas: int, oversub: int, expected: int) -> None:
    node = make_node(
        gpus=1, mode="time-slicing", model="T4", device_options={"replicas": replicas}, ts_memory_oversub_pct=oversub
    )
    assert lp_bound([node], [memory_share(6144)] * 5) == pytest.approx(expected)


def test_mps_client_limit() -> None:
    # at most 2 clients on the GPU: 2 x 300, though compute would take 3
    node = make_node(gpus=1, mode="mps", model="V100-16GB", device_options={"mps_client_limit": 2})
    assert lp_bound([node], [share(300)] * 4) == pytest.approx(600)


def test_cpu_binds_per_node() -> None:
    # two 1-GPU nodes with 8 cores; four 0.25 pods of 5 cores: one per node (the cut "at most
    # one pod above half the CPU"), so 2 x 250 = 500
    nodes = [make_node(name=f"n{i}", gpus=1, mode="mps", model="T4", cpu_milli=8000) for i in range(2)]
    assert lp_bound(nodes, [share(250, cpu=5000)] * 4) == pytest.approx(500)


def test_bound_reaches_what_fgd_packs_on_the_two_gpu_case() -> None:
    # the four pods of TWO_GPUS (0.2, 0.5, 0.8, 0.5) fill both GPUs exactly: bound 2000 = 100%,
    # and fgd reaches it (test_engine derives its placements)
    trace = scenario(TWO_GPUS)
    b = bound(trace, 1, None)
    assert b.bound_milli == pytest.approx(2000) and b.bound_pct == pytest.approx(100)
    assert simulate(trace, "fgd", 1, ranks={"a": 0, "b": 1}).allocated[-1] == 2000


POLICIES = ("random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd", "binpack", "spread")


@pytest.mark.parametrize("seed", [1, 2])
def test_bound_is_never_below_a_policy(seed: int) -> None:
    trace = embedded_scenario()
    everything = bound(trace, seed, None)
    at_100 = bound(trace, seed, 100)
    for policy in POLICIES:
        result = simulate(trace, policy, seed)
        assert everything.pods == len(result.arrived) - 1  # the same arrivals
        assert everything.bound_milli + 1e-6 >= result.allocated[-1], policy
        assert at_100.bound_pct + 1e-6 >= curves(result).at(100)[0], policy


def test_bound_refuses_timed_replays() -> None:
    trace = scenario("replay: timed\nnodes: [{name: a}]\npods: [{name: p, duration: 5}]\n")
    with pytest.raises(ValueError, match="arrivals-only"):
        bound(trace, 1)


def best_placement(nodes: Sequence[Node], demands: Sequence[Demand]) -> int:
    """The most milli-GPU any integer placement allocates, by exhaustive search with the core."""
    best = 0

    def walk(i: int, states: tuple[NodeState, ...], total: int) -> None:
        nonlocal best
        best = max(best, total)
        if i == len(demands):
            return
        walk(i + 1, states, total)  # left out
        for n, state in enumerate(states):
            for alloc in fit(demands[i], state).allocations:
                after = state.apply(f"p{i}", alloc)
                walk(i + 1, (*states[:n], after, *states[n + 1 :]), total + allocated_milli(alloc))

    walk(0, tuple(NodeState.empty(node) for node in nodes), 0)
    return best


@settings(max_examples=40, deadline=None)
@given(
    mode=st.sampled_from(["mps", "time-slicing"]),
    gpus=st.lists(st.integers(1, 2), min_size=1, max_size=2),
    replicas=st.integers(1, 3),
    oversub=st.sampled_from([100, 150]),
    pods=st.lists(
        st.tuples(st.sampled_from([100, 190, 300, 400, 550, 810, 1000]), st.sampled_from([1000, 3000])),
        min_size=1,
        max_size=5,
    ),
)
def test_bound_is_never_below_the_best_integer_placement(
    mode: str, gpus: list[int], replicas: int, oversub: int, pods: list[tuple[int, int]]
) -> None:
    options = {"replicas": replicas} if mode == "time-slicing" else {}
    nodes = [
        make_node(
            name=f"n{i}",
            gpus=g,
            mode=mode,
            model="T4",
            cpu_milli=4000,
            device_options=options,
            ts_memory_oversub_pct=oversub,
            mps_compute_oversub_pct=oversub,
        )
        for i, g in enumerate(gpus)
    ]
    demands = [share(milli, cpu=cpu) for milli, cpu in pods]
    assert lp_bound(nodes, demands) + 1e-6 >= best_placement(nodes, demands)
