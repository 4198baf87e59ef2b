"""choose_victims: hand-derived cases, and the invariants over random nodes (hypothesis)."""

from __future__ import annotations

from itertools import combinations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.allocation import Allocation, DeviceShare, MigSlot
from scheduler.core.catalog import ProfileSpec
from scheduler.core.fit import fit
from scheduler.core.inventory import Node, SharingMode
from scheduler.core.preempt import Candidate, Preemption, choose_victims
from scheduler.core.request import Demand, GpuKind, GpuRequest
from scheduler.core.state import NodeState
from tests.builders import make_device, make_state
from tests.core.test_properties import demands, nodes

H100_MIB = 81920


def share(fraction_milli: int, cpu_milli: int = 0) -> Demand:
    return Demand(cpu_milli, 0, GpuRequest(GpuKind.SHARE, 1, fraction_milli=fraction_milli))


def mig(profile: str) -> Demand:
    return Demand(0, 0, GpuRequest(GpuKind.MIG, 1, profile=ProfileSpec.parse(profile)))


def whole(count: int = 1, nvlink: bool = False) -> Demand:
    return Demand(0, 0, GpuRequest(GpuKind.WHOLE, count, nvlink=nvlink))


def place(state: NodeState, key: str, demand: Demand, gpu: int) -> NodeState:
    """``demand`` given to ``key`` on GPU ``gpu`` (its candidate there)."""
    found = fit(demand, state)
    alloc = next(a for a in found.allocations if a.shares[0].index == gpu)
    return state.apply(key, alloc)


