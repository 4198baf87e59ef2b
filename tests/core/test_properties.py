"""Invariants of GPU accounting, over random nodes and random request sequences (hypothesis)."""

from __future__ import annotations

from dataclasses import replace
from unittest.mock import patch

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core import fit as fit_module
from scheduler.core import modes, nodescores
from scheduler.core.allocation import Allocation, DeviceShare, MigSlot, decode_record, encode_record
from scheduler.core.arrays import distinct, unique_inverse, unique_rows
from scheduler.core.board import Board, Status
from scheduler.core.capacity import DeviceUsage, Refusal, free, usage_row
from scheduler.core.catalog import CATALOG, ProfileSpec
from scheduler.core.errors import RecordError
from scheduler.core.fit import device_share, fit, hosts, sharing_share
from scheduler.core.fragmentation import Fragmentation, Shape, TypicalWorkload
from scheduler.core.inventory import MigInstance, Node, SharingMode
from scheduler.core.mig import best_start, slot_of
from scheduler.core.modes import mig as mig_module
from scheduler.core.modes.shared import SHORT_MEMORY, rows_fit, rows_refused_free, rows_shortages
from scheduler.core.policies import REGISTRY, make_policy, options_of
from scheduler.core.policies.base import ScoringNodes, ScoringTook, ScoringWithoutGpu, capabilities, tell
from scheduler.core.request import Demand, GpuKind, GpuRequest
from scheduler.core.select import evaluate, firsts, score_firsts
from scheduler.core.state import NodeState, rebuild
from tests.builders import make_device, share_candidates, without

MODELS = ["A100-80GB", "A100-40GB", "A30", "H100-80GB", "H200-141GB", "L4", "T4"]
PROFILES = [
    "1g.5gb",
    "1g.10gb",
    "1g.20gb",
    "2g.20gb",
    "3g.40gb",
    "4g.40gb",
    "7g.80gb",
    "1g.6gb",
    "2g.12gb",
    "4g.24gb",
    "3g.20gb",
    "3g.71gb",
    "1g.18gb",
]


@st.composite
def devices(draw: st.DrawFn, index: int, mig_only: bool = False) -> object:
    model = draw(st.sampled_from([m for m in MODELS if CATALOG[m].mig or not mig_only]))
    modes = ["mig"] if mig_only else ["exclusive", "mps", "time-slicing"] + (["mig"] if CATALOG[model].mig else [])
    mode = draw(st.sampled_from(modes))
    instances: tuple[MigInstance, ...] = ()
    layout = CATALOG[model].mig
    if mode == "mig" and layout is not None and draw(st.booleans()):
        # a static geometry: legal placements of random profiles, by the core's own slot rule
        used: tuple[MigSlot, ...] = ()
        for profile in draw(st.lists(st.sampled_from(layout.profiles), min_size=1, max_size=6)):
            start = best_start(layout, used, profile)
            if start is not None:
                used = (*used, slot_of(profile, start))
                instances = (*instances, MigInstance(profile, start, f"MIG-{index}-{len(instances)}"))
    return make_device(
        index,
        model,
        mode,
        uuid=f"g{index}",
        mps_client_limit=draw(st.integers(1, 6)),
        replicas=draw(st.integers(1, 6)),
        mig_instances=instances,
    )


@st.composite
def nodes(draw: st.DrawFn) -> Node:
    count = draw(st.integers(0, 4) | st.just(1))
    devs = tuple(draw(devices(i)) for i in range(count))  # type: ignore[misc]
    links = draw(st.frozensets(st.tuples(st.integers(0, 3), st.integers(0, 3)).filter(lambda e: e[0] < e[1])))
    return Node(
        "n",
        draw(st.integers(0, 64_000) | st.just(64_000)),
        draw(st.integers(0, 64_000) | st.just(64_000)),
        devs,
        draw(st.integers(1, 30) | st.just(30)),
        frozenset(e for e in links if e[1] < count),
        draw(st.sampled_from([100, 150])),
        draw(st.sampled_from([100, 200])),
    )


@st.composite
def demands(draw: st.DrawFn) -> Demand:
    kind = draw(
        st.sampled_from(
            [GpuKind.NONE, GpuKind.WHOLE, GpuKind.MIG, GpuKind.MIG, GpuKind.SHARE, GpuKind.SHARE, GpuKind.SHARE]
        )
    )
    small = st.integers(1, 200)
    sharing = draw(
        st.sampled_from(
            [
                frozenset(),
                frozenset({SharingMode.MPS}),
                frozenset({SharingMode.TIME_SLICING, SharingMode.MIG}),
                frozenset({SharingMode.TIME_SLICING, SharingMode.EXCLUSIVE}),
            ]
        )
    )
    if kind is GpuKind.NONE:
        gpu = GpuRequest()
    elif kind is GpuKind.WHOLE:
        # sharing listing mig: whole GPUs as MIG instances (the opt-in); the others never take one
        mig = draw(st.sampled_from([frozenset(), frozenset({SharingMode.MIG})]))
        gpu = GpuRequest(kind, draw(st.integers(1, 3)), sharing=sharing | mig)
    elif kind is GpuKind.MIG:
        gpu = GpuRequest(
            kind, 1, profile=ProfileSpec.parse(draw(st.sampled_from(PROFILES))), sharing=frozenset({SharingMode.MIG})
        )
    else:
        form = draw(st.sampled_from(["fraction", "memory", "compute", "both"]))
        gpu = GpuRequest(
            kind,
            draw(st.integers(1, 2)),
            fraction_milli=draw(small | st.integers(1, 1000)) if form == "fraction" else 0,
            memory_mib=draw(st.integers(1, 8_000) | st.integers(1, 90_000)) if form in ("memory", "both") else 0,
            compute_milli=draw(small | st.integers(1, 1000)) if form in ("compute", "both") else 0,
            sharing=sharing,
        )
    return Demand(draw(st.just(0) | st.integers(0, 20_000)), draw(st.just(0) | st.integers(0, 4_000)), gpu)


