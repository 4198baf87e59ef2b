"""The fragmentation measure: small cases by hand, and the openb trace's 13.9%."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core import fragmentation as fragmentation_module
from scheduler.core.capacity import add_share, device_key
from scheduler.core.catalog import CATALOG, ProfileSpec, canonical_model_name, lookup_model
from scheduler.core.fit import fit, hosts
from scheduler.core.fragmentation import Fragmentation, TypicalWorkload
from scheduler.core.inventory import Device, Node, SharingMode
from scheduler.core.request import Demand, GpuKind, GpuRequest
from scheduler.core.state import NodeState
from scheduler.sim.datasets import openb_dir
from tests.builders import make_state, static_mig

OPENB = openb_dir(Path(__file__).resolve().parents[2])


def share(milli: int, cpu: int = 0) -> Demand:
    return Demand(cpu, 0, GpuRequest(GpuKind.SHARE, 1, fraction_milli=milli))


def whole(count: int, cpu: int = 0) -> Demand:
    return Demand(cpu, 0, GpuRequest(GpuKind.WHOLE, count))


def with_free(state: NodeState, *used: int) -> NodeState:
    for i, milli in enumerate(used):
        if milli:
            allocs = fit(share(milli), state).allocations
            state = state.apply(f"u{i}", next(a for a in allocs if a.shares[0].index == i))
    return state


def test_hand_derived_two_shapes() -> None:
    # GPUs free [1000, 400]. m1 = 0.5 GPU (p 0.5): GPU 0 hosts it, so F(m1) = 400 (GPU 1 cannot).
    # m2 = 2 whole GPUs (p 0.5): only one GPU is whole, so F(m2) = 1000 + 400 = 1400.
    # F = 0.5 x 400 + 0.5 x 1400 = 900.
    frag = Fragmentation(TypicalWorkload(((share(500), 0.5), (whole(2), 0.5))))
    state = with_free(make_state(gpus=2, mode="mps"), 0, 600)
    assert frag.node_frag(state) == pytest.approx(900)


def test_cpu_starved_node_is_all_fragment() -> None:
    # the typical pod needs 8 cores; the node has 4: every idle GPU is a fragment -> F = 2000
    frag = Fragmentation(TypicalWorkload(((share(500, cpu=8000), 1.0),)))
    assert frag.node_frag(make_state(gpus=2, mode="mps", cpu_milli=4000)) == pytest.approx(2000)
    assert frag.node_frag(make_state(gpus=2, mode="mps", cpu_milli=8000)) == pytest.approx(0)


def test_cpu_only_shape_sees_all_idle_gpu_as_fragment() -> None:
    # m = CPU-only (p 0.25), m' = 1 GPU (p 0.75); free [1000, 1000]: F = 0.25 x 2000 + 0.75 x 0 = 500
    frag = Fragmentation(TypicalWorkload(((Demand(1000, 0), 0.25), (whole(1), 0.75))))
    assert frag.node_frag(make_state(gpus=2, mode="mps")) == pytest.approx(500)


def test_model_restricted_shape() -> None:
    # a T4-only shape on an H100 node: F = all idle GPU (1000)
    frag = Fragmentation(TypicalWorkload(((Demand(0, 0, GpuRequest(GpuKind.WHOLE, 1, models=("T4",))), 1.0),)))
    assert frag.node_frag(make_state(gpus=1, mode="mps")) == pytest.approx(1000)


def test_mig_fragment_is_what_the_typical_profile_cannot_use() -> None:
    # A100-80GB, dynamic MIG, typical pod 3g.40gb. 3g@0 taken: 4 slots and 4 slices free -> free 500 milli
    # (min(4/8, 4/7) = 500); a second 3g still fits at 4, so F = 0. After a 1g lands at 4 the 3g cannot
    # start anywhere: the free 3 slots / 3 slices (min(375, 428) = 375) are all fragment.
    three = Demand(0, 0, GpuRequest(GpuKind.MIG, 1, profile=ProfileSpec.parse("3g.40gb")))
    one = Demand(0, 0, GpuRequest(GpuKind.MIG, 1, profile=ProfileSpec.parse("1g.10gb")))
    frag = Fragmentation(TypicalWorkload(((three, 1.0),)))
    state = make_state(mode="mig", model="A100-80GB")
    state = state.apply("a", fit(three, state).allocations[0])
    assert frag.node_frag(state) == pytest.approx(0)
    state = state.apply("b", fit(one, state).allocations[0])
    assert frag.node_frag(state) == pytest.approx(375)


def test_typical_workload_from_demands_covers_95_percent() -> None:
    # 60 x A, 30 x B, 6 x C, 4 x D: A + B = 90% < 95%, + C = 96% -> A, B, C renormalised over 96 pods
    demands = [share(500)] * 60 + [whole(1)] * 30 + [share(250)] * 6 + [whole(2)] * 4
    workload = TypicalWorkload.from_demands(demands)
    assert [(d.gpu.kind, round(p, 4)) for d, p in workload.shapes] == [
        (GpuKind.SHARE, round(60 / 96, 4)),
        (GpuKind.WHOLE, round(30 / 96, 4)),
        (GpuKind.SHARE, round(6 / 96, 4)),
    ]


def test_a_typical_workload_keeps_at_most_its_limit_of_shapes() -> None:
    # every pod a share of its own size (as when each asks a GPU memory of its own), the first
    # 10 seen three times: 95% of the 320 pods would need 284 shapes; the limit keeps the most
    # popular
    demands = [share(m) for m in range(1, 11)] * 2 + [share(m) for m in range(1, 301)]
    workload = TypicalWorkload.from_demands(demands)
    assert len(workload.shapes) == fragmentation_module.MAX_SHAPES == 256
    top = TypicalWorkload.from_demands(demands, limit=3)
    # equal counts go to the larger key first: sizes 10, 9, 8 (three pods each), renormalised
    assert [(d.gpu.fraction_milli, p) for d, p in top.shapes] == [(10, 1 / 3), (9, 1 / 3), (8, 1 / 3)]
    assert sum(p for _, p in workload.shapes) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="limit of at least one shape"):
        TypicalWorkload.from_demands(demands, limit=0)


@pytest.mark.skipif(not OPENB.is_dir(), reason=f"the openb trace is not at {OPENB} (see the README)")
def test_openb_default_empty_cluster_frag_rate_is_13_9_percent() -> None:
    nodes = []
    with (OPENB / "openb_node_list_gpu_node.csv").open() as f:
        for row in csv.DictReader(f):
            model = lookup_model(row["model"], 16384)  # fractions make the memory size irrelevant here
            devices = tuple(
                Device(f"{row['sn']}-{i}", i, model, SharingMode.MPS, mps_client_limit=1000)
                for i in range(int(row["gpu"]))
            )
            nodes.append(Node(row["sn"], int(row["cpu_milli"]), int(row["memory_mib"]), devices, 10**6))
    demands = []
    with (OPENB / "openb_pod_list_default.csv").open() as f:
        for row in csv.DictReader(f):
            n, milli = int(row["num_gpu"]), int(row["gpu_milli"])
            models = tuple(canonical_model_name(m) for m in row["gpu_spec"].split("|") if m)
            gpu = (
                GpuRequest()
                if n == 0
                else GpuRequest(GpuKind.WHOLE, n, models=models)
                if milli == 1000
                else GpuRequest(GpuKind.SHARE, 1, fraction_milli=milli, models=models)
            )
            demands.append(Demand(int(row["cpu_milli"]), int(row["memory_mib"]), gpu))
    workload = TypicalWorkload.from_demands(demands)
    assert len(workload.shapes) == 35  # the FGD paper: 35 shapes cover 95.26% of the default trace's pods
    frag = Fragmentation(workload)
    fragmented = sum(frag.node_frag(NodeState.empty(n)) for n in nodes)
    idle = 1000 * sum(len(n.devices) for n in nodes)
    assert idle == 6_212_000
    assert 100 * fragmented / idle == pytest.approx(13.9, abs=0.05)


def test_catalog_has_the_models_the_issue_names() -> None:
    for name in (
        "A100-40GB",
        "A100-80GB",
        "A30",
        "H100-80GB",
        "H200-141GB",
        "L4",
        "T4",
        "V100-16GB",
        "V100-32GB",
        "A10",
        "P100",
    ):
        assert name in CATALOG
    unknown = lookup_model("B300-PROTO", 200_000, 160)
    assert (unknown.memory_mib, unknown.sm_count, unknown.mig) == (200_000, 160, None)
    with pytest.raises(ValueError, match="needs its memory"):
        lookup_model("B300-PROTO")


def test_profiles_are_kept_per_state_boundedly(monkeypatch: pytest.MonkeyPatch) -> None:
    """The profiles of the states asked about lately, and their F and free share, are kept for
    the next request shape, at most so many at once, and always those of the state asked about
    (not of one it replaced)."""
    monkeypatch.setattr(fragmentation_module, "_STATES_KEPT", 3)
    frag = Fragmentation(TypicalWorkload(((share(500), 0.5), (whole(2), 0.5))))
    base = make_state(gpus=2, mode="mps")
    states = [with_free(base, 100 * k, 0) for k in range(8)]  # one node, eight states of it
    for state in states + states[::-1] + states:
        fresh = Fragmentation(frag.workload)
        got = frag.profiles(state)
        assert got == fresh.profiles(state) and got[0][0] == 1000 - 100 * states.index(state)
        assert frag.node_frag(state) == fresh.frag(got, state.cpu_free)
        assert frag.free_share(state) == 2000 - 100 * states.index(state)
        assert len(frag._by_state) <= 3
    assert frag.profiles(states[-1]) is frag.profiles(states[-1])  # kept, not worked out again


def test_node_frags_of_a_list_asked_again_follow_its_states() -> None:
    """node_frags of the same list asked twice gives the same; a list whose states changed in
    between (a node's state replaced, a node added) is asked about its states as they are."""
    frag = Fragmentation(TypicalWorkload(((share(500), 0.5), (whole(2), 0.5))))
    base = make_state(gpus=2, mode="mps")
    states = [with_free(base, 100 * k, 300) for k in range(4)]
    labels = np.array([[2 * k, 2 * k + 1] for k in range(4)])  # every GPU state its own label
    first = frag.node_frags(states, labels)
    again = frag.node_frags(states, labels)
    expected = ([frag.node_frag(s) for s in states], [frag.free_share(s) for s in states])
    assert [x.tolist() for x in first] == [x.tolist() for x in again] == [list(e) for e in expected]
    states[1] = with_free(base, 700, 300)  # the same list, one node's state replaced
    changed = frag.node_frags(states, labels)
    assert changed[1].tolist() == [frag.free_share(s) for s in states]
    assert changed[1][1] == 2000 - 700 - 300 and changed[0][1] == Fragmentation(frag.workload).node_frag(states[1])
    states.append(with_free(base, 0, 0))  # and a node more
    assert frag.node_frags(states, np.vstack([labels, [[8, 9]]]))[1].tolist()[-1] == 2000


def _mig_shape(profile: str, models: tuple[str, ...] = ()) -> Demand:
    return Demand(0, 0, GpuRequest(GpuKind.MIG, 1, profile=ProfileSpec.parse(profile), models=models))


def test_a_mig_gpu_is_asked_once_per_question_as_every_shape_would_answer() -> None:
    """On a MIG GPU the typical shapes that ask the same of it (the same covering profiles) are
    asked once, and those it never hosts not at all: its profile is still what asking every
    shape gives, on MIG GPUs dynamic, static and unhealthy, of two models, in many states."""
    sizes = [50, 100, 140, 150, 250, 300, 400, 430, 500, 600, 860, 1000]
    shapes = [share(m) for m in sizes]
    shapes += [
        Demand(0, 0, GpuRequest(GpuKind.SHARE, 1, memory_mib=mib)) for mib in (5_000, 10_240, 20_000, 41_000, 90_000)
    ]
    shapes += [_mig_shape(p) for p in ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1g.6gb")]
    shapes += [_mig_shape("1g.10gb", ("A100-80GB",)), whole(1), whole(2)]
    shapes += [Demand(0, 0, GpuRequest(GpuKind.SHARE, 1, fraction_milli=250, models=("H100-80GB",)))]
    shapes += [Demand(0, 0, GpuRequest(GpuKind.SHARE, 1, fraction_milli=250, sharing=frozenset({SharingMode.MPS})))]
    frag = Fragmentation(TypicalWorkload(tuple((d, 1 / len(shapes)) for d in shapes)))
    static = static_mig("A100-80GB", ("3g.40gb", 4), ("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3))
    nodes = [
        make_state(name="h", gpus=2, mode="mig", model="H100-80GB"),
        make_state(name="a", gpus=2, mode="mig", model="A100-80GB"),
        make_state(name="s", gpus=1, mode="mig", model="A100-80GB", device_options={"mig_instances": static}),
        make_state(name="u", gpus=1, mode="mig", model="H100-80GB", device_options={"healthy": False}),
    ]
    placed = [_mig_shape("1g.10gb"), share(250), _mig_shape("3g.40gb"), share(100), _mig_shape("2g.20gb")]
    asked = 0
    for state in nodes:
        for k, demand in enumerate(placed * 2):
            node = state.node
            for device, usage in zip(node.devices, state.usage, strict=True):
                every = sum(1 << i for i, d in enumerate(shapes) if hosts(d.gpu, node, device, usage))
                assert frag.device_profile(node, device, usage)[1] == every, (node.name, usage)
                asked += 1
            found = fit(demand, state)
            if found:
                state = state.apply(f"p{k}", found.allocations[0])
    assert asked == 10 * 6 and len(frag._questions(nodes[0].node.devices[0])) < len(shapes) // 2


def test_warming_gives_the_profiles_asked_one_by_one() -> None:
    """The profiles that candidate placements would leave, worked out all at once (MPS and
    time-slicing GPUs), are those asked one by one; MIG, exclusive and unhealthy GPUs are left
    to be asked one by one, and still answer the same."""
    ts_only = GpuRequest(GpuKind.SHARE, 1, fraction_milli=200, sharing=frozenset({SharingMode.TIME_SLICING}))
    workload = TypicalWorkload(
        (
            (share(100), 0.2),
            (Demand(1000, 0), 0.05),
            (Demand(0, 0, ts_only), 0.05),
            (share(450), 0.2),
            (whole(1), 0.2),
            (whole(2), 0.1),
            (Demand(0, 0, GpuRequest(GpuKind.SHARE, 1, memory_mib=30_000)), 0.2),
        )
    )
    states = [
        make_state(name="mps", gpus=2, mode="mps"),
        make_state(name="ts", gpus=2, model="L4", mode="time-slicing", device_options={"replicas": 3}),
        make_state(name="sick", gpus=2, mode="mps", device_options={"healthy": False}),
        make_state(name="ex", gpus=2),
        make_state(name="stray", gpus=2, mode="mps", device_options={"stray_memory_mib": 50_000}),
    ]
    states[0] = with_free(states[0], 300, 0)
    candidates = []
    for demand in (share(100), share(250), share(600), Demand(0, 0, GpuRequest(GpuKind.SHARE, 1, memory_mib=20_000))):
        for state in states:
            candidates.extend((state, alloc) for alloc in fit(demand, state).allocations)
    # an unhealthy GPU takes no share: placed there by hand, it is still asked the same
    candidates.extend((states[2], alloc) for alloc in fit(share(100), make_state(gpus=2, mode="mps")).allocations)
    candidates.extend((states[3], alloc) for alloc in fit(whole(1), states[3]).allocations)  # exclusive
    assert len(candidates) > 10
    warmed = Fragmentation(workload)
    warmed.warm(candidates)
    assert len(warmed._devices) >= 8  # worked out at once, not left for later
    for state, _ in candidates:  # the nodes' own states too, on their healthy shared GPUs
        for device, usage in zip(state.node.devices, state.usage, strict=True):
            if device.healthy and device.mode in (SharingMode.MPS, SharingMode.TIME_SLICING):
                assert device_key(state.node, device, usage) in warmed._devices
    fresh = Fragmentation(workload)
    for state, alloc in candidates:
        assert warmed.frag_after(state, alloc) == fresh.frag_after(state, alloc)
        for s in alloc.shares:
            device = state.node.devices[s.index]
            after = add_share(device, state.usage[s.index], s)
            assert warmed.device_profile(state.node, device, after) == fresh.device_profile(state.node, device, after)


def _too_few_one_by_one(multi: list[tuple[int, int]], bits: tuple[int, ...]) -> int:
    """The plain rule: a multi-GPU shape is out when fewer GPUs than it asks for can host it."""
    found = 0
    for bit, count in multi:
        if sum(1 for b in bits if b & bit) < count:
            found |= bit
    return found


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from([1, 2, 3, 4, 8, 16]), min_size=1, max_size=12),
    st.lists(st.integers(0, (1 << 13) - 1), min_size=1, max_size=16),
)
def test_too_few_gpus_is_the_plain_count(counts: list[int], bits: list[int]) -> None:
    """The multi-GPU shapes a node has too few GPUs for, counted for all shapes at once, are
    those counted shape by shape (GPUs as bit masks of the shapes each can host); and so are
    those once one GPU hosts other shapes, worked out from the node's counts, asked for every
    GPU and asked again (answers are kept: a GPU's answer must not be another's)."""
    shapes = tuple(
        (Demand(0, 0, GpuRequest(GpuKind.WHOLE, n) if n > 1 else GpuRequest(GpuKind.SHARE, 1, fraction_milli=250)), 1.0)
        for n in counts
    )
    frag = Fragmentation(TypicalWorkload(shapes))
    multi = [(1 << i, n) for i, n in enumerate(counts) if n > 1]
    if not multi:
        return
    mask = (1 << len(counts)) - 1
    node = tuple(b & mask for b in bits)
    assert frag._too_few(node) == _too_few_one_by_one(multi, node)
    kept = fragmentation_module._Kept(NodeState.__new__(NodeState), [(0, b) for b in node])
    for _ in range(2):
        for g in range(len(node)):
            for after in sorted({0, mask, *node}):
                changed = (*node[:g], after, *node[g + 1 :])
                assert frag._too_few_beside(kept, g, after) == _too_few_one_by_one(multi, changed), (g, after)
