"""fgd-cpu: FGD plus the GPU a node strands for lack of CPU, learned online. Cases by hand."""

from __future__ import annotations

import math
from unittest.mock import patch

import numpy as np
import pytest

from scheduler.core import nodescores
from scheduler.core.board import Board
from scheduler.core.fit import fit
from scheduler.core.fragmentation import OnlineWorkload, Shape, TypicalWorkload, workload_of
from scheduler.core.policies.fgdcpu import FgdCpu, FgdCpuOptions, gpu_per_cpu
from scheduler.core.request import Demand, GpuKind, GpuRequest
from scheduler.core.select import firsts, rank, score_firsts
from scheduler.core.state import NodeState
from tests.builders import make_policy_for, make_state, share_candidates

WHOLE_12_CORES = Demand(12_000, 0, GpuRequest(GpuKind.WHOLE, 1))
PINNED_SHAPES = (Shape(1.0, cpu=12, gpu_count="1"),)
PINNED = workload_of(PINNED_SHAPES)


def pinned() -> FgdCpu:
    """fgd-cpu scoring against the pinned workload, learning nothing."""
    return FgdCpu(FgdCpuOptions(PINNED_SHAPES, learn=False))


def nodes() -> list[NodeState]:
    """poor: 8 GPUs, 96 cores (12 per GPU); rich: 2 GPUs, 104 cores (52 per GPU)."""
    return [
        make_state(name="poor", gpus=8, mode="mps", cpu_milli=96_000),
        make_state(name="rich", gpus=2, mode="mps", cpu_milli=104_000),
    ]


def test_ratio_of_the_typical_workload() -> None:
    # one whole GPU (1000 milli) per 12 cores (12000 milli) -> 1/12
    assert TypicalWorkload(((WHOLE_12_CORES, 1.0),)) == PINNED
    assert gpu_per_cpu(PINNED) == pytest.approx(1 / 12)


def test_cpu_only_pod_goes_where_it_strands_no_gpu() -> None:
    # r = 1/12. poor: before S = max(0, 8000 - 96000/12) = 0, F = 0 (a typical pod fits).
    #   A 16-core pod leaves 80000: S = 8000 - 6666.7 = 1333.3, F still 0 -> C rises by 4 x 1333.3 = 5333.3:
    #   score = 50 + 50 tanh(-5333.3 / 2000) = 50 - 49.52 = 0.48, rounded to 0.
    # rich: S = max(0, 2000 - 104000/12) = 0 before and after (88000/12 = 7333 > 2000) -> score 50.
    cpu_only = Demand(16_000, 0)
    ranking = rank(pinned(), cpu_only, nodes())
    scores = {p.node: p.score for p in ranking.placements}
    assert scores["rich"] == pytest.approx(50.0)
    assert scores["poor"] == 0.0
    assert ranking.placements[0].node == "rich"
    # FGD sees no fragmentation on either (one typical pod still fits both): a tie, left to node order
    fgd = {p.node: p.score for p in rank(make_policy_for("fgd", workload=PINNED), cpu_only, nodes()).placements}
    assert fgd["poor"] == fgd["rich"]


def test_cpu_heavy_gpu_pod_goes_to_the_cpu_rich_node() -> None:
    # One GPU and 20 cores. poor: after, 7000 milli-GPU and 76000 milli-CPU: S = 7000 - 76000/12 = 666.7,
    #   F = 0 (the typical pod still fits) -> C rises by 4 x 666.7 = 2666.7 -> score below 50.
    # rich: after, 1000 and 84000: S = max(0, 1000 - 7000) = 0, F = 0 -> score 50.
    heavy = Demand(20_000, 0, GpuRequest(GpuKind.WHOLE, 1))
    assert rank(pinned(), heavy, nodes()).placements[0].node == "rich"
    # One GPU and 2 cores strands nothing anywhere: poor after, 94000/12 = 7833 >= 7000 -> S = 0: both 50.
    light = Demand(2_000, 0, GpuRequest(GpuKind.WHOLE, 1))
    scores = {p.node: p.score for p in rank(pinned(), light, nodes()).placements}
    assert scores == {"poor": pytest.approx(50.0), "rich": pytest.approx(50.0)}


