"""MIG slot rules (NVIDIA's MIG user guide), and the traps of where an instance goes."""

from __future__ import annotations

import pytest

from scheduler.core.allocation import MigSlot
from scheduler.core.catalog import CATALOG, ProfileSpec
from scheduler.core.errors import RecordError
from scheduler.core.fit import fit
from scheduler.core.mig import best_start, free_starts, why_not
from scheduler.core.request import Demand, GpuKind, GpuRequest
from scheduler.core.state import NodeState
from tests.builders import make_node, make_state, static_mig

A100 = CATALOG["A100-80GB"].mig
assert A100 is not None


def profile(name: str):  # type: ignore[no-untyped-def]
    p = A100.profile(name)
    assert p is not None
    return p


def slots(*placed: tuple[str, int]) -> tuple[MigSlot, ...]:
    out = []
    for name, start in placed:
        p = profile(name)
        out.append(MigSlot(start, p.memory_slots, p.compute_slices, p.name))
    return tuple(sorted(out))


def mig_demand(name: str) -> Demand:
    return Demand(0, 0, GpuRequest(GpuKind.MIG, 1, profile=ProfileSpec.parse(name)))


def place_all(state: NodeState, names: list[str]) -> NodeState:
    for k, name in enumerate(names):
        found = fit(mig_demand(name), state)
        assert found, found.reason
        state = state.apply(f"p{k}", found.allocations[0])
    return state


def test_seven_1g_fill_seven_slots_and_leave_slot_7_idle() -> None:
    state = place_all(make_state(mode="mig", model="A100-80GB"), ["1g.10gb"] * 7)
    used = sorted(s.start for s in state.usage[0].mig)
    assert used == [0, 1, 2, 3, 4, 5, 6]  # a 1-slot 1g may not start at 7
    eighth = fit(mig_demand("1g.10gb"), state)
    assert not eighth
    assert "no free MIG slot for 1g.10gb" in eighth.reason


def test_first_1g_goes_where_a_3g_and_the_4g_can_still_follow() -> None:
    # At slot 0 it would block the 4g (legal only at 0) and one of the two 3g starts.
    assert best_start(A100, (), profile("1g.10gb")) == 6
    state = place_all(make_state(mode="mig", model="A100-80GB"), ["1g.10gb", "4g.40gb"])
    assert slots(("1g.10gb", 6), ("4g.40gb", 0)) == state.usage[0].mig


def test_1g_at_slot_0_versus_4_decides_whether_a_3g_fits() -> None:
    # 1g at 0: the 3g can still start at 4 (slots 4-7 free); 1g at 4: the 3g can still start at 0.
    assert free_starts(A100, slots(("1g.10gb", 0)), profile("3g.40gb")) == [4]
    assert free_starts(A100, slots(("1g.10gb", 4)), profile("3g.40gb")) == [0]
    # both 3g starts gone once 1g instances sit at 0 and 4
    assert free_starts(A100, slots(("1g.10gb", 0), ("1g.10gb", 4)), profile("3g.40gb")) == []


def test_4g_at_0_plus_3g_at_4_is_a_full_gpu() -> None:
    used = slots(("4g.40gb", 0), ("3g.40gb", 4))  # 4 + 3 = 7 compute slices, 8 memory slots
    for name in ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"):
        assert free_starts(A100, used, profile(name)) == []


@pytest.mark.parametrize(
    ("used", "name", "start", "fragment"),
    [
        ((), "3g.40gb", 2, "cannot start at slot 2"),
        ((("2g.20gb", 0),), "1g.10gb", 1, "overlaps 2g.20gb"),
        ((("3g.40gb", 0), ("3g.40gb", 4)), "1g.10gb", 6, "overlaps"),
        # 2g@0 + 2g@2 + 2g@4 = 6 slices: a 1g at 6 would fit the memory and the slices (7) ...
        ((("2g.20gb", 0), ("2g.20gb", 2), ("2g.20gb", 4)), "2g.20gb", 6, "cannot start at slot 6"),
        # ... but 4g@0 + 2g@4 = 6 slices leaves 1: a 2g needs 2
        ((("4g.40gb", 0), ("2g.20gb", 4)), "2g.20gb", 6, "cannot start"),
        ((("4g.40gb", 0), ("1g.20gb", 4), ("1g.20gb", 6)), "1g.10gb", 4, "overlaps"),
    ],
)
def test_illegal_placements_are_refused_with_the_rule(
    used: tuple[tuple[str, int], ...], name: str, start: int, fragment: str
) -> None:
    problem = why_not(A100, slots(*used), profile(name), start)
    assert problem is not None and fragment in problem