def assert_within_capacity(state: NodeState) -> None:
    node = state.node
    assert state.cpu_milli <= node.cpu_milli and state.memory_mib <= node.memory_mib
    assert len(state.pods) <= node.max_pods
    for device, usage in zip(node.devices, state.usage, strict=True):
        assert usage.shares >= 0 and usage.memory_mib >= 0 and usage.compute_milli >= 0
        if device.mode is SharingMode.EXCLUSIVE:
            assert usage.shares <= 1
        elif device.mode is SharingMode.MPS:
            assert usage.memory_mib <= device.memory_mib
            assert usage.compute_milli <= 1000 * node.mps_compute_oversub_pct // 100
            assert usage.shares <= device.mps_client_limit
        elif device.mode is SharingMode.TIME_SLICING:
            assert usage.memory_mib <= device.memory_mib * node.ts_memory_oversub_pct // 100
            assert usage.shares <= device.replicas
        else:
            layout = device.model.mig
            assert layout is not None
            assert_mig_legal(usage.mig, layout.memory_slots, layout.compute_slices, device)
        if usage.whole:
            assert usage.shares == 1


def assert_mig_legal(slots: tuple[MigSlot, ...], memory_slots: int, compute_slices: int, device: object) -> None:
    taken: set[int] = set()
    for slot in slots:
        cells = set(range(slot.start, slot.start + slot.size))
        assert not cells & taken, f"overlap at {slot}"
        assert max(cells) < memory_slots
        taken |= cells
        profile = next(p for p in device.model.mig.profiles if p.name == slot.profile)  # type: ignore[attr-defined]
        assert slot.start in profile.starts
        assert sum(1 for s in slots if s.profile == slot.profile) <= profile.max_count
    assert sum(s.slices for s in slots) <= compute_slices


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(nodes(), st.lists(st.tuples(demands(), st.integers(0, 7), st.booleans()), min_size=3, max_size=30))
def test_never_over_capacity_and_release_is_exact(node: Node, steps: list[tuple[Demand, int, bool]]) -> None:
    state = NodeState.empty(node)
    history = [state]
    for k, (demand, pick, release) in enumerate(steps):
        if release and state.pods:
            victim = state.pods[pick % len(state.pods)][0]
            state = state.release(victim)
        else:
            found = fit(demand, state)
            assert bool(found) == bool(found.allocations)
            assert bool(found) or found.reason
            if found:
                before = state
                state = state.apply(f"p{k}", found.allocations[pick % len(found.allocations)])
                assert state.release(f"p{k}") == before  # apply then release is the identity
        assert_within_capacity(state)
        # what apply and release hand over of the GPUs' free capacity is what a fresh look finds
        fresh = [free(node, d, u) for d, u in zip(node.devices, state.usage, strict=True)]
        assert list(state.frees) == fresh and state.free_milli() == sum(f.milli for f in fresh)
        history.append(state)
    # rebuilding from the records gives the same state
    records = [(pod, encode_record(alloc)) for pod, alloc in state.pods]
    rebuilt, problems = rebuild(node, records)
    assert problems == [] and rebuilt == state
    # releasing everything returns to empty
    for pod, _ in state.pods:
        state = state.release(pod)
    assert state == history[0]


@SETTINGS
@given(nodes(), demands())
def test_every_candidate_applies_and_round_trips(node: Node, demand: Demand) -> None:
    state = NodeState.empty(node)
    for alloc in fit(demand, state).allocations:
        assert decode_record(encode_record(alloc, "t"), "p") == alloc
        assert_within_capacity(state.apply("p", alloc))


@SETTINGS
@given(nodes(), st.lists(demands(), min_size=1, max_size=6), demands())
def test_a_hosting_sharing_gpu_gives_exactly_what_is_asked(node: Node, warmup: list[Demand], demand: Demand) -> None:
    """What the board hands a share or whole GPUs on an MPS or time-slicing GPU that hosts it
    (fit.sharing_share, no capacity question) is device_share's answer there."""
    state = NodeState.empty(node)
    for k, earlier in enumerate(warmup):
        found = fit(earlier, state)
        if found:
            state = state.apply(f"w{k}", found.allocations[0])
    gpu = demand.gpu
    if gpu.kind not in (GpuKind.SHARE, GpuKind.WHOLE):
        return
    for device, usage in zip(node.devices, state.usage, strict=True):
        if device.mode in (SharingMode.MPS, SharingMode.TIME_SLICING) and device.healthy:
            asked = device_share(gpu, node, device, usage)
            if not isinstance(asked, Refusal):
                assert sharing_share(gpu, device) == asked