@pytest.mark.parametrize(
    ("fall", "points"),
    [
        (0.0, 50.0),  # no change of cost
        (10.0, 50.0),  # 50 + 50 tanh(0.005) = 50.25 -> 50: within half a point, a tie
        (30.0, 51.0),  # 50 + 50 tanh(0.015) = 50.75 -> 51
        (-30.0, 49.0),
        (2000.0, 88.0),  # 50 + 50 tanh(1) = 88.08
        (-1e9, 0.0),
        (1e9, 100.0),
    ],
)
def test_local_score_is_whole_points(fall: float, points: float) -> None:
    assert FgdCpu._scores(np.array([fall])).tolist() == [points]
    assert points == round(50 + 50 * math.tanh(fall / 2000))


def test_placements_within_half_a_point_tie() -> None:
    # r = 1/12, typical pod fits everywhere below (F = 0 throughout), so only S moves.
    # lean: 4 GPUs, 36 cores: S = 4000 - 3000 = 1000. A 48 milli-CPU pod leaves 35952: S = 4000 - 2996 = 1004
    #   -> C rises by 4 x 4 = 16 -> 50 + 50 tanh(-16 / 2000) = 49.6 -> 50.
    # roomy: 4 GPUs, 60 cores: S = 0 before and after -> 50. A tie (continuous scores: 49.6 against 50).
    # A 240 milli-CPU pod: lean S = 4000 - 35760/12 = 1020 -> C + 80 -> 48.0 -> 48; roomy 50.
    policy = pinned()
    lean = make_state(name="lean", gpus=4, mode="mps", cpu_milli=36_000)
    roomy = make_state(name="roomy", gpus=4, mode="mps", cpu_milli=60_000)
    tiny = {p.node: p.score for p in rank(policy, Demand(48, 0), [lean, roomy]).placements}
    assert tiny == {"lean": 50.0, "roomy": 50.0}
    small = {p.node: p.score for p in rank(policy, Demand(240, 0), [lean, roomy]).placements}
    assert small == {"lean": 48.0, "roomy": 50.0}


def test_workload_is_learned_online_and_bumps_the_version() -> None:
    policy = FgdCpu(FgdCpuOptions())
    assert policy.learned.version == 0
    for _ in range(3):
        policy.learned.observe(WHOLE_12_CORES)
    assert policy.learned.version == 0  # the first estimate comes at 4 pods
    policy.learned.observe(WHOLE_12_CORES)
    assert policy.learned.version == 1
    assert [d for d, _ in policy.fragmentation.workload.shapes] == [WHOLE_12_CORES]
    assert policy.learned.ratio == pytest.approx(1 / 12)


def test_online_workload_adopts_a_new_estimate_only_when_the_mix_moves() -> None:
    other = Demand(4_000, 0, GpuRequest(GpuKind.SHARE, 1, fraction_milli=500))
    online = OnlineWorkload(PINNED)
    # a steady stream: the first estimate (at 4 pods) is adopted, the later ones equal it
    assert [n for n in range(1, 3000) if online.observe(WHOLE_12_CORES)] == [4]
    # estimates at 4, 6, 9, 13, 19, 28, 42, 63, 94, 141, 211, 316, 474, 711, 1066, 1599, 2398, 3597, ...
    # (x 1.5, rounded down). The mix moves: 2999 of one shape, then another: at 3597 pods, 598 are
    # the new shape (16.6%; the old one alone covers 83.4% < 95%, so both are typical): adopted
    adopted = [n for n in range(3000, 4100) if online.observe(other)]
    assert adopted == [3597]
    shares = dict(online.workload.shapes)
    assert shares[Demand(4_000, 0, other.gpu)] == pytest.approx(598 / 3597)


@pytest.mark.parametrize(("first", "growth"), [(0, 1.5), (4, 1.0)])
def test_online_workload_refuses_a_schedule_that_never_moves(first: int, growth: float) -> None:
    with pytest.raises(ValueError, match="first >= 1 and growth > 1"):
        OnlineWorkload(PINNED, first=first, growth=growth)


def test_simulator_does_not_hand_fgd_cpu_the_whole_trace_workload() -> None:
    # FGD is given the trace's typical pods (the paper's protocol); fgd-cpu must learn its own.
    from scheduler.core.fragmentation import DEFAULT_WORKLOAD
    from scheduler.sim.engine import build_policy

    trace_wide = TypicalWorkload(((Demand(4_000, 0, GpuRequest(GpuKind.SHARE, 1, fraction_milli=470)), 1.0),))
    fgd = build_policy("fgd", 42, trace_wide)
    assert fgd.fragmentation.workload is trace_wide  # type: ignore[attr-defined]
    policy = build_policy("fgd-cpu", 42, trace_wide)
    assert isinstance(policy, FgdCpu)
    assert policy.learned.online is not None and policy.learned.online.workload is DEFAULT_WORKLOAD
    assert policy.fragmentation.workload is DEFAULT_WORKLOAD


