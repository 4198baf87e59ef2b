"""The cluster gap histogram (Board.gaps) and fgd-cpu's gap balance term. Cases by hand."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.board import Board
from scheduler.core.capacity import GAP_LEVELS
from scheduler.core.fit import fit
from scheduler.core.fragmentation import Shape
from scheduler.core.policies.fgdcpu import FgdCpu, FgdCpuOptions
from scheduler.core.request import Demand, GpuKind, GpuRequest
from scheduler.core.select import Gaps, rank, score_node
from scheduler.core.state import NodeState
from tests.builders import make_state

WHOLE = Demand(0, 0, GpuRequest(GpuKind.WHOLE, 1))
ONLY_WHOLE = (Shape(1.0, gpu_count="1"),)


def pinned(balance_weight: float = 75.0) -> FgdCpu:
    """fgd-cpu scoring against whole GPUs only, learning nothing."""
    return FgdCpu(FgdCpuOptions(ONLY_WHOLE, balance_weight=balance_weight, learn=False))


def share(milli: int) -> Demand:
    return Demand(0, 0, GpuRequest(GpuKind.SHARE, 1, fraction_milli=milli))


def holding(name: str, *millis: int) -> NodeState:
    """A one-GPU MPS node with a share of each size in ``millis`` on it."""
    state = make_state(name=name, gpus=1, mode="mps", cpu_milli=64_000)
    for k, milli in enumerate(millis):
        state = state.apply(f"{name}-{k}", fit(share(milli), state).allocations[0])
    return state


def test_adjust_subtracts_the_rise_in_squared_gap_counts() -> None:
    # Histogram: 3 GPUs with 530 milli free (level 53), 4 idle (level 100): 7 GPUs.
    # Only share seen: 470 -> levels 47..99 are of class 47; 100 (idle) and below 47 have none.
    # node 0: 100 -> 53: rise = (2 * 3 + 1) - 0 = 7       -> 50 - 7 = 43 (weight 7 / 7 GPUs = 1 a unit)
    # node 1:  53 -> 6:  rise = 0 - (2 * 3 - 1) = -5      -> 50 + 5 = 55 (level 6 is dead)
    # node 2: whole GPUs (no move)                          -> 50
    # node 3: does not fit                                  -> -inf
    policy = pinned(balance_weight=7.0)
    policy.learned.observe(share(470))
    gaps = np.zeros(GAP_LEVELS + 1, dtype=np.int64)
    gaps[53], gaps[100] = 3, 4
    cluster = Gaps(gaps, np.array([[100, 53, -1, -1], [53, 6, -1, -1]]))
    scores = np.array([50.0, 50.0, 50.0, -np.inf])
    out = policy.adjust(share(470), scores, cluster)
    assert out.tolist() == [43.0, 55.0, 50.0, -np.inf]
    # whole-GPU pods and a zero weight leave the scores alone
    assert policy.adjust(WHOLE, scores, cluster).tolist() == scores.tolist()
    off = pinned(balance_weight=0.0)
    assert off.adjust(share(470), scores, cluster).tolist() == scores.tolist()


def test_small_share_goes_to_the_common_hole() -> None:
    # Typical workload: whole GPUs only, so any partly used GPU is all fragment:
    #   "half"  (470 on it, 530 free): a 160 share leaves 370 -> fragmentation falls by 160;
    #   "big-k" (810 on it, 190 free): a 160 share leaves 30  -> fragmentation falls by 160.
    # A local tie, which node order would give to "half" (listed first). The cluster has
    # three 190 holes and one 530 hole, all of class 16 (160 is the only share seen, so
    # N[16] = 4), and level 3 is dead:
    #   big-k: 19 -> 3:  rise = 0 - (2 * 4 - 1) = -7;   half: 53 -> 37: class 16 -> 16, rise 0.
    states = [holding("half", 470)] + [holding(f"big-{k}", 810) for k in range(3)]
    order = {s.node.name: i for i, s in enumerate(states)}
    pod = share(160)
    plain = pinned(balance_weight=0.0)
    plain.learned.observe(pod)
    placed = Board(states, order).best(plain, pod)
    assert placed is not None and placed.node == "half"
    balanced = pinned()
    balanced.learned.observe(pod)
    placed = Board(states, order).best(balanced, pod)
    assert placed is not None and placed.node == "big-0"


def test_holes_are_counted_by_the_largest_share_seen_that_fits() -> None:
    # Shares seen: 160, 320, 470 -> classes: levels 16..31 -> 16, 32..46 -> 32, 47..99 -> 47.
    # Histogram: three 190 holes (level 19), one 530 hole (53), four idle GPUs (100): 8 GPUs,
    # so N[16] = 3, N[47] = 1. A 320 share, weight 8 (1 point a unit over 8 GPUs):
    #   into the 530 hole: 53 -> 21, class 47 -> 16: rise = (2 * 3 + 1) - (2 * 1 - 1) = 6 -> 44
    #   on an idle GPU:   100 -> 68, none -> 47:     rise = 2 * 1 + 1 = 3                 -> 47
    # By exact levels (N[21] = 0, N[68] = 0) the 530 hole would win: 1 - 1 = 0 against 1. The
    # 0.21 hole it leaves waits for the same pods of at most 0.16 GPU as the three 0.19 holes.
    policy = pinned(balance_weight=8.0)
    for milli in (160, 320, 470):
        policy.learned.observe(share(milli))
    classes = policy.gap_classes()
    assert classes[15] == -1 and classes[16] == classes[31] == 16 and classes[32] == classes[46] == 32
    assert classes[47] == classes[99] == 47 and classes[100] == -1 and classes[-1] == -1
    gaps = np.zeros(GAP_LEVELS + 1, dtype=np.int64)
    gaps[19], gaps[53], gaps[100] = 3, 1, 4
    out = policy.adjust(share(320), np.array([50.0, 50.0]), Gaps(gaps, np.array([[53, 100], [21, 68]])))
    assert out.tolist() == [44.0, 47.0]
    # a move within one class (53 -> 48, both 47) does not change the sum of squares
    assert policy.adjust(share(50), np.array([50.0]), Gaps(gaps, np.array([[53], [48]]))).tolist() == [50.0]


def histogram(states: list[NodeState]) -> list[int]:
    return np.bincount([lv for s in states for lv in s.gap_levels()], minlength=GAP_LEVELS + 1).tolist()


def test_rankings_apply_the_balance_like_best() -> None:
    # The case above: the balance turns the local tie towards "big-0"; the plain ranking agrees
    # with the board's scores, and so does a board asked about a subset of the nodes.
    states = [holding("half", 470)] + [holding(f"big-{k}", 810) for k in range(3)]
    order = {s.node.name: i for i, s in enumerate(states)}
    pod = share(160)
    policy = pinned()
    policy.learned.observe(pod)
    board = Board(states, order)
    expected = dict(zip(order, board.scores(policy, pod).tolist(), strict=True))
    ranking = rank(policy, pod, states, order)
    assert ranking.placements[0].node == "big-0"
    assert {p.node: p.score for p in ranking.placements} == pytest.approx(expected)
    # a subset is scored against the whole cluster's holes, not its own: big-2 still beats half
    subset = board.scores(policy, pod, board.positions(["half", "big-2"]))
    assert subset.tolist() == pytest.approx([expected["half"], expected["big-2"]])
    assert subset[1] > subset[0]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from([100, 160, 320, 470, 810, 1000])), max_size=25))
def test_gap_histogram_follows_every_change(steps: list[tuple[int, int]]) -> None:
    states = [make_state(name=f"n{i}", gpus=2, mode="mps") for i in range(4)]
    board = Board(states)
    for k, (i, milli) in enumerate(steps):
        state = board.states[i]
        demand = WHOLE if milli == 1000 else share(milli)
        found = fit(demand, state)
        if found:
            board.put(state.apply(f"p{k}", found.allocations[0]))
        elif state.pods:  # nothing fits: free the oldest pod instead
            board.put(state.release(state.pods[0][0]))
        assert board.gaps.tolist() == histogram(list(board.states))
    assert int(board.gaps.sum()) == 8


@pytest.mark.parametrize("weight", [0.0, 125.0])
def test_board_scores_are_the_adjusted_local_scores(weight: float) -> None:
    states = [holding("a", 470), holding("b", 160), holding("c"), holding("d", 320, 320)]
    policy = pinned(balance_weight=weight)
    pod = share(230)
    policy.learned.observe(pod)
    board = Board(states)
    local = []
    for state in states:
        scored = score_node(policy, pod, state)
        assert not isinstance(scored, str)
        local.append(scored.score)
    before = [s.gap_levels()[0] for s in states]
    after = [lv - 23 for lv in before]
    expected = policy.adjust(pod, np.array(local), Gaps(board.gaps, np.array([before, after])))
    assert board.scores(policy, pod) == pytest.approx(expected)