def _all_single_shares(demand: Demand, state: NodeState) -> list[Allocation]:
    """Brute force: every share a single-GPU request could take, whatever fit would choose."""
    gpu = demand.gpu
    out = []
    for device in state.node.devices:
        if not gpu.allows_mode(device.mode) or not gpu.allows_model(device.model.name):
            continue
        if device.mode is SharingMode.MIG:
            layout = device.model.mig
            assert layout is not None
            memory, compute = gpu.share_on(device)
            for profile in device.allowed_profiles():
                if gpu.kind is GpuKind.WHOLE:
                    # only for a pod listing mig: any instance of a static GPU, the largest
                    # profile of a dynamic one (the whole GPU in MIG mode)
                    largest = max(device.allowed_profiles(), key=lambda p: (p.memory_slots, p.compute_slices))
                    if SharingMode.MIG not in gpu.sharing or (not device.mig_static and profile != largest):
                        continue
                elif gpu.kind is GpuKind.MIG:
                    assert gpu.profile is not None
                    if layout.match(gpu.profile) != profile:
                        continue
                elif (
                    gpu.kind is not GpuKind.SHARE
                    or profile.memory_mib < memory
                    or profile.compute_slices * 1000 < compute * layout.compute_slices
                ):
                    continue
                for start in range(layout.memory_slots):
                    slot = MigSlot(start, profile.memory_slots, profile.compute_slices, profile.name)
                    uuid = next(
                        (i.uuid for i in device.mig_instances if i.start == start and i.profile == profile), device.uuid
                    )
                    out.append(
                        Allocation(
                            state.node.name,
                            (DeviceShare(uuid, device.index, device.mode, profile.memory_mib, 1, slot),),
                            demand.cpu_milli,
                            demand.memory_mib,
                        )
                    )
        elif gpu.kind in (GpuKind.SHARE, GpuKind.WHOLE):
            memory, compute = gpu.share_on(device)
            if device.mode is SharingMode.EXCLUSIVE and memory <= device.memory_mib and compute <= 1000:
                part = (memory, compute) != (device.memory_mib, 1000)
                if part and SharingMode.EXCLUSIVE not in gpu.sharing:
                    continue  # part of a GPU takes an exclusive one only when the pod accepts a whole GPU
                memory, compute = device.memory_mib, 1000
            out.append(
                Allocation(
                    state.node.name,
                    (DeviceShare(device.uuid, device.index, device.mode, memory, compute),),
                    demand.cpu_milli,
                    demand.memory_mib,
                )
            )
    return out


@SETTINGS
@given(nodes(), st.lists(demands(), max_size=8), demands())
def test_fit_says_no_only_when_no_share_exists(node: Node, warmup: list[Demand], demand: Demand) -> None:
    state = NodeState.empty(node)
    for k, d in enumerate(warmup):
        found = fit(d, state)
        if found:
            state = state.apply(f"w{k}", found.allocations[0])
    if demand.gpu.count > 1:
        return
    found = fit(demand, state)
    possible = []
    for alloc in (
        _all_single_shares(demand, state)
        if demand.gpu.kind is not GpuKind.NONE
        else [Allocation(node.name, (), demand.cpu_milli, demand.memory_mib)]
    ):
        try:
            state.apply("probe", alloc)
            possible.append(alloc)
        except RecordError:
            pass
    assert bool(found) == bool(possible), (found.reason, possible)


@st.composite
def mig_nodes(draw: st.DrawFn) -> Node:
    """One to four GPUs, every one in MIG mode (static or dynamic), of MIG-capable models."""
    devs = tuple(draw(devices(i, mig_only=True)) for i in range(draw(st.integers(1, 4))))  # type: ignore[misc]
    return Node("m", 10**6, 10**7, devs)


