"""The FGD paper's six policies as core policies: scores and GPU choices derived by hand.

Nodes are openb-style: MPS GPUs whose shares are fractions (memory follows compute).
Normalisers: 128000 milli-CPU and 8000 milli-GPU (the authors' MaxSpecCpu/MaxSpecGpu).
"""

from __future__ import annotations

import random

import pytest

from scheduler.core import devstates, nodescores
from scheduler.core.board import Board, Status
from scheduler.core.fit import fit
from scheduler.core.fragmentation import Fragmentation, TypicalWorkload
from scheduler.core.policies import make_policy
from scheduler.core.policies.fgd import sigmoid_score
from scheduler.core.request import Demand, GpuKind, GpuRequest
from scheduler.core.select import evaluate, rank
from scheduler.core.state import NodeState
from tests.builders import make_policy_for, make_state


def share(milli: int, cpu: int = 0) -> Demand:
    return Demand(cpu, 0, GpuRequest(GpuKind.SHARE, 1, fraction_milli=milli))


def whole(count: int, cpu: int = 0) -> Demand:
    return Demand(cpu, 0, GpuRequest(GpuKind.WHOLE, count))


def cpu_only(cpu: int) -> Demand:
    return Demand(cpu, 0, GpuRequest())


def mps(name: str, gpus: int, cpu_milli: int = 64_000, used: tuple[int, ...] = ()) -> NodeState:
    """An MPS node with ``used[g]`` milli-GPU already taken on GPU g (one pod each)."""
    state = make_state(name=name, gpus=gpus, mode="mps", model="V100-16GB", cpu_milli=cpu_milli)
    for g, milli in enumerate(used):
        if milli:
            options = fit(share(milli), state).allocations
            state = state.apply(f"{name}-u{g}", next(a for a in options if a.shares[0].index == g))
    return state


def score_of(policy_name: str, demand: Demand, state: NodeState, **options: object) -> tuple[float, list[int]]:
    result = evaluate(make_policy_for(policy_name, **options), demand, state)
    assert not isinstance(result, str), result
    return result.score, [s.index for s in result.allocation.shares]


# ---------------------------------------------------------------- DotProd


@pytest.mark.parametrize(
    ("demand", "state", "expected"),
    [
        # v_node = (64000/128000, 2000/8000) = (0.5, 0.25); v_pod = (32000/128000, 1000/8000) = (0.25, 0.125)
        # dot = 0.125 + 0.03125 = 0.15625; 100 * (1 - 0.15625 / 2) = 92.19 -> 92
        (whole(1, cpu=32_000), mps("a", 2), 92.0),
        # v_node = (0.5, 8000/8000 = 1); v_pod = (0.25, 0.125): dot = 0.125 + 0.125 = 0.25 -> 100 * 0.875 = 87.5 -> 87
        (whole(1, cpu=32_000), mps("b", 8), 87.0),
        # a CPU-only pod sees only CPU: v_pod = (16000/128000 = 0.125, 0); dot = 0.5 * 0.125 = 0.0625
        # 100 * (1 - 0.03125) = 96.875 -> 96
        (cpu_only(16_000), mps("c", 8), 96.0),
    ],
)
def test_dotprod_scores(demand: Demand, state: NodeState, expected: float) -> None:
    assert score_of("dotprod", demand, state)[0] == expected


def test_dotprod_takes_the_tightest_gpu() -> None:
    # free 700 / 400 / 1000: a 0.3 pod fits all three; the tightest is GPU 1 (400 free)
    _, gpus = score_of("dotprod", share(300), mps("a", 3, used=(300, 600, 0)))
    assert gpus == [1]


# ---------------------------------------------------------------- GpuClustering