@pytest.mark.parametrize("used_cpu", [0, 30_000, 76_000, 83_000, 84_000, 90_000, 95_000])
def test_cost_after_a_pod_without_gpus_is_worked_out_in_full(used_cpu: int) -> None:
    """A pod without GPUs keeps F unless its CPU moves the node's CPU level: C after must be what
    the full question answers (F after the placement plus the stranding), at and across the
    levels of the workload's CPU requests (12 and 20 cores: 96 - 84 = 12 sits on an edge)."""
    policy = FgdCpu(FgdCpuOptions((*PINNED_SHAPES, Shape(1.0, cpu=20, gpu_count="2")), learn=False))
    base = make_state(name="n", gpus=8, mode="mps", cpu_milli=96_000)
    state = NodeState(base.node, base.usage, used_cpu)
    frag = policy.fragmentation
    gpu_free = sum(free for free, _ in frag.profiles(state))

    def stranded(cpu_free: int) -> float:  # S_n by hand: the GPU the typical mix could not use
        return max(0.0, gpu_free - policy.learned.ratio * cpu_free)

    assert policy.learned.ratio > 0
    levels = set()
    for cpu_request in range(0, state.cpu_free + 1, 1_000):
        found = fit(Demand(cpu_request, 0, GpuRequest(GpuKind.NONE, 0)), state)
        assert found, found.reason
        before, after = policy._costs(state, found.allocations[0])
        cpu_after = state.cpu_free - cpu_request
        levels.add(frag.cpu_level(cpu_after))
        assert after == frag.frag(frag.profiles(state), cpu_after) + policy.stranding_weight * stranded(cpu_after)
        assert before == frag.node_frag(state) + policy.stranding_weight * stranded(state.cpu_free)
    assert len(levels) == 1 + sum(state.cpu_free >= c for c in (12_000, 20_000))  # the edges were crossed


def test_costs_kept_for_a_placement_follow_a_new_estimate() -> None:
    """The costs kept per placement (the score and the tiebreak ask one after the other) are
    thrown away when the workload is estimated again: the same state and allocation, scored
    after the policy has learned another mix, score as a fresh policy that learned it."""
    half = Demand(4_000, 0, GpuRequest(GpuKind.SHARE, 1, fraction_milli=500))
    state = make_state(name="n", gpus=2, mode="mps", cpu_milli=96_000)
    state = state.apply(
        "a", fit(Demand(1_000, 0, GpuRequest(GpuKind.SHARE, 1, fraction_milli=300)), state).allocations[0]
    )
    alloc = fit(Demand(1_000, 0, GpuRequest(GpuKind.SHARE, 1, fraction_milli=400)), state).allocations[1]
    learner, fresh = FgdCpu(FgdCpuOptions(PINNED_SHAPES)), FgdCpu(FgdCpuOptions(PINNED_SHAPES))
    first = learner._costs(state, alloc)
    for policy in (learner, fresh):
        for _ in range(4):
            policy.learned.observe(half)  # the first estimate: every pod asks for half a GPU
    assert learner.learned.version == fresh.learned.version == 1
    again = learner._costs(state, alloc)
    assert again == fresh._costs(state, alloc)
    assert again != first  # the new mix prices the placement otherwise


def test_scores_at_once_take_the_tiebreak_among_equal_scores() -> None:
    # Two MPS GPUs, one a tenth used, one three tenths; typical pods of a tenth (99%) and of
    # three quarters (1%), which the second GPU cannot host. A tenth placed on either scores 50
    # points, but on the second it leaves the lower cost (F 6 against 7 milli-GPU): the
    # tiebreak picks it (gap move 70 -> 60), and score_nodes must pick what one by one picks.
    state = make_state(name="n", gpus=2, mode="mps")
    for k, (index, milli) in enumerate([(0, 100), (1, 300)]):
        alloc = next(a for a in fit(share(milli), state).allocations if a.shares[0].index == index)
        state = state.apply(f"p{k}", alloc)
    policy = FgdCpu(FgdCpuOptions((Shape(99.0, gpu_fraction="0.1"), Shape(1.0, gpu_fraction="0.75")), learn=False))
    demand = share(100)
    allocs = firsts(state, fit(demand, state).allocations)
    scores = [policy.score(demand, state, a) for a in allocs]
    costs = [policy.tiebreak(demand, state, a) for a in allocs]
    assert len(allocs) == 2 and scores[0] == scores[1] and costs[0] != costs[1]  # the case is a tie
    expected = score_firsts(policy, demand, state, allocs)
    values, moves = policy.score_nodes(demand, share_candidates([(state, allocs)]))
    assert (values.tolist(), moves.tolist()) == ([expected.score], [list(expected.move)])
    assert expected.move == (70, 60)