@SETTINGS
@given(mig_nodes(), st.lists(st.tuples(demands(), st.booleans()), max_size=12), st.integers(1, 4))
def test_whole_gpus_listing_mig_take_one_free_instance_per_gpu(
    node: Node, steps: list[tuple[Demand, bool]], count: int
) -> None:
    """Whole GPUs for a pod listing mig, among MIG profiles, shares and other whole GPUs coming
    and going on MIG GPUs: fit finds them exactly when as many GPUs each have a free instance
    (brute force: every instance the GPU could give a whole GPU), each on its own GPU; the
    state stays within capacity (MIG instances never overlap) and the board's filter agrees."""
    state = NodeState.empty(node)
    whole = Demand(0, 0, GpuRequest(GpuKind.WHOLE, count, sharing=frozenset({SharingMode.MIG})))
    one = Demand(0, 0, GpuRequest(GpuKind.WHOLE, 1, sharing=frozenset({SharingMode.MIG})))
    for k, (demand, release) in enumerate([*steps, (whole, False), (whole, False)]):
        if release and state.pods:
            state = state.release(state.pods[0][0])
            continue
        found = fit(whole, state)
        hosting = set()
        for alloc in _all_single_shares(one, state):
            try:
                state.apply("probe", alloc)
                hosting.add(alloc.shares[0].index)
            except RecordError:
                pass
        assert bool(found) == (len(hosting) >= count), (found.reason, hosting)
        assert not fit(Demand(0, 0, GpuRequest(GpuKind.WHOLE, 1)), state)  # any: never a MIG instance
        board = Board([state])
        assert (Status(int(board.filter(make_policy("binpack"), whole).status[0])) is Status.FITS) == bool(found)
        for alloc in found.allocations:
            assert len({s.index for s in alloc.shares}) == count == len(alloc.shares)
            assert all(s.mig is not None and s.index in hosting for s in alloc.shares)
        placed = fit(demand, state)
        if placed:
            before = state
            state = state.apply(f"p{k}", placed.allocations[-1])
            assert_within_capacity(state)
            assert state.release(f"p{k}") == before


@SETTINGS
@given(st.lists(nodes(), min_size=1, max_size=3), demands(), st.sampled_from(sorted(REGISTRY)))
def test_scores_stay_in_0_100(node_list: list[Node], demand: Demand, name: str) -> None:
    policy = make_policy(name)
    for node in node_list:
        result = evaluate(policy, demand, NodeState.empty(node))
        if not isinstance(result, str):
            assert 0 <= result.score <= 100


@st.composite
def crowded(draw: st.DrawFn) -> tuple[Node, list[Demand]]:
    """One sharing mode, one or two GPUs, many small requests: the limits are reached often."""
    model = draw(st.sampled_from(["A100-80GB", "A30", "H200-141GB"]))
    mode = draw(st.sampled_from(["mps", "time-slicing", "mig", "exclusive"]))
    gpus = draw(st.integers(1, 2))
    node = Node(
        "n",
        10**6,
        10**7,
        tuple(
            make_device(
                i, model, mode, uuid=f"g{i}", mps_client_limit=draw(st.integers(1, 4)), replicas=draw(st.integers(1, 4))
            )
            for i in range(gpus)
        ),
        max_pods=100,
        mps_compute_oversub_pct=draw(st.sampled_from([100, 150])),
        ts_memory_oversub_pct=draw(st.sampled_from([100, 200])),
    )
    layout = CATALOG[model].mig
    assert layout is not None
    small = st.builds(lambda m: Demand(0, 0, GpuRequest(GpuKind.SHARE, 1, fraction_milli=m)), st.integers(1, 400))
    sized = st.builds(
        lambda mem, c: Demand(0, 0, GpuRequest(GpuKind.SHARE, 1, memory_mib=mem, compute_milli=c)),
        st.integers(1, 40_000),
        st.integers(0, 500),
    )
    profiles = st.builds(
        lambda p: Demand(0, 0, GpuRequest(GpuKind.MIG, 1, profile=ProfileSpec.parse(p.name))),
        st.sampled_from(layout.profiles),
    )
    return node, draw(st.lists(small | sized | profiles, min_size=5, max_size=40))


@SETTINGS
@given(crowded(), st.randoms(use_true_random=False))
def test_crowded_devices_never_exceed_their_limits(case: tuple[Node, list[Demand]], rnd: object) -> None:
    node, requests = case
    state = NodeState.empty(node)
    for k, demand in enumerate(requests):
        found = fit(demand, state)
        if found:
            state = state.apply(f"p{k}", found.allocations[rnd.randrange(len(found.allocations))])  # type: ignore[attr-defined]
        elif state.pods and rnd.random() < 0.3:  # type: ignore[attr-defined]
            state = state.release(state.pods[rnd.randrange(len(state.pods))][0])  # type: ignore[attr-defined]
        assert_within_capacity(state)


@SETTINGS
@given(nodes(), st.lists(demands(), min_size=1, max_size=12), st.sampled_from(sorted(REGISTRY)))
def test_part_of_a_gpu_takes_an_exclusive_gpu_only_when_the_pod_accepts_one(
    node: Node, requests: list[Demand], policy_name: str
) -> None:
    # Given whole, an exclusive GPU would waste the rest of itself on part of a request: no
    # policy may place part of a GPU there unless the pod's sharing lists exclusive.
    policy = make_policy(policy_name)
    state = NodeState.empty(node)
    for k, demand in enumerate(requests):
        placed = evaluate(policy, demand, state)
        if isinstance(placed, str):
            continue
        gpu = demand.gpu
        for share in placed.allocation.shares:
            device = node.devices[share.index]
            if device.mode is SharingMode.EXCLUSIVE and gpu.kind is GpuKind.SHARE:
                memory, compute = gpu.share_on(device)
                whole = (memory, compute) == (device.memory_mib, 1000)
                assert whole or SharingMode.EXCLUSIVE in gpu.sharing, (demand, device)
        state = state.apply(f"p{k}", placed.allocation)