def test_gpuclustering_prefers_nodes_of_its_own_tag() -> None:
    only_share = mps("only-share", 2, used=(500, 0))  # hosts one share pod; left 1500
    mixed = mps("mixed", 4, used=(500,))  # a share pod ...
    mixed = mixed.apply("w", fit(whole(1), mixed).allocations[0])  # ... and a 1-gpu pod; left 2500
    other = make_state(name="other", gpus=2, mode="mps", model="V100-16GB")
    other = other.apply("w", fit(whole(1), other).allocations[0])  # only 1-gpu; left 1000
    idle = mps("idle", 8)  # left 8000
    # base = trunc(25 * (8000 - left) / 8000):
    # only-share: 25 * 6500 / 8000 = 20.3 -> 20, + 75 (only this tag) = 95
    assert score_of("gpuclustering", share(200), only_share)[0] == 95.0
    # mixed: 25 * 5500 / 8000 = 17.2 -> 17, + 50 (this tag among others) = 67
    assert score_of("gpuclustering", share(200), mixed)[0] == 67.0
    # idle: 25 * 0 / 8000 = 0, + 25 (no tagged pod) = 25
    assert score_of("gpuclustering", share(200), idle)[0] == 25.0
    # other: 25 * 7000 / 8000 = 21.9 -> 21, + 0 (only other tags) = 21
    assert score_of("gpuclustering", share(200), other)[0] == 21.0
    # a 1-gpu pod on "other" is at home: 21 + 75 = 96; a CPU-only pod scores 0 everywhere
    assert score_of("gpuclustering", whole(1), other)[0] == 96.0
    assert score_of("gpuclustering", cpu_only(1000), only_share)[0] == 0.0


# ---------------------------------------------------------------- GpuPacking


def test_gpupacking_fills_shared_gpus_then_used_nodes_then_idle_ones() -> None:
    # idle 8-GPU node: max(33 - 8, 8) = 25; idle 2-GPU node: max(33 - 2, 2) = 31
    assert score_of("gpupacking", share(200), mps("idle8", 8))[0] == 25.0
    assert score_of("gpupacking", share(200), mps("idle2", 2))[0] == 31.0
    # used node, the 0.5 pod fits on the shared GPU 0 (600 free): 100 - (600 * 100 // 1000) // 10 = 100 - 6 = 94
    assert score_of("gpupacking", share(500), mps("a", 2, used=(400, 0))) == (94.0, [0])
    # the 0.7 pod does not fit on GPU 0 (600 free): it takes one fully free GPU: max(50 - 1, 33) = 49
    assert score_of("gpupacking", share(700), mps("b", 2, used=(400, 0))) == (49.0, [1])
    # a 2-GPU pod on a used 4-GPU node takes two free GPUs: max(50 - 2, 33) = 48
    assert score_of("gpupacking", whole(2), mps("c", 4, used=(400,)))[0] == 48.0
    # CPU-only pods: 0
    assert score_of("gpupacking", cpu_only(1000), mps("d", 2, used=(400,)))[0] == 0.0


# ---------------------------------------------------------------- BestFit


def test_bestfit_raw_scores() -> None:
    # cpu left after (64000 - 16000) / 128000 = 0.375; gpu left after (2000 - 500) / 8000 = 0.1875
    # 100 * (1 - (0.5 * 0.375 + 0.5 * 0.1875)) = 71.875 -> 71
    assert score_of("bestfit", share(500, cpu=16_000), mps("a", 2))[0] == 71.0


# ---------------------------------------------------------------- FGD: GPU choice as the authors'


