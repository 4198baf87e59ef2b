"""MIG slot arithmetic: legality (each profile's legal start slots, no overlap, its largest count,
as NVIDIA's MIG user guide gives them) and where to put a new instance.

Occupancy is a tuple of :class:`MigSlot` (memory slots ``[start, start+size)``).
"""

from __future__ import annotations

from functools import lru_cache

from .allocation import MigSlot
from .catalog import MigLayout, MigProfile


def slot_of(profile: MigProfile, start: int) -> MigSlot:
    return MigSlot(start, profile.memory_slots, profile.compute_slices, profile.name)


def why_not(layout: MigLayout, used: tuple[MigSlot, ...], profile: MigProfile, start: int) -> str | None:
    """None if ``profile`` may start at ``start`` beside ``used``, else the rule it breaks."""
    if start not in profile.starts:
        return f"{profile.name} cannot start at slot {start} (legal: {list(profile.starts)})"
    end = start + profile.memory_slots
    for slot in used:
        if slot.start < end and start < slot.start + slot.size:
            return f"slot {start} of {profile.name} overlaps {slot.profile} at {slot.start}"
    if sum(s.slices for s in used) + profile.compute_slices > layout.compute_slices:
        return (
            f"{profile.name} needs {profile.compute_slices} compute slices, "
            f"{layout.compute_slices - sum(s.slices for s in used)} free"
        )
    if sum(1 for s in used if s.profile == profile.name) >= profile.max_count:
        return f"{profile.name} already has its maximum of {profile.max_count} instances"
    return None


def free_starts(layout: MigLayout, used: tuple[MigSlot, ...], profile: MigProfile) -> list[int]:
    return [s for s in profile.starts if why_not(layout, used, profile, s) is None]


def headroom(layout: MigLayout, used: tuple[MigSlot, ...]) -> tuple[int, ...]:
    """How many legal starts each profile still has, largest profile first.

    Compared lexicographically, a larger tuple keeps the larger profiles placeable.
    """
    order = sorted(layout.profiles, key=lambda p: (-p.memory_slots, -p.compute_slices))
    return tuple(len(free_starts(layout, used, p)) for p in order)


@lru_cache(maxsize=16384)
def best_start(layout: MigLayout, used: tuple[MigSlot, ...], profile: MigProfile) -> int | None:
    """The legal start that leaves the most room for the largest profiles; lowest slot on ties.

    Example (A100, empty): a 1-slot 1g goes to slot 6, not 0: at 0 it would block the
    4g (only legal at 0) and one of the two 3g starts.

    Memoised: a GPU has a few hundred occupancies at most, repeated across a cluster's
    thousands of GPUs, and the answer (about 0.1 ms to work out) depends on nothing else.
    """
    best: tuple[tuple[int, ...], int] | None = None
    for start in free_starts(layout, used, profile):
        after = tuple(sorted((*used, slot_of(profile, start))))
        key = (headroom(layout, after), -start)
        if best is None or key > (best[0], -best[1]):
            best = (key[0], start)
    return None if best is None else best[1]