def small_shares() -> st.SearchStrategy[Demand]:
    """Shares small in memory or in compute: many fit on one GPU, so client limits, replicas
    and the compute sum bind before memory does."""
    return st.builds(
        lambda milli, memory, compute: Demand(
            0, 0, GpuRequest(GpuKind.SHARE, 1, fraction_milli=milli, memory_mib=memory, compute_milli=compute)
        ),
        st.just(0) | st.integers(1, 300),
        st.just(0) | st.integers(1, 4_096),
        st.just(0) | st.integers(100, 1_000),
    ).filter(lambda d: bool(d.gpu.fraction_milli) != bool(d.gpu.memory_mib or d.gpu.compute_milli))


@SETTINGS
@given(
    nodes(),
    st.lists(demands() | small_shares(), max_size=10),
    st.lists(st.tuples(demands() | small_shares(), st.integers(0, 8_000)), min_size=1, max_size=10),
    demands() | small_shares(),
)
def test_f_after_a_placement_is_the_full_sum(
    node: Node, warmup: list[Demand], shapes: list[tuple[Demand, int]], demand: Demand
) -> None:
    """F after a placement, worked out from the state's kept terms and counts and the one GPU
    that changes, is exactly (not nearly) F of the placed state's profiles summed afresh: for
    every candidate, on states the workload's multi-GPU shapes cross (and asked twice)."""
    state = NodeState.empty(node)
    for k, d in enumerate(warmup):
        found = fit(d, state)
        if found:
            state = state.apply(f"w{k}", found.allocations[-1])
    typical = [(Demand(cpu, 0, d.gpu), 1.0 / len(shapes)) for d, cpu in shapes]
    typical += [(Demand(0, 0, GpuRequest(GpuKind.WHOLE, n)), 0.1) for n in (2, 3)]
    frag = Fragmentation(TypicalWorkload(tuple(typical)))
    for alloc in fit(demand, state).allocations:
        after = state.apply("p", alloc)
        fresh = frag.frag(
            [frag.device_profile(node, d, u) for d, u in zip(node.devices, after.usage, strict=True)], after.cpu_free
        )
        assert frag.frag_after(state, alloc) == fresh
        assert frag.frag_after(state, alloc) == fresh


@SETTINGS
@given(
    nodes(),
    st.lists(demands() | small_shares(), max_size=10),
    st.lists(
        st.tuples(demands() | small_shares(), st.sampled_from([(), ("H100-80GB",), ("L4", "A30")])),
        min_size=1,
        max_size=12,
    ),
    st.lists(st.sampled_from([0, 0, 1, 5_000, 40_000]), min_size=4, max_size=4),
)
def test_the_fragmentation_mask_is_fits_answer_shape_by_shape(
    node: Node, warmup: list[Demand], shapes: list[tuple[Demand, tuple[str, ...]]], strays: list[int]
) -> None:
    """Which typical shapes a device state can host, every shape at once (shares_fit), is
    what hosts() answers one shape at a time: MPS and time-slicing GPUs, with and without
    stray memory and model selectors; the other modes ask hosts() anyway."""
    devices = tuple(replace(d, stray_memory_mib=s) for d, s in zip(node.devices, strays, strict=False))
    node = replace(node, devices=devices)
    state = NodeState.empty(node)
    for k, d in enumerate(warmup):
        found = fit(d, state)
        if found:
            state = state.apply(f"w{k}", found.allocations[0])
    listed = [Demand(d.cpu_milli, 0, replace(d.gpu, models=models)) for d, models in shapes]
    if not any(d.gpu.kind is not GpuKind.NONE for d in listed):
        return
    frag = Fragmentation(TypicalWorkload(tuple((d, 1 / len(listed)) for d in listed)))
    for device, usage in zip(node.devices, state.usage, strict=True):
        expected = sum(
            1 << i for i, d in enumerate(listed) if d.gpu.kind is not GpuKind.NONE and hosts(d.gpu, node, device, usage)
        )
        assert frag.device_profile(node, device, usage)[1] == expected, (device.mode, usage, listed)


@given(
    st.integers(0, 40).flatmap(
        lambda n: st.lists(st.lists(st.integers(-1, 5), min_size=3, max_size=3), min_size=n, max_size=n)
    )
)
def test_the_boards_distinct_rows_are_numpys(rows: list[list[int]]) -> None:
    """The board groups nodes by (kind, device states) with one sort of the columns; it must
    answer exactly as np.unique over rows (the distinct rows, first occurrences, places)."""
    array = np.array(rows, dtype=np.int64).reshape(-1, 3)
    unique, first, inverse = unique_rows(array)
    want_unique, want_first, want_inverse = np.unique(array, axis=0, return_index=True, return_inverse=True)
    assert unique.tolist() == want_unique.tolist()
    assert first.tolist() == want_first.tolist()
    assert inverse.tolist() == want_inverse.reshape(-1).tolist()


