"""The LP upper bound: derived by hand on tiny cases, and never below what a policy achieves."""

from __future__ import annotations

import pytest

from scheduler.core import Demand, GpuKind, GpuRequest
from scheduler.sim.bound import bound, lp_bound
from scheduler.sim.engine import simulate
from scheduler.sim.load import embedded_scenario
from scheduler.sim.metrics import curves
from tests.builders import make_node
from tests.sim.helpers import TWO_GPUS, scenario


def share(milli: int, cpu: int = 1000) -> Demand:
    return Demand(cpu, 0, GpuRequest(GpuKind.SHARE, 1, fraction_milli=milli))


def test_two_large_shares_on_one_gpu() -> None:
    # one GPU, two 0.6 pods: compute alone allows 1000/600 = 1.67 pods (1000 milli); the cut
    # "at most one share above 1/2 per GPU" allows 1: bound 600
    node = make_node(gpus=1, mode="mps", model="V100-16GB")
    assert lp_bound([node], [share(600), share(600)]) == pytest.approx(600)


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
