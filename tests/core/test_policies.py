"""Policies: each expected score derived in a comment."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from scheduler.core import devstates
from scheduler.core.board import Board, Status
from scheduler.core.devstates import DeviceStates, Hosting
from scheduler.core.fit import device_share, fit, hosts
from scheduler.core.fragmentation import TypicalWorkload
from scheduler.core.inventory import Node, SharingMode
from scheduler.core.nodescores import share_on
from scheduler.core.policies import REGISTRY, make_policy
from scheduler.core.request import Demand, GpuKind, GpuRequest
from scheduler.core.select import evaluate, rank
from scheduler.core.state import NodeState
from tests.builders import make_device, make_policy_for, make_state


def share(milli: int) -> Demand:
    return Demand(0, 0, GpuRequest(GpuKind.SHARE, 1, fraction_milli=milli))


HALF_GPU_WORKLOAD = TypicalWorkload(((share(500), 1.0),))


def two_nodes() -> list[NodeState]:
    """a: 2 empty GPUs; b: 1 GPU with 0.6 used (0.4 free: a fragment for 0.5-GPU pods)."""
    a = make_state(name="a", gpus=2, mode="mps")
    b = make_state(name="b", gpus=1, mode="mps")
    b = b.apply("x", fit(share(600), b).allocations[0])
    return [a, b]


def scores(policy_name: str, demand: Demand, states: list[NodeState], **options: object) -> dict[str, float]:
    policy = make_policy_for(policy_name, **options)
    ranking = rank(policy, demand, states)
    return {p.node: p.score for p in ranking.placements}


def test_binpack_and_spread() -> None:
    # a: (300 used) / 2000 = 15%; b: (600 + 300) / 1000 = 90%
    assert scores("binpack", share(300), two_nodes()) == {"a": 15, "b": 90}
    assert scores("spread", share(300), two_nodes()) == {"a": 85, "b": 10}


def test_bestfit_paper_formula_then_min_max() -> None:
    # raw = floor(100 (1 - (0.5 cpu_left/128000 + 0.5 gpu_left/8000))), cpu_left = 64000 on both
    # a: 1 - (0.25 + 0.5 x 1700/8000 = 0.10625) = 0.64375 -> 64
    # b: 1 - (0.25 + 0.5 x 100/8000 = 0.00625) = 0.74375 -> 74
    policy = make_policy("bestfit")
    a, b = two_nodes()
    assert policy.score(share(300), a, fit(share(300), a).allocations[0]) == 64
    assert policy.score(share(300), b, fit(share(300), b).allocations[0]) == 74
    # min-max over the candidates: 64 -> 0, 74 -> 100
    assert scores("bestfit", share(300), two_nodes()) == {"a": 0, "b": 100}


def test_fgd_fills_the_fragment() -> None:
    # typical pod: 0.5 GPU. a: both GPUs host it, F = 0; after 0.3 on either, 0.7 free still hosts it: F = 0,
    #   score = floor(100 sigmoid(0)) = 50.
    # b: 0.4 free cannot host 0.5: F = 400; after 0.3, 0.1 free: F = 100;
    #   score = floor(100 sigmoid(300 / 1000)) = floor(57.44) = 57.
    assert scores("fgd", share(300), two_nodes(), workload=HALF_GPU_WORKLOAD) == {"a": 50, "b": 57}


def test_fgd_picks_the_gpu_that_fragments_least() -> None:
    # GPUs free: [1000, 700]. A 0.3 pod on GPU 0 leaves 700 and 700 -> F = 0 (both host 0.5);
    # on GPU 1 it leaves 1000 and 400 -> F = 400. GPU 0 wins although GPU 1 is tighter.
    state = make_state(gpus=2, mode="mps")
    state = state.apply("x", fit(share(300), state).allocations[1])
    placement = evaluate(make_policy_for("fgd", workload=HALF_GPU_WORKLOAD), share(300), state)
    assert not isinstance(placement, str)
    assert placement.allocation.shares[0].index == 0
    # the others take the tightest GPU (least free after): GPU 1
    tight = evaluate(make_policy("binpack"), share(300), state)
    assert not isinstance(tight, str) and tight.allocation.shares[0].index == 1


def test_random_is_seeded_and_roughly_uniform() -> None:
    states = [make_state(name=f"n{i}", gpus=1, mode="mps") for i in range(4)]
    counts = {s.node.name: 0 for s in states}
    board = Board(states)
    policy = make_policy_for("random", seed=7)
    picks = []
    for _ in range(4000):
        placement = board.best(policy, share(10))
        assert placement is not None
        counts[placement.node] += 1
        picks.append(placement.node)
    assert min(counts.values()) > 850  # 1000 expected each; 850 is > 5 sd away
    again = Board(states)
    policy_again = make_policy_for("random", seed=7)
    assert [again.best(policy_again, share(10)).node for _ in range(50)] == picks[:50]  # type: ignore[union-attr]


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_scores_are_in_range_and_deterministic(name: str) -> None:
    for demand in (share(300), Demand(1000, 0, GpuRequest(GpuKind.WHOLE, 1)), Demand(1000, 1024)):
        first = scores(name, demand, two_nodes(), **({"seed": 1} if name == "random" else {}))
        again = scores(name, demand, two_nodes(), **({"seed": 1} if name == "random" else {}))
        assert first == again
        assert all(0 <= s <= 100 for s in first.values())


def test_unknown_policy_names_the_accepted_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown policy 'tetris'; accepted: .*binpack.*fgd"):
        make_policy("tetris")


def test_board_best_equals_a_full_rank_after_changes() -> None:
    states = [make_state(name=f"n{i}", gpus=2, mode="mps") for i in range(5)]
    board = Board(states, order={f"n{i}": 4 - i for i in range(5)})
    policy = make_policy_for("fgd", workload=HALF_GPU_WORKLOAD)
    for k, milli in enumerate([300, 200, 700, 500, 300, 100, 800, 400]):
        demand = share(milli)
        expected = rank(policy, demand, list(board.states), order={f"n{i}": 4 - i for i in range(5)})
        got = board.best(policy, demand)
        assert got is not None and got == expected.placements[0]
        board.put(board.get(got.node).apply(f"p{k}", got.allocation))  # type: ignore[union-attr]


class Counting:
    """binpack, counting the placements it scores per node."""

    name = "counting"

    def __init__(self) -> None:
        self.inner = make_policy("binpack")
        self.calls: dict[str, int] = {}

    def score(self, demand: Demand, state: NodeState, allocation: object) -> float:
        self.calls[state.node.name] = self.calls.get(state.node.name, 0) + 1
        return self.inner.score(demand, state, allocation)  # type: ignore[arg-type]


def test_board_works_out_again_only_the_nodes_that_changed() -> None:
    # Five nodes, each in its own state (n_i holds i shares), so none shares work with another.
    states = []
    for i in range(5):
        state = make_state(name=f"n{i}", gpus=1, mode="mps")
        for k in range(i):
            state = state.apply(f"x{i}-{k}", fit(share(100), state).allocations[0])
        states.append(state)
    board = Board(states)
    policy = Counting()
    first = board.scores(policy, share(50)).tolist()
    # binpack: (i x 100 + 50) used of 1000 -> 5, 15, 25, 35, 45
    assert first == [5.0, 15.0, 25.0, 35.0, 45.0]
    assert policy.calls == {f"n{i}": 1 for i in range(5)}
    assert board.scores(policy, share(50)).tolist() == first and sum(policy.calls.values()) == 5
    # one node changes: only it is scored again, and only where asked
    n2 = board.get("n2")
    assert n2 is not None
    board.put(n2.apply("new", fit(share(50), n2).allocations[0]))
    board.scores(policy, share(50), board.positions(["n0", "n1"]))
    assert sum(policy.calls.values()) == 5
    again = board.scores(policy, share(50)).tolist()
    assert policy.calls["n2"] == 2 and sum(policy.calls.values()) == 6
    assert again == [5.0, 15.0, 30.0, 35.0, 45.0]  # n2: 250 + 50 used -> 30
    # a node put in the state another node is in shares that node's work
    n0 = board.get("n0")
    assert n0 is not None
    board.put(n0.apply("a", fit(share(100), n0).allocations[0]))  # now like n1: one share of 100
    assert board.scores(policy, share(50)).tolist()[0] == 15.0 and policy.calls["n0"] == 1


def test_the_selectors_rule_out_gpus_that_have_room() -> None:
    # One node: an MPS H100 that is full (4 clients of 4) beside a free time-slicing L4, and a
    # time-slicing H100 that is full beside it. The board asks every MPS and time-slicing GPU
    # state at once; the pod's sharing and model selectors must still rule GPUs out there.
    devices = (
        make_device(0, "H100-80GB", "mps", uuid="a", mps_client_limit=4),
        make_device(1, "L4", "time-slicing", uuid="b", replicas=4),
        make_device(2, "H100-80GB", "time-slicing", uuid="c", replicas=1),
    )
    state = NodeState.empty(Node("n", 64_000, 512_000, devices))
    on_c = replace(share(100).gpu, sharing=frozenset({SharingMode.TIME_SLICING}), models=("H100-80GB",))
    for k, gpu in enumerate([share(100).gpu] * 4 + [on_c]):
        state = state.apply(f"p{k}", fit(Demand(0, 0, gpu), state).allocations[0])
    assert [u.shares for u in state.usage] == [4, 0, 1]
    board = Board([state])
    policy = make_policy("binpack")
    mps_only = replace(share(100).gpu, sharing=frozenset({SharingMode.MPS}))
    h100_only = replace(share(100).gpu, models=("H100-80GB",))
    for gpu in (mps_only, h100_only):
        outcomes = board.filter(policy, Demand(0, 0, gpu))
        assert outcomes.status.tolist() == [Status.UNSCHEDULABLE], gpu
        assert outcomes.texts[outcomes.reason[0]] == fit(Demand(0, 0, gpu), state).reason
    assert board.filter(policy, share(100)).status.tolist() == [Status.FITS]  # the L4 has room


def test_nodes_that_could_not_host_the_pod_even_empty_are_not_asked_about_their_gpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Three kinds of node: H100 MPS, L4 time-slicing, H100 exclusive, each in its own state.
    states = [
        make_state(name="mps", gpus=2, mode="mps"),
        make_state(name="ts", gpus=2, model="L4", mode="time-slicing", device_options={"replicas": 4}),
        make_state(name="ex", gpus=2),
    ]
    states[0] = states[0].apply("x", fit(share(300), states[0]).allocations[0])
    board = Board(states)
    asked: list[str] = []
    real = DeviceStates.hosted

    def counting(self: DeviceStates, gpu: GpuRequest, rows: np.ndarray) -> Hosting:
        # the nodes whose GPU states are asked about (one by one or all at once)
        asked.extend(self.entry(i)[0].name for i in np.unique(rows).tolist() if i)
        return real(self, gpu, rows)

    monkeypatch.setattr(DeviceStates, "hosted", counting)
    policy = make_policy("binpack")
    # 16 GPUs: more than any node has; 100 GiB on one GPU: more than any GPU has; an A30: none here
    for gpu in (
        GpuRequest(GpuKind.WHOLE, 16),
        GpuRequest(GpuKind.SHARE, 1, memory_mib=100 * 1024),
        GpuRequest(GpuKind.WHOLE, 1, models=("A30",)),
    ):
        outcomes = board.filter(policy, Demand(0, 0, gpu))
        assert outcomes.status.tolist() == [Status.UNRESOLVABLE] * 3
        assert asked == []
    # part of a GPU: the exclusive node could not host it even empty (its reason says why), and
    # only the other two nodes' GPU states are asked about
    outcomes = board.filter(policy, share(250))
    assert outcomes.status.tolist() == [Status.FITS, Status.FITS, Status.UNRESOLVABLE]
    assert outcomes.texts[outcomes.reason[2]].startswith("GPU 0 is exclusive")
    assert sorted(set(asked)) == ["mps", "ts"]


@pytest.mark.parametrize("name", ["binpack", "bestfit"])
def test_a_node_is_scored_by_the_share_that_takes_the_most(name: str) -> None:
    # 10 GiB is an eighth of an A100-80GB's memory and more than two fifths of an L4's: the L4's
    # share takes more of its GPU, so the node scores as that placement (what evaluate picks).
    node = Node("mixed", 64_000, 512_000, (make_device(0, "A100-80GB", "mps"), make_device(1, "L4", "mps")))
    state = NodeState.empty(node)
    demand = Demand(1000, 0, GpuRequest(GpuKind.SHARE, 1, memory_mib=10 * 1024))
    policy = make_policy(name)
    placed = evaluate(policy, demand, state)
    assert not isinstance(placed, str) and placed.allocation.shares[0].index == 1
    on_the_a100 = fit(demand, state).allocations[0]
    assert on_the_a100.shares[0].index == 0 and policy.score(demand, state, on_the_a100) < placed.score
    # the board scores every node at once (score_took); one node normalises to its own score
    assert Board([state]).scores(policy, demand).tolist() == [placed.score]


@pytest.mark.parametrize("mode", ["exclusive", "mps", "time-slicing"])
def test_the_share_of_a_whole_gpu_the_board_places_is_the_one_fit_gives(mode: str) -> None:
    """The board builds the share a whole GPU takes without asking fit again: on every GPU
    that hosts one (any mode, free or not yet), exactly what device_share answers."""
    whole = GpuRequest(GpuKind.WHOLE, 1)
    state = make_state(gpus=4, mode=mode, model="L4")
    quarter = Demand(0, 0, GpuRequest(GpuKind.SHARE, 1, fraction_milli=250, sharing=frozenset({SharingMode(mode)})))
    if mode != "exclusive":  # a share on GPU 0: it hosts no whole GPU then
        state = state.apply("q", fit(quarter, state).allocations[0])
    node = state.node
    hosting = 0
    for device, usage in zip(node.devices, state.usage, strict=True):
        for by_arrays in (False, True):
            if hosts(whole, node, device, usage):
                hosting += 1
                assert share_on(whole, node, device, usage, by_arrays) == device_share(whole, node, device, usage)
    assert hosting == 2 * (4 if mode == "exclusive" else 3)


@pytest.mark.parametrize("name", ["fgd", "fgd-cpu", "fgd-reserve", "binpack", "bestfit"])
def test_the_board_scores_several_whole_gpus_on_the_gpus_fit_would_take(name: str) -> None:
    # Two whole GPUs: on "used", GPU 0 holds half a GPU, so fit takes GPUs 1 and 2 (idle) and
    # leaves the half-used one beside GPU 3; on "idle", GPUs 0 and 1; on "exclusive", GPU 1 is
    # taken, so GPUs 0 and 2; "short" has one idle GPU only. The board finds the GPUs from its
    # table of which GPU states host the request: its scores are the plain ranking's.
    half = Demand(0, 0, GpuRequest(GpuKind.SHARE, 1, fraction_milli=500))
    used = make_state(name="used", gpus=4, mode="mps")
    used = used.apply("half", fit(half, used).allocations[0])
    short = make_state(name="short", gpus=2, mode="mps")
    short = short.apply("half", fit(half, short).allocations[0])
    exclusive = make_state(name="exclusive", gpus=3, mode="exclusive")
    one = Demand(0, 0, GpuRequest(GpuKind.WHOLE, 1))
    exclusive = exclusive.apply("one", fit(one, exclusive).allocations[1])  # GPU 1
    states = [used, make_state(name="idle", gpus=4, mode="mps"), exclusive, short]
    two = Demand(0, 0, GpuRequest(GpuKind.WHOLE, 2))
    policy = make_policy_for(name, workload=TypicalWorkload(((half, 0.5), (two, 0.5))))
    expected = {p.node: p.score for p in rank(policy, two, states).placements}
    assert set(expected) == {"used", "idle", "exclusive"}
    assert [f.milli for f in used.frees] == [500, 1000, 1000, 1000]  # the half share sits on GPU 0
    assert [f.milli for f in exclusive.frees] == [1000, 0, 1000]
    got = Board(states).scores(policy, two)
    assert got.tolist() == [expected["used"], expected["idle"], expected["exclusive"], -np.inf]


@pytest.mark.parametrize("arrays_from", [1, 10**9])
def test_the_boards_reasons_on_shared_gpus_are_fits_written_once_per_shortage(
    arrays_from: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On MPS and time-slicing nodes in many states (compute used up, memory short, stray
    memory, no client left), the board writes one reason per distinct shortage, what is short
    found over arrays (or, for a few states, one by one: both ways here): every failing
    node's reason must be the one fit gives it, for shares of one GPU and of several, each
    kind of shortage must show, and no reason may hold a ``%``."""
    monkeypatch.setattr(devstates, "_ARRAYS_FROM", arrays_from)
    states = []
    for k in range(24):
        mode = "mps" if k % 2 else "time-slicing"
        stray = 3_000 * (k % 3)  # MiB no record accounts for, on every GPU of the node
        node = make_state(
            name=f"n{k}",
            gpus=2 + k % 3,
            mode=mode,
            device_options={"stray_memory_mib": stray, **({"replicas": 3} if k % 4 == 0 else {})},
        ).node
        state = NodeState.empty(node)
        for j in range(k % 5):  # 0 to 4 shares of a fifth to a half already placed
            taken = Demand(0, 0, GpuRequest(GpuKind.SHARE, 1, fraction_milli=200 + 100 * ((j + k) % 4)))
            found = fit(taken, state)
            if found:
                state = state.apply(f"p{k}-{j}", found.allocations[0])
        states.append(state)
    board = Board(states)
    policy = make_policy("binpack")
    texts: set[str] = set()
    for gpu in (
        GpuRequest(GpuKind.SHARE, 1, fraction_milli=700),
        GpuRequest(GpuKind.SHARE, 1, memory_mib=60_000),
        GpuRequest(GpuKind.SHARE, 1, memory_mib=9_000, compute_milli=800),
        GpuRequest(GpuKind.SHARE, 2, fraction_milli=600),
        GpuRequest(GpuKind.SHARE, 3, memory_mib=50_000, compute_milli=300),
    ):
        demand = Demand(0, 0, gpu)
        outcomes = board.filter(policy, demand)
        for k, state in enumerate(states):
            found = fit(demand, state)
            assert outcomes.fits()[k] == bool(found), k
            if not found and fit(demand, NodeState.empty(state.node)):  # not one it could never host
                assert Status(int(outcomes.status[k])) is Status.UNSCHEDULABLE
                assert outcomes.texts[outcomes.reason[k]] == found.reason, (k, gpu)
                texts.add(found.reason)
    assert any("compute on one GPU, more than is free" in t for t in texts)
    assert any("MiB on one GPU, more than is free" in t for t in texts)
    assert any(t.startswith("needs 2 GPUs") and "(" in t for t in texts)  # several GPUs, with why
    assert len(texts) > 10
    assert not any("%" in t for t in texts)  # kube-scheduler formats reasons with Go's fmt