def test_compute_slices_cap_at_seven() -> None:
    # 3g@0 (3) + 2g@4 (2) + 1g@6 (1, 2 slots) = 6 slices, 8 memory slots: nothing more fits by memory;
    # 4g@0 (4) + 2g@4 (2) = 6 slices, slots 0-5: a 1g.20gb at 6 takes the 7th slice, then no slice is left.
    used = slots(("4g.40gb", 0), ("2g.20gb", 4), ("1g.20gb", 6))
    assert sum(s.slices for s in used) == 7
    assert why_not(A100, used, profile("1g.10gb"), 6) is not None


def test_max_count_per_profile() -> None:
    used = slots(("1g.20gb", 0), ("1g.20gb", 2), ("1g.20gb", 4), ("1g.20gb", 6))
    problem = why_not(A100, used[:3], profile("2g.20gb"), 6)
    assert problem is not None  # 2g cannot start at 6
    assert free_starts(A100, used, profile("1g.20gb")) == []


def test_a30_four_slot_layout() -> None:
    a30 = CATALOG["A30"].mig
    assert a30 is not None
    one = a30.profile("1g.6gb")
    four = a30.profile("4g.24gb")
    assert one is not None and four is not None
    assert (a30.memory_slots, a30.compute_slices) == (4, 4)
    state = place_all(make_state(mode="mig", model="A30"), ["2g.12gb", "1g.6gb", "1g.6gb"])
    assert sum(s.slices for s in state.usage[0].mig) == 4
    assert not fit(mig_demand("1g.6gb"), state)


def test_profiles_are_matched_by_slices_and_memory_per_model() -> None:
    # 1g.10gb is the 2-slot 1g on an A100-40GB and the 1-slot 1g on an A100-80GB
    a40 = CATALOG["A100-40GB"].mig
    assert a40 is not None
    spec = ProfileSpec.parse("1g.10gb")
    assert a40.match(spec) is not None and a40.match(spec).memory_slots == 2  # type: ignore[union-attr]
    assert A100.match(spec) is not None and A100.match(spec).memory_slots == 1  # type: ignore[union-attr]
    # A100-80GB's full profile is seen as 7g.80gb and 7g.79gb
    assert A100.match(ProfileSpec.parse("7g.79gb")) == A100.match(ProfileSpec.parse("7g.80gb"))
    # H200 names its profiles by its own memory
    h200 = CATALOG["H200-141GB"].mig
    assert h200 is not None and h200.match(ProfileSpec.parse("3g.71gb")) is not None
    assert h200.match(ProfileSpec.parse("3g.40gb")) is None


def test_static_geometry_serves_only_its_instances() -> None:
    instances = static_mig("A100-80GB", ("3g.40gb", 4), ("2g.20gb", 0), ("1g.10gb", 2))
    state = make_state(mode="mig", model="A100-80GB", device_options={"mig_instances": instances})
    assert not fit(mig_demand("4g.40gb"), state)  # not pre-created
    got = fit(mig_demand("2g.20gb"), state)
    assert got and got.allocations[0].shares[0].uuid == "MIG-2g.20gb-0-1"
    state = state.apply("a", got.allocations[0])
    assert not fit(mig_demand("2g.20gb"), state)  # its only 2g is taken


def test_fraction_on_mig_takes_the_smallest_covering_profile() -> None:
    state = make_state(mode="mig", model="A100-80GB")
    # 0.1 GPU = 8192 MiB and 100 milli compute: 1g.10gb (10240 MiB, 1/7 = 142 milli) covers both
    small = fit(Demand(0, 0, GpuRequest(GpuKind.SHARE, 1, fraction_milli=100)), state)
    assert small.allocations[0].shares[0].mig is not None
    assert small.allocations[0].shares[0].mig.profile == "1g.10gb"
    # 0.5 GPU = 40960 MiB and 500 milli: 3g.40gb has the memory but 3/7 = 428 milli < 500 -> 4g.40gb
    half = fit(Demand(0, 0, GpuRequest(GpuKind.SHARE, 1, fraction_milli=500)), state)
    assert half.allocations[0].shares[0].mig is not None
    assert half.allocations[0].shares[0].mig.profile == "4g.40gb"


def test_whole_gpus_are_not_carved_from_mig_devices() -> None:
    found = fit(Demand(0, 0, GpuRequest(GpuKind.WHOLE, 1)), make_state(mode="mig", model="A100-80GB"))
    assert not found and "partitioned by MIG" in found.reason


def test_apply_refuses_an_overlapping_record() -> None:
    node = make_node(mode="mig", model="A100-80GB")
    state = place_all(NodeState.empty(node), ["3g.40gb"])
    taken = state.pods[0][1]
    with pytest.raises(RecordError, match="overlaps"):
        state.apply("other", taken)
