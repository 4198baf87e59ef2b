"""The defragmentation planner: hand-derived moves on small clusters, and what it never does."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.board import Board
from scheduler.core.defrag import Mover, Plan, PlanOptions, Waiting, plan
from scheduler.core.fit import fit
from scheduler.core.fragmentation import DEFAULT_WORKLOAD, Fragmentation, TypicalWorkload
from scheduler.core.inventory import Node
from scheduler.core.request import Demand
from scheduler.core.state import NodeState
from tests.builders import make_policy_for, make_state
from tests.core.test_preempt import crowded, demands, mig, mig_share, place, share, whole

WHOLE_ONLY = Fragmentation(TypicalWorkload(((whole(), 1.0),)))


def binpack() -> object:
    return make_policy_for("binpack")


def run(states: list[NodeState], pending: list[Waiting], movers: list[Mover], **options: object) -> Plan:
    return plan(states, pending, movers, binpack(), WHOLE_ONLY, PlanOptions(**options))  # type: ignore[arg-type]


def test_a_3g_waits_for_two_1g_on_two_gpus_and_one_moves() -> None:
    # One H100 node, two GPUs under MIG. Each GPU: a 1g at slot 0 and a 1g at slot 4, which block
    # both starts of a 3g (0 and 4). Evicting one 1g frees a start: a0 (GPU 0, slot 0) and a4
    # (GPU 0, slot 4) tie on every count (one pod, priority 0, 142 milli); the keys pick a0. The
    # 3g takes slots 0-3 of GPU 0 and a0 lands again (GPU 1 has six free slots).
    state = make_state(mode="mig", gpus=2)
    for key, gpu, start in (("a0", 0, 0), ("a4", 0, 4), ("b0", 1, 0), ("b4", 1, 4)):
        state = mig_share(state, key, "1g.10gb", start, gpu)
    assert not fit(mig("3g.40gb"), state)
    movers = [Mover(k, mig("1g.10gb")) for k in ("a0", "a4", "b0", "b4")]
    got = run([state], [Waiting("big", mig("3g.40gb"))], movers)
    (move,) = got.moves
    assert (move.node, move.evict, move.admits) == ("n1", ("a0",), "big")
    assert move.frees == "GPU 0: 1g.10gb at slot 0"
    assert move.allocation is not None and move.allocation.shares[0].mig is not None
    assert (move.allocation.shares[0].index, move.allocation.shares[0].mig.start) == (0, 0)
    assert [landing.pod for landing in move.lands] == ["a0"] and got.stranded == () and got.evictions == 1


def test_a_whole_gpu_waits_while_each_gpu_holds_one_small_share() -> None:
    # Two MPS GPUs, x (priority 1) on GPU 0 and y (priority 0) on GPU 1, a quarter each: no GPU is
    # free. Evicting either frees a whole GPU; y is the less important. The whole-GPU pod takes
    # GPU 1 and y lands on GPU 0 beside x (binpack: the most allocated GPU once placed).
    state = place(place(make_state(gpus=2, mode="mps"), "x", share(250), 0), "y", share(250), 1)
    movers = [Mover("x", share(250), 1), Mover("y", share(250), 0)]
    got = run([state], [Waiting("train", whole())], movers)
    (move,) = got.moves
    assert move.evict == ("y",) and move.admits == "train"
    assert [s.index for s in move.allocation.shares] == [1]  # type: ignore[union-attr]
    ((landing),) = move.lands
    assert (landing.pod, landing.node, [s.index for s in landing.allocation.shares]) == ("y", "n1", [0])
    # only x may move: x goes, whatever its priority
    (move,) = run([state], [Waiting("train", whole())], movers[:1]).moves
    assert move.evict == ("x",)


def test_the_evicted_pods_are_evicted_in_the_order_they_land_largest_first() -> None:
    # x (MPS, one GPU): a 0.25 and b 0.5 may move, c 0.25 may not; the pending p (0.75, 8 CPUs)
    # needs both gone. y has half a GPU free, z a whole one but 2 CPUs: b (8 CPUs) fits only on
    # y, a on y or z. Recreated small first, a would take y (binpack: the fuller node) and b would
    # find no place: the plan predicts b first (y), then a (z), and evicts them in that order.
    x = place(
        place(place(make_state(name="x", mode="mps"), "a", share(250, 1000), 0), "b", share(500, 8000), 0),
        "c",
        share(250),
        0,
    )
    y = place(make_state(name="y", mode="mps"), "d", share(500), 0)
    z = make_state(name="z", mode="mps", cpu_milli=2000)
    movers = [Mover("a", share(250, 1000)), Mover("b", share(500, 8000))]
    got = run([x, y, z], [Waiting("p", share(750, 8000))], movers)
    (move,) = got.moves
    assert move.admits == "p" and move.evict == ("b", "a")
    assert [(landing.pod, landing.node) for landing in move.lands] == [("b", "y"), ("a", "z")]
    enacted([x, y, z], got, movers)


def test_nothing_moves_that_may_not_or_that_would_land_nowhere() -> None:
    state = place(place(make_state(gpus=2, mode="mps"), "x", share(250), 0), "y", share(250), 1)
    got = run([state], [Waiting("train", whole())], [])
    assert got.moves == () and got.stranded == (("train", "no move of at most 8 movable pods lets it in"),)
    # one GPU, three quarters taken: evicting them frees the GPU, but then they fit nowhere
    lone = place(make_state(mode="mps"), "z", share(750), 0)
    got = run([lone], [Waiting("train", whole()), Waiting("small", share(250))], [Mover("z", share(750))])
    assert got.moves == () and got.stranded[0][0] == "train"
    assert got.fits_now == (("small", "n1"),)  # the move tried and given up left the cluster as it was


def test_the_node_needing_the_fewest_evictions_wins() -> None:
    # a: GPU 0 holds two quarters (a1, a2); b: GPU 0 holds one quarter (b1), GPU 1 a quarter (b2).
    # A whole GPU: two evictions on a, one on b (either of b's pods; the keys pick b1). Whichever
    # node comes first, b wins.
    a = place(place(make_state(name="a", mode="mps"), "a1", share(250), 0), "a2", share(250), 0)
    b = place(place(make_state(name="b", gpus=2, mode="mps"), "b1", share(250), 0), "b2", share(250), 1)
    movers = [Mover(k, share(250)) for k in ("a1", "a2", "b1", "b2")]
    for states in ([a, b], [b, a]):
        (move,) = run(states, [Waiting("train", whole())], movers).moves
        assert (move.node, move.evict) == ("b", ("b1",))


def test_the_budget_bounds_the_evictions() -> None:
    # GPU 0 holds a and b (a quarter each), GPU 1 holds c and d; a whole GPU needs two evictions.
    state = make_state(gpus=3, mode="mps")
    for key, gpu in (("a", 0), ("b", 0), ("c", 1), ("d", 1), ("e", 2), ("f", 2)):
        state = place(state, key, share(250), gpu)
    movers = [Mover(k, share(250)) for k in "abcdef"]
    got = run([state], [Waiting("train", whole())], movers, max_evictions=1)
    assert got.moves == () and got.stranded == (("train", "no move of at most 1 movable pods lets it in"),)
    got = run([state], [Waiting("train", whole())], movers, max_evictions=2)
    assert got.evictions == 2 and got.moves[0].evict == ("a", "b")


def test_pending_pods_that_fit_need_no_move_and_take_their_room() -> None:
    # One MPS GPU with half free: the first half-GPU pod fits now; the second does not, and
    # nothing may move.
    state = place(make_state(mode="mps"), "x", share(500), 0)
    got = run([state], [Waiting("p1", share(500)), Waiting("p2", share(500))], [])
    assert got.fits_now == (("p1", "n1"),)
    assert [k for k, _ in got.stranded] == ["p2"]
    # higher priority first: p2 takes the room
    got = run([state], [Waiting("p1", share(500)), Waiting("p2", share(500), priority=5)], [])
    assert got.fits_now == (("p2", "n1"),)


def test_a_pod_too_large_for_every_node_is_stranded_at_once() -> None:
    got = run([make_state(mode="mps")], [Waiting("huge", whole(2))], [])
    why = "fits no node even empty: needs 2 GPUs for 2 whole GPUs, not that many available"
    assert got.stranded == (("huge", why),)


def test_failing_that_the_fragmentation_measure_falls_most_per_eviction() -> None:
    # Typical pod: one whole GPU. Nodes a and b, one MPS GPU each, a quarter taken on each (p on
    # a, q on b): neither can host a whole GPU, F = 750 + 750 = 1500 milli. Moving p to b (binpack
    # puts it beside q) empties a: F = 0 + 500 = 500, a fall of 1000. Moving q to a is as good;
    # the keys pick p. Then every move raises F again (or lands the pod where it is): the plan ends.
    a = place(make_state(name="a", mode="mps"), "p", share(250), 0)
    b = place(make_state(name="b", mode="mps"), "q", share(250), 0)
    got = run([a, b], [], [Mover("p", share(250)), Mover("q", share(250))])
    (move,) = got.moves
    assert move.evict == ("p",) and move.admits is None and move.node == "a"
    assert [landing.node for landing in move.lands] == ["b"]
    assert move.frag_fall_milli == 1000
    # a fall below the threshold is not worth an eviction
    assert run([a, b], [], [Mover("p", share(250)), Mover("q", share(250))], min_fall_milli=1001).moves == ()
    assert run([a, b], [], [Mover("p", share(250))], fragmentation_moves=False).moves == ()


# ---------------------------------------------------------------- invariants


def replay(states: list[NodeState], got: Plan) -> dict[str, NodeState]:
    """The cluster after the plan, each step applied as the planner says: raises if any over-allocates."""
    cluster = {s.node.name: s for s in states}
    for move in got.moves:
        node = cluster[move.node]
        for key in move.evict:
            assert node.allocation_of(key) is not None
            node = node.release(key)
        cluster[move.node] = node
        if move.admits is not None:
            assert move.allocation is not None
            cluster[move.allocation.node] = cluster[move.allocation.node].apply(move.admits, move.allocation)
        for landing in move.lands:
            cluster[landing.node] = cluster[landing.node].apply(landing.pod, landing.allocation)
    return cluster


def enacted(states: list[NodeState], got: Plan, movers: list[Mover]) -> None:
    """Each move carried out as a cluster does it: the victims evicted, the pending pod placed,
    then the victims recreated in the order of ``evict`` and placed by the policy: each must land
    as the plan predicts."""
    policy = binpack()
    board = Board(states, {s.node.name: i for i, s in enumerate(states)})
    demand_of = {m.key: m.demand for m in movers}
    for move in got.moves:
        node = board.get(move.node)
        assert node is not None
        for key in move.evict:
            node = node.release(key)
        board.put(node)
        if move.admits is not None and move.allocation is not None:
            target = board.get(move.allocation.node)
            assert target is not None
            board.put(target.apply(move.admits, move.allocation))
        for key in move.evict:
            choice = board.best(policy, demand_of[key])  # type: ignore[arg-type]
            landing = next(landing for landing in move.lands if landing.pod == key)
            assert choice is not None and (choice.node, choice.allocation) == (landing.node, landing.allocation)
            target = board.get(choice.node)
            assert target is not None
            board.put(target.apply(key, choice.allocation))


def fill(
    draw: st.DrawFn, state: NodeState, shapes: st.SearchStrategy[Demand], pods: int, demands_of: dict[str, Demand]
) -> NodeState:
    """``state`` with up to ``pods`` pods of ``shapes`` placed where fit allows (those that fit),
    each recorded in ``demands_of`` under ``<node>-p<i>``."""
    for i in range(pods):
        demand = draw(shapes)
        found = fit(demand, state)
        if found:
            key = f"{state.node.name}-p{i}"
            state = state.apply(key, draw(st.sampled_from(found.allocations)))
            demands_of[key] = demand
    return state


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[NodeState], list[Waiting], list[Mover], int]:
    states = []
    demands_of: dict[str, Demand] = {}
    for n in range(draw(st.integers(1, 3))):
        node: Node = draw(crowded())
        state = NodeState.empty(
            Node(f"n{n}", node.cpu_milli, node.memory_mib, node.devices, node.max_pods, node.nvlink)
        )
        shapes = demands() | st.sampled_from([share(250), whole(), mig("1g.10gb")])
        states.append(fill(draw, state, shapes, draw(st.integers(0, 8)), demands_of))
    keys = sorted(demands_of)
    movable = draw(st.lists(st.sampled_from(keys), unique=True)) if keys else []
    movers = [Mover(k, demands_of[k], draw(st.integers(0, 3))) for k in movable]
    pending = [
        Waiting(
            f"w{i}", draw(demands() | st.sampled_from([whole(), mig("3g.40gb"), share(750)])), draw(st.integers(0, 3))
        )
        for i in range(draw(st.integers(0, 4)))
    ]
    return states, pending, movers, draw(st.integers(0, 4))


@st.composite
def fragmented(draw: st.DrawFn) -> tuple[list[NodeState], list[Waiting], list[Mover], int]:
    """Nodes of one sharing mode with small pods spread over their GPUs, and large pods waiting."""
    mode = draw(st.sampled_from(["mps", "mig", "time-slicing"]))
    small = [mig("1g.10gb"), mig("2g.20gb")] if mode == "mig" else [share(125), share(250)]
    large = [mig("3g.40gb"), mig("7g.80gb")] if mode == "mig" else [share(750), whole()]
    options = {"replicas": 4} if mode == "time-slicing" else {}
    states = []
    demands_of: dict[str, Demand] = {}
    for n in range(draw(st.integers(1, 3))):
        state = make_state(name=f"n{n}", gpus=draw(st.integers(1, 2)), mode=mode, device_options=options)
        states.append(fill(draw, state, st.sampled_from(small), draw(st.integers(1, 8)), demands_of))
    keys = sorted(demands_of)
    movable = keys if draw(st.booleans()) else draw(st.lists(st.sampled_from(keys), unique=True))
    movers = [Mover(k, demands_of[k], draw(st.integers(0, 3))) for k in movable]
    pending = [
        Waiting(f"w{i}", draw(st.sampled_from(large)), draw(st.integers(0, 3))) for i in range(draw(st.integers(0, 3)))
    ]
    return states, pending, movers, draw(st.integers(0, 6))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters() | fragmented())
def test_it_never_moves_a_pod_it_must_not_and_every_step_fits(
    case: tuple[list[NodeState], list[Waiting], list[Mover], int],
) -> None:
    states, pending, movers, budget = case
    measure = Fragmentation(DEFAULT_WORKLOAD)
    got = plan(states, pending, movers, binpack(), measure, PlanOptions(max_evictions=budget, min_fall_milli=1))  # type: ignore[arg-type]
    allowed = {m.key for m in movers}
    evicted = [k for move in got.moves for k in move.evict]
    assert set(evicted) <= allowed  # never a pod it must not move
    assert len(evicted) == len(set(evicted))  # and each at most once
    assert got.evictions == len(evicted) <= budget
    admitted = [m.admits for m in got.moves if m.admits is not None]
    seen = admitted + [k for k, _ in got.fits_now] + [k for k, _ in got.stranded]
    assert sorted(seen) == sorted(p.key for p in pending)  # each pending pod accounted for once
    after = replay(states, got)  # no step over-allocates
    if not got.fits_now:  # (those interleave with the moves, in an order the plan does not keep)
        enacted(states, got, movers)  # the evicted pods, recreated in the order they are evicted, land as predicted
    for move in got.moves:  # every evicted pod lands again, and each admitted pod holds its share
        assert all(after[landing.node].allocation_of(landing.pod) is not None for landing in move.lands)
        assert sorted(landing.pod for landing in move.lands) == sorted(move.evict)
    for state in states:  # the input is untouched
        assert all(s.allocation_of(k) is not None for s in [state] for k, _ in state.pods)
    if not pending and got.moves:
        before = sum(measure.node_frag(s) for s in states)
        assert sum(measure.node_frag(s) for s in after.values()) < before


def test_an_empty_cluster_plans_nothing() -> None:
    assert run([], [Waiting("p", share(500))], []).stranded == (("p", "fits no node even empty: no nodes"),)
    assert plan([], [], [], binpack(), WHOLE_ONLY) == Plan((), (), ())  # type: ignore[arg-type]


def test_options_are_checked() -> None:
    import pytest

    with pytest.raises(ValueError, match="max_evictions"):
        PlanOptions(max_evictions=-1)
    with pytest.raises(ValueError, match="min_fall_milli"):
        PlanOptions(min_fall_milli=-0.5)