def test_fgd_takes_the_first_gpu_of_the_best_integer_score() -> None:
    """Typical workload: 0.5-GPU pods (p = 0.9) and 0.65-GPU pods (p = 0.1).

    Node: GPU 0 has 700 free, GPU 1 has 660 free; both host both shapes, so F_before = 0.
    A 0.1 pod on GPU 0 leaves 600: it loses the 0.65 shape, F = 600 * 0.1 = 60,
    score floor(100 * sigmoid(-0.060)) = floor(48.50) = 48. On GPU 1 it leaves 560:
    F = 56, floor(100 * sigmoid(-0.056)) = floor(48.60) = 48. Equal integer scores: the
    authors take the first GPU (0), although GPU 1 grows F less.
    """
    workload = TypicalWorkload(((share(500), 0.9), (share(650), 0.1)))
    state = mps("n", 2, used=(300, 340))
    frag = Fragmentation(workload)
    assert frag.node_frag(state) == 0
    options = {a.shares[0].index: a for a in fit(share(100), state).allocations}
    assert frag.frag_after(state, options[0]) == pytest.approx(60)
    assert frag.frag_after(state, options[1]) == pytest.approx(56)
    assert sigmoid_score(-60) == sigmoid_score(-56) == 48
    assert score_of("fgd", share(100), state, workload=workload) == (48.0, [0])


def test_fgd_sigmoid_score_matches_the_go_arithmetic() -> None:
    # int64(sigmoid(x) * 100): 0 -> 50; a large gain saturates at 100, a large loss at 0
    assert sigmoid_score(0) == 50
    assert sigmoid_score(10_000_000) == 100
    assert sigmoid_score(-10_000_000) == 0
    # sigmoid(1) = 0.7311 -> 73
    assert sigmoid_score(1000) == 73


# ---------------------------------------------------------------- Random


def random_cluster() -> list[NodeState]:
    """Five nodes; a 0.7 pod fits on a, c and e only (b's GPU has 400 free, d lacks CPU)."""
    return [
        mps("a", 1),
        mps("b", 1, used=(600,)),
        mps("c", 2, used=(600, 0)),
        mps("d", 1, cpu_milli=500),
        mps("e", 4),
    ]


def fitting(board: Board, demand: Demand) -> list[str]:
    names = board.names()
    everyone = board.everyone()
    return [names[p] for p in everyone[board.filter(make_policy("binpack"), demand, everyone).fits()].tolist()]


def test_random_draws_uniformly_among_feasible_nodes_and_repeats_with_its_seed() -> None:
    demand = share(700, cpu=1000)
    board = Board(random_cluster(), {n: i for i, n in enumerate("abcde")})
    assert fitting(board, demand) == ["a", "c", "e"]
    picks = [board.best(make_policy_for("random", seed=7), demand) for _ in range(1)]
    policy = make_policy_for("random", seed=7)
    seen = [choice.node for _ in range(900) if (choice := board.best(policy, demand)) is not None]
    assert len(seen) == 900 and set(seen) == {"a", "c", "e"}
    assert min(seen.count(n) for n in "ace") > 240  # 300 expected each; 240 is > 4 sd away
    again = make_policy_for("random", seed=7)
    assert [board.best(again, demand).node for _ in range(50)] == seen[:50]  # type: ignore[union-attr]
    assert picks[0] is not None and picks[0].node == seen[0]
    # inside the node, a uniform draw among the GPUs that fit: e has 4 idle GPUs
    on_e = {
        p.allocation.shares[0].index
        for _ in range(200)
        if (p := evaluate(policy, demand, random_cluster()[4])) and not isinstance(p, str)
    }
    assert on_e == {0, 1, 2, 3}


def test_random_plain_path_has_the_same_support() -> None:
    """rank() (the per-node answer) picks from the same feasible set."""
    from scheduler.core.select import best

    demand = share(700, cpu=1000)
    policy = make_policy_for("random", seed=3)
    states = random_cluster()
    winners = {p.node for _ in range(200) if (p := best(policy, demand, states)) is not None}
    assert winners == {"a", "c", "e"}


def test_board_feasibility_follows_node_changes() -> None:
    demand = share(700, cpu=1000)
    board = Board(random_cluster())
    assert fitting(board, demand) == ["a", "c", "e"]
    a = board.get("a")
    assert a is not None
    board.put(a.apply("x", fit(demand, a).allocations[0]))
    assert fitting(board, demand) == ["c", "e"]