@given(
    st.lists(st.integers(-(2**40), 2**40) | st.integers(-3, 40), max_size=300),
    st.sampled_from([(-1,), (-1, 3), (3, -1)]),
)
def test_the_boards_distinct_values_are_numpys(values: list[int], shape: tuple[int, ...]) -> None:
    """The board lists the device states, node kinds and texts met with one sort; it must
    answer exactly as np.unique (the values, ascending, of any shape flattened, in its dtype)."""
    array = np.array(values, dtype=np.int64)
    if len(shape) > 1:
        array = array[: len(array) - len(array) % 3].reshape(shape)
    got, want = distinct(array), np.unique(array)
    assert got.dtype == want.dtype
    assert got.tolist() == want.tolist()


@given(st.integers(1, 3000), st.lists(st.integers(0, 10**6), max_size=400), st.sampled_from([(-1,), (-1, 4)]))
def test_places_among_distinct_ids_are_numpys(bound: int, values: list[int], shape: tuple[int, ...]) -> None:
    """fgd's terms are looked up per distinct (GPU profile, feasible shapes) pair: marked in a
    table where the ids are few, sorted otherwise; either must answer as np.unique with its
    inverse (the values ascending, each value's place, in the values' shape)."""
    array = np.array([v % bound for v in values], dtype=np.int64)
    if len(shape) > 1:
        array = array[: len(array) - len(array) % 4].reshape(shape)
    unique, inverse = unique_inverse(array, bound)
    want_unique, want_inverse = np.unique(array, return_inverse=True)
    assert unique.tolist() == want_unique.tolist()
    assert inverse.shape == array.shape
    assert inverse.reshape(-1).tolist() == want_inverse.reshape(-1).tolist()


def _busy_states(drawn: list[tuple[Node, list[int], list[int]]], warmup: list[Demand], stray: int) -> list[NodeState]:
    """Node ``k`` of ``drawn`` (named ``n{k}``), with ``stray`` MiB of stray memory on the GPUs
    listed first and the GPUs listed second unhealthy, holding every other pod of ``warmup``
    that fits (the even ones on even nodes, the odd ones on odd nodes)."""
    states = []
    for k, (node, strays, sick) in enumerate(drawn):
        devices = tuple(
            replace(d, stray_memory_mib=stray if d.index in strays else 0, healthy=d.index not in sick)
            for d in node.devices
        )
        state = NodeState.empty(replace(node, name=f"n{k}", devices=devices))
        for j, demand in enumerate(warmup):
            found = fit(demand, state)
            if found and (j + k) % 2 == 0:
                state = state.apply(f"p{j}", found.allocations[0])
        states.append(state)
    return states


BUSY_NODES = st.lists(
    st.tuples(nodes(), st.lists(st.integers(0, 3)), st.lists(st.integers(0, 3))), min_size=1, max_size=4
)


def _fresh_fit(demand: Demand, state: NodeState) -> str:
    """fit's reason for ``state`` with its tables empty, as if no other node had been asked."""
    fit_module._SHARES.clear()
    mig_module._COVERED.clear()
    return fit(demand, state).reason


@given(
    BUSY_NODES,
    st.lists(demands(), max_size=10),
    st.lists(demands(), min_size=1, max_size=4),
    st.integers(0, 30_000),
)
@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
def test_the_boards_filter_answers_as_fit_node_by_node(
    drawn: list[tuple[Node, list[int], list[int]]], warmup: list[Demand], asked: list[Demand], stray: int
) -> None:
    """The board asks whether a GPU state can take a share of every MPS and time-slicing state
    at once (capacity.rows_fit) and of the others one by one: per node, its filter must say
    what fit says (fits or not, and the same reason), on nodes with stray memory and
    unhealthy GPUs among the rest, as pods come and go. Both keep answers per GPU state (its
    kind and usage, not which GPU of which node holds it): a node's reason, asked after every
    node, must also read as asked of that node first."""
    states = _busy_states(drawn, warmup, stray)
    board = Board(states)
    policy = make_policy("binpack")
    for demand in asked:
        after_all = [fit(demand, state) for state in states]
        outcomes = board.filter(policy, demand)
        for k, state in enumerate(states):
            found = after_all[k]
            status = Status(int(outcomes.status[k]))
            assert (status is Status.FITS) == bool(found), (k, found.reason)
            assert found.reason == _fresh_fit(demand, state), k
            if status is Status.UNSCHEDULABLE:
                assert outcomes.texts[outcomes.reason[k]] == found.reason
                assert "%" not in found.reason  # it reaches Go's fmt in kube-scheduler
            elif status is Status.UNRESOLVABLE:
                assert not fit(demand, NodeState.empty(state.node))
        # one node changes: the board follows
        placed = fit(demand, states[0])
        if placed:
            states[0] = states[0].apply(f"q{len(states[0].pods)}", placed.allocations[0])
            board.put(states[0])