def mig_share(state: NodeState, key: str, profile: str, start: int, gpu: int = 0) -> NodeState:
    """A MIG instance of ``profile`` at slot ``start`` of GPU ``gpu``, placed by hand (not by the slot rule)."""
    layout = state.node.devices[gpu].model.mig
    assert layout is not None
    p = layout.profile(profile)
    assert p is not None
    slot = MigSlot(start, p.memory_slots, p.compute_slices, p.name)
    uuid = state.node.devices[gpu].uuid
    device_share = DeviceShare(uuid, gpu, SharingMode.MIG, p.memory_mib, p.compute_slices * 1000 // 7, slot)
    return state.apply(key, Allocation(state.node.name, (device_share,)))


def test_a_fraction_needs_one_of_the_three_proposed() -> None:
    # MPS, two H100s. GPU 0: a 0.5 + b 0.5 (full); GPU 1: c 1.0 (full). The pod wants 0.5.
    # Any one victim frees room: a or b free 0.5 of GPU 0, c all of GPU 1. Fewest pods: 1.
    # Lowest priority: b and c (1) before a (3). Least GPU evicted: b (500) before c (1000).
    state = make_state(gpus=2, mode="mps")
    state = place(state, "a", share(500), 0)
    state = place(state, "b", share(500), 0)
    state = place(state, "c", share(1000), 1)
    got = choose_victims(share(500), state, [Candidate("a", 3), Candidate("b", 1), Candidate("c", 1)])
    assert isinstance(got, Preemption)
    assert got.victims == ("b",) and got.fewest and got.evicted_milli == 500
    assert got.allocation.shares[0].index == 0  # the share b leaves


def test_a_3g_needs_the_two_1g_at_the_right_slots_not_the_2g() -> None:
    # H100 MIG, slots 0..7: p1 1g@0, p2 1g@1, q 2g@4 (slots 4-5), r 1g@6; free: 2, 3, 7.
    # A 3g.40gb takes 4 slots at 0 or 4. Evicting q alone leaves 5 free slots and 4 free slices,
    # enough in total, but r at 6 blocks the start at 4 and p1, p2 block 0: no legal start.
    # Evicting p1 and p2 frees slots 0-3: the 3g starts at 0. r is not proposed.
    state = make_state(mode="mig")
    for key, profile, start in (("p1", "1g.10gb", 0), ("p2", "1g.10gb", 1), ("q", "2g.20gb", 4), ("r", "1g.10gb", 6)):
        state = mig_share(state, key, profile, start)
    proposed = [Candidate("q", 0), Candidate("p1", 10), Candidate("p2", 10)]
    got = choose_victims(mig("3g.40gb"), state, proposed)
    assert isinstance(got, Preemption)
    assert got.victims == ("p1", "p2")
    slot = got.allocation.shares[0].mig
    assert slot is not None and (slot.profile, slot.start) == ("3g.40gb", 0)
    # q alone does not do it, whatever its priority
    assert isinstance(choose_victims(mig("3g.40gb"), state, [Candidate("q", 0)]), str)


def test_a_whole_gpu_needs_the_one_gpu_holding_a_single_small_share() -> None:
    # MPS, four H100s: GPU 0 two quarters, GPU 1 three tenths, GPU 2 one tenth (f), GPU 3 two
    # quarters. A whole GPU needs an empty GPU: emptying GPU 2 takes one eviction, any other two or three.
    state = make_state(gpus=4, mode="mps")
    layout = [("a", 250, 0), ("b", 250, 0), ("c", 100, 1), ("d", 100, 1), ("e", 100, 1), ("f", 100, 2)]
    layout += [("g", 250, 3), ("h", 250, 3)]
    for key, milli, gpu in layout:
        state = place(state, key, share(milli), gpu)
    got = choose_victims(whole(), state, [Candidate(k, 0) for k, _, _ in layout])
    assert isinstance(got, Preemption)
    assert got.victims == ("f",)
    assert [s.index for s in got.allocation.shares] == [2]


def test_a_node_where_no_subset_frees_a_share_is_refused() -> None:
    # One MPS H100: x 0.5 (proposed), y 0.5 (not). The pod wants 0.75: evicting x frees 0.5 only.
    state = place(place(make_state(mode="mps"), "x", share(500), 0), "y", share(500), 0)
    got = choose_victims(share(750), state, [Candidate("x")])
    assert isinstance(got, str)
    assert got.startswith("evicting all 1 candidates on node n1 frees no share: ")


def test_nvlink_required_chooses_the_gpu_beside_a_free_peer() -> None:
    # Four exclusive GPUs, NVLink (0,1) and (2,3). a on GPU 0, b on GPU 2, c on GPU 3; GPU 1 free.
    # Two whole GPUs joined by NVLink: evict a (0 joins the free 1), or b and c. One pod: a.
    # Preferred (any two GPUs): any one eviction frees a second GPU; lowest priority: b (1) and
    # c (1) before a (5); then the keys: b.
    devices = tuple(make_device(i, uuid=f"n1-gpu{i}") for i in range(4))
    state = NodeState.empty(Node("n1", 64_000, 512_000, devices, nvlink=frozenset({(0, 1), (2, 3)})))
    for key, gpu in (("a", 0), ("b", 2), ("c", 3)):
        state = place(state, key, whole(), gpu)
    proposed = [Candidate("a", 5), Candidate("b", 1), Candidate("c", 1)]
    required = choose_victims(whole(2, nvlink=True), state, proposed)
    assert isinstance(required, Preemption) and required.victims == ("a",)
    # Whole GPUs: only the pods of whole GPUs are tried, best first: {b} (GPUs 1 and 2, not
    # linked), {c} (1 and 3, not linked), then {a} (0 and 1): 3 questions after the check that
    # evicting everything frees a share.
    assert required.asked == 4
    assert [s.index for s in required.allocation.shares] == [0, 1]
    preferred = choose_victims(whole(2), state, proposed)
    assert isinstance(preferred, Preemption) and preferred.victims == ("b",)


def test_a_short_host_needs_the_victim_holding_the_cpu() -> None:
    # 8 CPUs: a (0.25 GPU, 6 CPUs) and b (0.25 GPU, 1 CPU) on GPU 0; 1 CPU free. The pod wants
    # 0.25 GPU (room enough) and 4 CPUs: only evicting a frees 4 CPUs (b frees 1, 1 + 1 < 4).
    state = make_state(mode="mps", cpu_milli=8000)
    state = place(state, "a", share(250, 6000), 0)
    state = place(state, "b", share(250, 1000), 0)
    got = choose_victims(share(250, 4000), state, [Candidate("b", 0), Candidate("a", 9)])
    assert isinstance(got, Preemption) and got.victims == ("a",)


def test_a_pod_that_fits_already_needs_no_victim_and_unknown_keys_are_never_chosen() -> None:
    state = place(make_state(gpus=2, mode="mps"), "a", share(500), 0)
    got = choose_victims(share(500), state, [Candidate("a"), Candidate("ghost")])
    assert isinstance(got, Preemption) and got.victims == ()
    full = place(state, "b", share(500), 0)
    full = place(full, "c", share(1000), 1)
    assert isinstance(choose_victims(share(1000), full, [Candidate("ghost")]), str)


def test_past_the_bound_the_answer_is_still_minimal() -> None:
    # 12 MPS clients of 1/12 each on one GPU, all proposed; the pod wants half: 6 must go. With a
    # budget of 10 questions the enumeration gives up (C(12, 6) = 924 sets of six) and the reprieve
    # rule answers: six victims (no five suffice), the least important (lowest priority) ones.
    state = make_state(mode="mps")
    for i in range(12):
        state = place(state, f"p{i:02}", share(83), 0)  # 12 x 83 = 996 milli
    candidates = [Candidate(f"p{i:02}", priority=i) for i in range(12)]
    got = choose_victims(share(500), state, candidates, limit=10)
    assert isinstance(got, Preemption) and not got.fewest
    # what stays must leave 500 free: 1000 - 83 x stay >= 500 <=> stay <= 6 (498 used, 502 free;
    # 7 would leave 419), so 6 go; given back most important first, the 6 least important remain.
    assert got.victims == tuple(f"p{i:02}" for i in range(6))
    # sets of one to six: 12 + 66 + 220 + 495 + 792 + 924 = 2509 questions, past the default bound
    assert not choose_victims(share(500), state, candidates).fewest  # type: ignore[union-attr]
    exhaustive = choose_victims(share(500), state, candidates, limit=3000)
    assert isinstance(exhaustive, Preemption) and exhaustive.fewest and exhaustive.victims == got.victims


# ---------------------------------------------------------------- invariants


def released(state: NodeState, keys: tuple[str, ...]) -> NodeState:
    for key in keys:
        state = state.release(key)
    return state


@st.composite
def crowded(draw: st.DrawFn) -> Node:
    """A node of one to four random GPUs with room on the host, so that GPUs are what runs out."""
    node: Node = draw(nodes())
    return Node("n", 64_000, 64_000, node.devices, 30, node.nvlink)


@st.composite
def cases(draw: st.DrawFn) -> tuple[NodeState, Demand, list[Candidate]]:
    state = NodeState.empty(draw(crowded()))
    placed: list[Demand] = []
    for i in range(draw(st.integers(0, 14))):
        demand = draw(demands())
        found = fit(demand, state)
        if found:
            state = state.apply(f"p{i}", draw(st.sampled_from(found.allocations)))
            placed.append(demand)
    # often the shape of a pod already there: one that fits once something is evicted
    # the shape of a pod already there (it fits once something is evicted), whole GPUs (several
    # small pods must go), or anything
    form = draw(st.sampled_from(["placed", "whole", "any"]))
    if form == "placed" and placed:
        demand = draw(st.sampled_from(placed))
    elif form == "whole":
        demand = whole(draw(st.integers(1, 2)), draw(st.booleans()))
    else:
        demand = draw(demands().filter(lambda d: d.gpu.kind is not GpuKind.NONE))
    for i in range(30):  # mostly, fill the node with small pods until the pod no longer fits
        found = fit(demand, state)
        if not found or draw(st.integers(0, 19)) == 0:
            break
        filler = draw(st.sampled_from([demand, share(draw(st.integers(50, 400))), mig("1g.10gb"), whole()]))
        room = fit(filler, state)
        if room:
            state = state.apply(f"q{i}", draw(st.sampled_from(room.allocations)))
    keys = [k for k, _ in state.pods]
    if len(keys) <= 8 and draw(st.booleans()):
        chosen = keys  # everything proposed
    elif keys:
        chosen = draw(st.lists(st.sampled_from(keys), unique=True, min_size=1, max_size=8))
    else:
        chosen = []
    return state, demand, [Candidate(k, draw(st.integers(-3, 3))) for k in chosen]


@st.composite
def packed(draw: st.DrawFn) -> tuple[NodeState, Demand, list[Candidate]]:
    """One or two shared GPUs packed with small pods, and a larger pod: several must go."""
    mode = draw(st.sampled_from(["mps", "time-slicing", "mig"]))
    count = draw(st.integers(1, 2))
    options = {"replicas": 8} if mode == "time-slicing" else {}
    state = make_state(gpus=count, mode=mode, device_options=options)
    small = [mig("1g.10gb"), mig("1g.20gb"), mig("2g.20gb")] if mode == "mig" else [share(m) for m in (100, 150, 250)]
    for i in range(draw(st.integers(2, 10))):
        found = fit(draw(st.sampled_from(small)), state)
        if found:
            state = state.apply(f"s{i}", draw(st.sampled_from(found.allocations)))
    large = [mig("3g.40gb"), mig("4g.40gb"), mig("7g.80gb")] if mode == "mig" else [share(500), share(750), whole()]
    demand = draw(st.sampled_from(large))
    keys = [k for k, _ in state.pods]
    chosen = draw(st.lists(st.sampled_from(keys), unique=True, min_size=min(8, max(0, len(keys) - 1)), max_size=8))
    return state, demand, [Candidate(k, draw(st.integers(-3, 3))) for k in chosen]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases() | packed())