# ---------------------------------------------------------------- the board equals the plain answers


@pytest.mark.parametrize(("slack", "at_once_from"), [(4096, 32), (0, 32), (4096, 1)])
def test_board_feasibility_and_scores_equal_plain_fit_and_rank(
    slack: int, at_once_from: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random clusters and pods, applied and released at random: the board's outcomes equal
    ``fit`` node by node (its reason too), and its scores (kept per node stamp, shared between
    nodes in the same state) equal the plain ranking of every node, for every policy; also when
    the board numbers its signatures and device states again and again, and when it asks the
    policies that can score many nodes at once (``score_nodes``, ``score_without_gpu``) to do
    so however few the nodes (and the board to ask why GPU states refuse over arrays however
    few they are)."""
    from scheduler.core.policies import REGISTRY

    rng = random.Random(11)
    models = ("V100-16GB", "T4", "A100-80GB")
    states = [
        make_state(
            name=f"n{i}",
            gpus=rng.choice((1, 2, 4, 8)),
            mode=rng.choice(("mps", "time-slicing", "exclusive", "mig")),
            model=rng.choice(models),
            cpu_milli=rng.choice((8000, 32_000, 96_000)),
            memory_mib=rng.choice((16_000, 256_000)),
            max_pods=rng.choice((3, 110)),
            device_options={"replicas": 4} if rng.random() < 0.5 else None,
        )
        for i in range(12)
    ]
    demands = [
        Demand(
            rng.choice((0, 1000, 16_000, 40_000)),
            rng.choice((0, 1024, 64_000)),
            rng.choice(
                (
                    GpuRequest(),
                    GpuRequest(GpuKind.SHARE, 1, fraction_milli=rng.choice((100, 250, 500, 810))),
                    GpuRequest(GpuKind.WHOLE, rng.choice((1, 2, 4))),
                    GpuRequest(GpuKind.SHARE, 1, memory_mib=8000),
                    GpuRequest(GpuKind.SHARE, 1, fraction_milli=500, models=("T4",)),
                )
            ),
        )
        for _ in range(25)
    ]
    policies = [make_policy(n) for n in sorted(REGISTRY) if n != "random"]
    order = {s.node.name: i for i, s in enumerate(states)}
    board = Board(states, order)
    board._columns.id_slack = slack  # 0: signatures and device states numbered again at (nearly) every change
    placed: list[tuple[str, str]] = []
    monkeypatch.setattr(nodescores, "_AT_ONCE_FROM", at_once_from)
    monkeypatch.setattr(devstates, "_ARRAYS_FROM", at_once_from)  # refusals over arrays from one state too
    for step in range(150):
        demand = rng.choice(demands)
        policy = rng.choice(policies)
        outcomes = board.filter(policy, demand)
        found = [fit(demand, s) for s in board.states]
        assert outcomes.fits().tolist() == [bool(f) for f in found]
        for state, status, reason, f in zip(board.states, outcomes.status, outcomes.reason, found, strict=True):
            if f:
                continue
            empty = fit(demand, NodeState.empty(state.node))
            assert status == (Status.UNSCHEDULABLE if empty else Status.UNRESOLVABLE)
            assert outcomes.texts[reason] == (f.reason if empty else empty.reason)
        ranking = {p.node: p.score for p in rank(policy, demand, list(board.states), order).placements}
        expected = [ranking.get(s.node.name, -float("inf")) for s in board.states]
        assert board.scores(policy, demand).tolist() == pytest.approx(expected)
        if any(found) and rng.random() < 0.7:
            choice = board.best(policy, demand)
            assert choice is not None
            state = board.get(choice.node)
            assert state is not None
            board.put(state.apply(f"p{step}", choice.allocation))
            placed.append((f"p{step}", choice.node))
        elif placed:
            pod, node = placed.pop(rng.randrange(len(placed)))
            state = board.get(node)
            assert state is not None
            board.put(state.release(pod))