@given(
    BUSY_NODES,
    st.lists(demands(), max_size=10),
    st.lists(demands(), min_size=1, max_size=4),
    st.integers(0, 30_000),
    st.sampled_from(["binpack", "bestfit"]),
)
@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
def test_scores_by_what_a_share_takes_equal_scores_one_by_one(
    drawn: list[tuple[Node, list[int], list[int]]], warmup: list[Demand], asked: list[Demand], stray: int, name: str
) -> None:
    """A policy's ``score_took`` (every node at once, by the share that takes the most of its
    hosting GPUs) must give exactly the scores that asking it placement by placement gives,
    on nodes in every sharing mode with pods on them, stray memory and unhealthy GPUs."""
    states = _busy_states(drawn, warmup, stray)
    policy = make_policy(name)
    assert capabilities(policy).score_took is not None
    at_once, plain = Board(states), Board(states)
    for demand in asked:
        expected = plain.scores(without(policy, ScoringTook, ScoringWithoutGpu), demand)
        assert at_once.scores(policy, demand).tolist() == expected.tolist(), demand


@given(
    BUSY_NODES,
    st.lists(demands() | small_shares(), max_size=10),
    st.lists(st.tuples(demands() | small_shares(), st.integers(0, 8_000)), min_size=1, max_size=8),
    st.lists(demands() | small_shares(), min_size=1, max_size=4),
    st.sampled_from(["fgd-cpu", "fgd-reserve"]),
    st.sampled_from([0.0, 4.0]),
)
@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
def test_scores_of_many_nodes_at_once_equal_scores_one_by_one(
    drawn: list[tuple[Node, list[int], list[int]]],
    warmup: list[Demand],
    shapes: list[tuple[Demand, int]],
    asked: list[Demand],
    name: str,
    stranding: float,
) -> None:
    """A policy's ``score_nodes`` (F after every candidate worked out at once, the costs over
    arrays) must give exactly what scoring the candidates one by one gives, node by node: the
    best score and the gap move of the candidate the tiebreak picks; on nodes in every sharing
    mode with pods, stray memory and unhealthy GPUs, against workloads with multi-GPU shapes
    and CPU requests (which the stranding term reads)."""
    states = _busy_states(drawn, warmup, 0)
    workload = tuple(Shape(weight=1.0, cpu=cpu, gpu_count=str(n)) for n in (2, 3) for cpu in (0, 8))
    workload += tuple(shape for d, cpu in shapes if (shape := _shape_of(d, cpu)) is not None)
    options = options_of(name)(workload=workload, stranding_weight=stranding, learn=False)
    policy = make_policy(name, options)
    for demand in asked:
        single = demand.gpu.kind is not GpuKind.NONE and demand.gpu.count <= 1
        if not single:
            continue
        nodes = []
        for state in states:
            found = fit(Demand(0, 0, demand.gpu), state)
            if found:  # as the board makes them: the pod's CPU and memory with each share
                made = [replace(a, cpu_milli=demand.cpu_milli, memory_mib=demand.memory_mib) for a in found.allocations]
                nodes.append((state, firsts(state, made)))
        expected = [score_firsts(policy, demand, state, allocs) for state, allocs in nodes]
        values, moves = policy.score_nodes(demand, share_candidates(nodes))  # type: ignore[attr-defined]
        got = list(zip(values.tolist(), map(tuple, moves.tolist()), strict=True))
        assert [(s.score, s.move) for s in expected] == got, demand
        # asked again (the node states now kept, their profiles numbered), the same
        again, moved = policy.score_nodes(demand, share_candidates(nodes))  # type: ignore[attr-defined]
        assert list(zip(again.tolist(), map(tuple, moved.tolist()), strict=True)) == got, demand


@given(
    BUSY_NODES,
    st.lists(demands() | small_shares(), max_size=10),
    st.lists(demands() | small_shares(), min_size=1, max_size=4),
    st.sampled_from(["fgd-cpu", "fgd-reserve"]),
)
@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
def test_the_board_scores_many_nodes_at_once_as_one_by_one(
    drawn: list[tuple[Node, list[int], list[int]]], warmup: list[Demand], asked: list[Demand], name: str
) -> None:
    """The board hands a policy's ``score_nodes`` the candidates as arrays (the first GPU of
    each device state that hosts the share, labelled by device state, the share placed per
    label): its finished scores, which read the gap moves too, must be those of scoring the
    same candidates one by one, as nodes change."""
    states = _busy_states(drawn, warmup, 0)
    # one policy per board, told the same: a policy learns from what it is asked (fgd-reserve
    # follows the CPU the pods ask and the GPU the cluster frees between calls), so a policy
    # shared by the two boards would be asked by the second in another state than by the first
    policy, twin = make_policy(name), make_policy(name)
    at_once, one_by_one = Board(states), Board(states)
    with patch.object(nodescores, "_AT_ONCE_FROM", 1):  # the tests' clusters are small
        for k, demand in enumerate(asked):
            tell(policy, demand)
            tell(twin, demand)
            expected = one_by_one.scores(without(twin, ScoringNodes, ScoringWithoutGpu), demand)
            assert at_once.scores(policy, demand).tolist() == expected.tolist(), demand
            placed = fit(demand, states[-1])
            if placed:
                states[-1] = states[-1].apply(f"q{k}", placed.allocations[0])
                at_once.put(states[-1])
                one_by_one.put(states[-1])