def share(milli: int) -> Demand:
    return Demand(0, 0, GpuRequest(GpuKind.SHARE, 1, fraction_milli=milli))


def test_a_pod_without_gpus_is_scored_on_many_nodes_at_once_as_one_by_one() -> None:
    # Typical pods: one GPU with no CPU, one GPU with 8 cores (half each); stranding off, so F
    # alone moves. tight (10 cores free, 2 idle GPUs): both typical pods fit, F = 0; a 4-core pod
    # leaves 6 cores, the 8-core pod no longer fits, and each idle GPU becomes a fragment for
    # it: F = 2 x 1000 x (1 - 0.5) = 1000, score = round(50 + 50 tanh(-1000 / 2000)) = 27.
    # roomy (96 cores): the CPU level stays, F stays: 50.
    shapes = (Shape(1.0, cpu=0, gpu_count="1"), Shape(1.0, cpu=8, gpu_count="1"))
    policy = FgdCpu(FgdCpuOptions(shapes, stranding_weight=0.0, learn=False))
    states = [
        make_state(name="tight", gpus=2, mode="mps", cpu_milli=10_000),
        make_state(name="roomy", gpus=2, mode="mps", cpu_milli=96_000),
    ]
    cpu_only = Demand(4_000, 0)
    labels = np.array([[1, 1], [2, 2]])  # each node's two idle GPUs alike
    at_once = policy.score_without_gpu(cpu_only, states, labels)
    assert at_once == [27.0, 50.0]
    one_by_one = [policy.score(cpu_only, s, fit(cpu_only, s).allocations[0]) for s in states]
    assert at_once == one_by_one
    # with stranding (r = 1 GPU per 4 cores): tight strands max(0, 2000 - 10000/4) = 0 before
    # and max(0, 2000 - 6000/4) = 500 after: C rises by 1000 + 4 x 500 = 3000 -> round(50 + 50
    # tanh(-1.5)) = 5; roomy strands nothing either way: 50
    stranding = FgdCpu(FgdCpuOptions(shapes, learn=False))
    assert stranding.score_without_gpu(cpu_only, states, labels) == [5.0, 50.0]
    assert [stranding.score(cpu_only, s, fit(cpu_only, s).allocations[0]) for s in states] == [5.0, 50.0]


def test_the_board_scores_shares_on_shared_gpus_at_once_as_one_by_one_with_stranding() -> None:
    """Through the board, a share on MPS and time-slicing GPUs in many states: the candidates
    as arrays (the after-states and the share's milli-GPU given as rows) score as one by one,
    with stranding in play (nodes short of CPU strand GPU: what the share takes counts)."""
    shapes = (Shape(1.0, cpu=4, gpu_fraction="0.25"), Shape(1.0, cpu=16, gpu_count="1"))
    policy = FgdCpu(FgdCpuOptions(shapes, learn=False))
    no_stranding = FgdCpu(FgdCpuOptions(shapes, stranding_weight=0.0, learn=False))
    states = []
    for k in range(8):
        mode = "mps" if k % 2 else "time-slicing"
        state = make_state(name=f"n{k}", gpus=4, mode=mode, cpu_milli=(6 + 3 * k) * 1000)
        for j in range(k % 4 + k // 4):  # 0 to 4 quarter or half GPUs already placed
            taken = Demand(500, 0, GpuRequest(GpuKind.SHARE, 1, fraction_milli=250 * (1 + j % 2)))
            state = state.apply(f"p{k}-{j}", fit(taken, state).allocations[0])
        states.append(state)
    demand = Demand(2_000, 0, GpuRequest(GpuKind.SHARE, 1, fraction_milli=600))

    def scores(chosen: FgdCpu, at_once_from: int) -> list[float]:
        with patch.object(nodescores, "_AT_ONCE_FROM", at_once_from):
            return list(Board(states).scores(chosen, demand).tolist())

    at_once = scores(policy, 1)
    assert at_once == scores(policy, 10**9)  # one by one: prepare, then score per candidate
    assert len(set(at_once)) > 2 and at_once != scores(no_stranding, 1)  # stranding moves them
