"""Reservation prices of GPU groups (scheduler/core/policies/reserve.py) and the group ledger. Cases by hand."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.core.board import Board
from scheduler.core.capacity import GAP_LEVELS
from scheduler.core.fit import fit
from scheduler.core.groups import Groups, groups_of
from scheduler.core.policies.base import Adjusting, Cluster, Reading, Reads
from scheduler.core.policies.reserve import free_by_group, inside, pinned_load, pressure, price, squash
from scheduler.core.request import Demand, GpuKind, GpuRequest
from scheduler.core.state import NodeState
from tests.builders import make_state


def test_free_gpu_per_group_from_its_gap_histogram() -> None:
    # group 0: two idle GPUs (level 100) and one with 0.5 free: 2 x 1000 + 500 = 2500 milli
    # group 1: one GPU with 0.19 free: 190 milli
    gaps = np.zeros((2, GAP_LEVELS + 1), dtype=np.int64)
    gaps[0, 100], gaps[0, 50], gaps[1, 19] = 2, 1, 1
    assert free_by_group(gaps).tolist() == [2500.0, 190.0]


# Three groups with free GPU 2000 (T4), 1000 (P100), 7000 (G2): 10000 in all.
FREE = np.array([2000.0, 1000.0, 7000.0])
MASKS = np.array(
    [
        [True, False, False],  # pinned to T4
        [True, True, False],  # T4 or P100
        [True, True, True],  # anywhere: flexible, no pinned load
    ]
)


def test_pinned_load_splits_a_class_over_its_groups_by_free_gpu() -> None:
    # T4 only: 100 -> T4 100. T4|P100: 150 split 2000 : 1000 -> T4 100, P100 50. Flexible: nothing.
    load = pinned_load(MASKS, np.array([100.0, 150.0, 750.0]), FREE)
    assert load.tolist() == pytest.approx([200.0, 50.0, 0.0])


def test_a_class_whose_groups_are_full_spreads_evenly() -> None:
    full = np.array([0.0, 0.0, 7000.0])
    load = pinned_load(MASKS, np.array([100.0, 150.0, 750.0]), full)
    # T4 only: 100 on T4; T4|P100 with no room in either: 75 each
    assert load.tolist() == pytest.approx([175.0, 75.0, 0.0])


def test_pressure_is_pinned_share_of_demand_per_share_of_free_gpu() -> None:
    # V = 1000. T4: 200 / 1000 = 0.2 of demand on 2000 / 10000 = 0.2 of the free GPU -> rho 1.0
    # P100: 0.05 on 0.1 -> 0.5; G2: 0 pinned -> 0
    rho = pressure(MASKS, np.array([100.0, 150.0, 750.0]), FREE)
    assert rho.tolist() == pytest.approx([1.0, 0.5, 0.0])


def test_a_full_group_with_pinned_demand_has_infinite_pressure() -> None:
    rho = pressure(MASKS, np.array([100.0, 150.0, 750.0]), np.array([0.0, 1000.0, 7000.0]))
    assert rho[0] == np.inf
    assert price(rho, 0.5)[0] == 1.0


def test_price_ramps_from_start_to_one() -> None:
    # start 0.5: rho 0.5 -> 0, 0.75 -> (0.75 - 0.5) / 0.5 = 0.5, 1.0 and above -> 1
    assert price(np.array([0.0, 0.5, 0.75, 1.0, 3.0]), 0.5).tolist() == [0.0, 0.0, 0.5, 1.0, 1.0]


def test_squash_keeps_order_inside_0_to_100() -> None:
    values = np.array([-30.0, -1.0, 0.5, 1.0, 50.0, 99.0, 99.5, 130.0])
    out = squash(values)
    assert np.all(np.diff(out) > 0)
    assert out.min() > 0 and out.max() < 100
    assert out[3:6].tolist() == [1.0, 50.0, 99.0]  # untouched in 1..99
    # below 1: v -> 1 / (2 - v): -1 -> 1/3; above 99: v -> 100 - 1 / (v - 98): 130 -> 100 - 1/32
    assert out[1] == pytest.approx(1 / 3)
    assert out[-1] == pytest.approx(100 - 1 / 32)


def whole(models: tuple[str, ...] = ()) -> Demand:
    return Demand(8_000, 0, GpuRequest(GpuKind.WHOLE, 1, models=models))


def cluster_groups(board: Board) -> Groups:
    """The groups a policy's adjust sees on ``board`` (over every node)."""
    seen: list[Groups] = []

    class Spy(Reading, Adjusting):
        name = "spy"
        reads = frozenset({Reads.GAPS, Reads.GROUPS})

        def score(self, demand: Demand, state: NodeState, allocation: object) -> float:
            return 50.0

        def adjust(self, demand: Demand, scores: np.ndarray, cluster: Cluster) -> np.ndarray:
            seen.append(cluster.groups)
            return scores

    board.scores(Spy(), whole())
    return seen[0]