def _shape_of(demand: Demand, cpu: int) -> Shape | None:
    """A typical shape of one share like ``demand``'s (a fraction or a memory size), asking
    ``cpu`` milli-CPU; None for other requests."""
    gpu = demand.gpu
    if gpu.kind is not GpuKind.SHARE:
        return None
    if gpu.fraction_milli:
        return Shape(weight=1.0, cpu=f"{cpu}m", gpu_fraction=f"{gpu.fraction_milli / 1000:.3f}")
    if gpu.memory_mib:
        return Shape(weight=1.0, cpu=f"{cpu}m", gpu_memory=str(gpu.memory_mib))
    return None


@st.composite
def shared_gpus(draw: st.DrawFn) -> tuple[Node, DeviceUsage]:
    """A node of one MPS or time-slicing GPU (stray memory or none) and what the GPU holds."""
    device = draw(devices(0).filter(lambda d: d.mode in (SharingMode.MPS, SharingMode.TIME_SLICING)))  # type: ignore[attr-defined]
    total = device.memory_mib
    device = replace(device, stray_memory_mib=draw(st.just(0) | st.integers(0, total)))
    node = Node(
        "n",
        64_000,
        64_000,
        (device,),
        30,
        frozenset(),
        draw(st.sampled_from([100, 150])),
        draw(st.sampled_from([100, 200])),
    )
    shares = draw(st.integers(0, 7))
    usage = DeviceUsage(
        draw(st.integers(0, 2 * total)) if shares else 0,
        draw(st.integers(0, 1500)) if shares else 0,
        shares,
        shares == 1 and draw(st.booleans()),
    )
    return node, usage


@given(shared_gpus(), st.integers(-1, 150_000), st.integers(-1, 1001), st.booleans())
def test_one_share_is_the_rules_of_arrays_over_one_row(
    gpu: tuple[Node, DeviceUsage], memory: int, compute: int, mig: bool
) -> None:
    """The mode's refusal of one share (modes.shared: the rules over one row) answers as the
    rules of arrays over many rows do: whether it fits, the free memory its refusal reports and
    what it finds short."""
    node, usage = gpu
    device = node.devices[0]
    slot = MigSlot(0, 1, 1, "1g.10gb") if mig else None
    share = DeviceShare(device.uuid, 0, device.mode, memory, compute, slot)
    rules = modes.of(device.mode)
    why = rules.refusal(node, device, usage, share) or rules.stray_refusal(node, device, usage, share)
    assert rules.why_not(node, device, usage, share) == why  # the two asked at once, as fit asks them
    rows = np.array([usage_row(node, device, usage)] * 2, dtype=np.int64)  # the state, beside itself
    m, c = np.array([memory, memory]), np.array([compute, compute])
    fits = rows_fit(rows, m, c).tolist()
    assert fits[0] == fits[1]
    if mig and why is not None and why.text.endswith("is not in MIG mode"):
        return  # a MIG slot on a GPU outside MIG mode: no share of the rules of arrays
    assert fits[0] == (why is None), (usage, memory, compute, why)
    if why is not None:
        assert rows_refused_free(rows, m, c).tolist()[0] == why.free_mib
        what, need = rows_shortages(rows, m, c)
        assert (int(need[0]) if int(what[0]) == SHORT_MEMORY else None) == why.need_mib


@given(BUSY_NODES, st.lists(st.tuples(demands(), st.integers(0, 3), st.booleans()), min_size=1, max_size=16))
@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
def test_a_board_following_its_nodes_equals_one_made_afresh(
    drawn: list[tuple[Node, list[int], list[int]]], steps: list[tuple[Demand, int, bool]]
) -> None:
    """A node put again in another state (a bind, a hold, a pod gone) has only its GPUs whose
    usage changed asked again: its device states, the gap histograms (in all and per group) and
    the node's signature end as a board made afresh from the same states has them."""
    from scheduler.core.capacity import device_key
    from scheduler.core.columns import signature

    states = _busy_states(drawn, [], 0)
    board = Board(states)
    for k, (demand, at, leave) in enumerate(steps):
        i = at % len(states)
        state = states[i]
        if leave and state.pods:
            state = state.release(state.pods[0][0])
        else:
            found = fit(demand, state)
            if not found:
                continue
            state = state.apply(f"s{k}", found.allocations[-1])
        states[i] = state
        board.put(state)
    fresh = Board(states)
    ours, theirs = board._columns, fresh._columns
    assert board.gaps.tolist() == fresh.gaps.tolist()
    assert ours.histograms.group_gaps.tolist() == theirs.histograms.group_gaps.tolist()
    for i, state in enumerate(states):
        got = [device_key(*ours.dev_states.entry(int(d))) if d else None for d in ours.devs[i].tolist()]
        want = [device_key(*theirs.dev_states.entry(int(d))) if d else None for d in theirs.devs[i].tolist()]
        assert got == want, i
        assert got[: len(state.node.devices)] == [
            device_key(state.node, dev, use) for dev, use in zip(state.node.devices, state.usage, strict=True)
        ]
        assert ours.signatures.values[int(ours.signature[i])] == signature(int(ours.kind[i]), state)