def test_requests_of_one_question_share_the_boards_answers_on_mig_and_exclusive_gpus() -> None:
    """The board keeps what a MIG or exclusive GPU state answers per question (fit's
    state_question), not per request: requests asked one after the other on one board, some
    of one question (fractions that the same MIG profiles cover), some not (part of an
    exclusive GPU, or the whole of it; more than a GPU has), must each filter and score as
    fit and the plain ranking say, node by node."""
    from scheduler.core.catalog import ProfileSpec
    from scheduler.core.fit import state_question

    states = []
    for k in range(8):
        mode = "mig" if k % 2 else "exclusive"
        state = make_state(name=f"n{k}", gpus=2, mode=mode, model="H100-80GB")
        for j in range(k // 2):  # 0 to 3 pods placed: a different state per node
            taken = Demand(0, 0, GpuRequest(GpuKind.SHARE, 1, fraction_milli=250 * (j + 1), sharing=frozenset()))
            whole = Demand(0, 0, GpuRequest(GpuKind.WHOLE, 1))
            found = fit(taken if mode == "mig" else whole, state)
            if found:
                state = state.apply(f"p{k}-{j}", found.allocations[0])
        states.append(state)
    asked = [
        GpuRequest(GpuKind.SHARE, 1, fraction_milli=100),
        GpuRequest(GpuKind.SHARE, 1, fraction_milli=120),  # the question of 0.1 on MIG GPUs
        GpuRequest(GpuKind.SHARE, 1, fraction_milli=500),
        GpuRequest(GpuKind.SHARE, 1, fraction_milli=500, sharing=frozenset({SharingMode.EXCLUSIVE})),
        GpuRequest(GpuKind.SHARE, 1, memory_mib=90_000),  # more than any GPU has
        GpuRequest(GpuKind.SHARE, 1, memory_mib=95_000),
        GpuRequest(GpuKind.WHOLE, 1),
        GpuRequest(GpuKind.MIG, 1, profile=ProfileSpec.parse("3g.40gb")),
        GpuRequest(GpuKind.SHARE, 1, memory_mib=30_000),
    ]
    mig, exclusive = states[1].node.devices[0], states[0].node.devices[0]
    assert state_question(asked[0], mig) == state_question(asked[1], mig) != state_question(asked[2], mig)
    assert state_question(asked[2], exclusive) != state_question(asked[3], exclusive)
    assert state_question(asked[3], exclusive) == state_question(asked[6], exclusive)
    board = Board(states)
    policy = make_policy("binpack")
    for gpu in asked:
        demand = Demand(0, 0, gpu)
        outcomes = board.filter(policy, demand)
        for k, state in enumerate(states):
            found = fit(demand, state)
            assert outcomes.fits()[k] == bool(found), (k, gpu)
            if Status(int(outcomes.status[k])) is Status.UNSCHEDULABLE:
                assert outcomes.texts[outcomes.reason[k]] == found.reason, (k, gpu)
        ranking = {p.node: p.score for p in rank(policy, demand, states).placements}
        assert board.scores(policy, demand).tolist() == [ranking.get(s.node.name, -np.inf) for s in states]