@pytest.mark.parametrize("plain", [False, True])
def test_groups_split_gpus_by_model_and_follow_state_changes(plain: bool) -> None:
    t4 = make_state(name="t4", gpus=2, model="T4", mode="mps", cpu_milli=104_000)
    l4 = make_state(name="l4", gpus=8, model="L4", mode="mps", cpu_milli=96_000)
    cpu = make_state(name="cpu", gpus=0)
    after = t4.apply("p", fit(whole(), t4).allocations[0])
    if plain:
        before = groups_of([t4, l4, cpu], [t4, l4, cpu])
    else:
        board = Board([t4, l4, cpu])
        before = cluster_groups(board)
    # what a policy sees holds for the call it is given to: read it before the board changes
    assert [k[0] for k in before.keys] == ["T4", "L4"]
    assert before.node_group.tolist() == [0, 1, -1]
    assert free_by_group(before.gaps).tolist() == [2000.0, 8000.0]
    if plain:
        now = groups_of([after, l4, cpu], [after, l4, cpu])
    else:
        board.put(after)
        now = cluster_groups(board)
    assert free_by_group(now.gaps).tolist() == [1000.0, 8000.0]
    # allowed: a pod pinned to T4 fits only group 0; a 100-core pod only the 104-core T4 node
    assert now.allowed(whole(("T4",))).tolist() == [True, False]
    assert now.allowed(whole()).tolist() == [True, True]
    assert now.allowed(Demand(100_000, 0, GpuRequest(GpuKind.WHOLE, 1))).tolist() == [True, False]
    # a 4-GPU pod fits no T4 node (2 GPUs), however empty
    assert now.allowed(Demand(0, 0, GpuRequest(GpuKind.WHOLE, 4))).tolist() == [False, True]


def test_the_groups_a_pod_could_use_follow_nodes_that_join_leave_and_change() -> None:
    # Which groups a pod could use is asked once per (node kind, GPU group) the cluster has: the
    # 100-core pod fits only the 104-core T4 node; once that node leaves, or comes back with
    # 96 cores, no group takes it, and when a 104-core node of L4s joins, the L4 group does.
    big = Demand(100_000, 0, GpuRequest(GpuKind.WHOLE, 1))
    t4 = make_state(name="t4", gpus=2, model="T4", mode="mps", cpu_milli=104_000)
    l4 = make_state(name="l4", gpus=8, model="L4", mode="mps", cpu_milli=96_000)
    board = Board([t4, l4])
    assert cluster_groups(board).allowed(big).tolist() == [True, False]
    board.remove("t4")
    assert cluster_groups(board).allowed(big).tolist() == [False, False]
    board.put(make_state(name="t4", gpus=2, model="T4", mode="mps", cpu_milli=96_000))
    assert cluster_groups(board).allowed(big).tolist() == [False, False]
    assert cluster_groups(board).allowed(whole(("T4",))).tolist() == [True, False]
    board.put(make_state(name="l4-big", gpus=8, model="L4", mode="mps", cpu_milli=104_000))
    assert cluster_groups(board).allowed(big).tolist() == [False, True]
    board.remove("l4-big")
    assert cluster_groups(board).allowed(big).tolist() == [False, False]


def test_the_classes_inside_an_allowed_set_are_its_proper_subsets() -> None:
    # MASKS: T4 only, T4|P100, anywhere. A pod of T4|P100 is priced for T4 only (not its own
    # class, not the flexible one); a pod allowed anywhere for both pinned classes; a T4-only
    # pod for none.
    assert inside(MASKS, np.array([True, True, False])).tolist() == [True, False, False]
    assert inside(MASKS, np.array([True, True, True])).tolist() == [True, True, False]
    assert inside(MASKS, np.array([True, False, False])).tolist() == [False, False, False]