def test_the_victims_free_a_share_and_no_strict_subset_does(case: tuple[NodeState, Demand, list[Candidate]]) -> None:
    state, demand, candidates = case
    got = choose_victims(demand, state, candidates)
    keys = [c.key for c in candidates]
    subsets = [s for n in range(len(keys) + 1) for s in combinations(keys, n)]
    working = [s for s in subsets if fit(demand, released(state, s))]
    if isinstance(got, str):
        assert working == []  # no set of the candidates frees a share
        return
    assert set(got.victims) <= set(keys)
    assert fit(demand, released(state, got.victims))
    for n in range(len(got.victims)):
        for smaller in combinations(got.victims, n):
            assert not fit(demand, released(state, smaller)), (got.victims, smaller)
    # the allocation answered is one fit gives once the victims are gone
    assert got.allocation in fit(demand, released(state, got.victims)).allocations
    assert got.fewest  # at most 8 candidates: 256 sets, within the default bound
    fewest = min(len(s) for s in working)
    assert len(got.victims) == fewest
    priority = {c.key: c.priority for c in candidates}
    held = dict(state.pods)

    def rank(s: tuple[str, ...]) -> tuple[int, int, int, int]:
        ps = [priority[k] for k in s]
        milli = sum(min(1000, sh.compute_milli) for k in s for sh in held[k].shares)
        return len(s), max(ps, default=0), sum(ps), milli

    assert rank(got.victims) == min(rank(s) for s in working)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases() | packed(), st.integers(1, 30))
def test_past_any_bound_the_answer_frees_a_share_minimally(
    case: tuple[NodeState, Demand, list[Candidate]], limit: int
) -> None:
    state, demand, candidates = case
    got = choose_victims(demand, state, candidates, limit=limit)
    if isinstance(got, str):
        assert not fit(demand, released(state, tuple(c.key for c in candidates)))
        return
    assert fit(demand, released(state, got.victims))
    for n in range(len(got.victims)):
        for smaller in combinations(got.victims, n):
            assert not fit(demand, released(state, smaller))
