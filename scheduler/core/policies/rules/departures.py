"""Departures: fgd-cpu's balance weight stands down as pods leave.

The Sum-of-Squares balance is a rule for bins that only fill: a hole made now waits for a pod
that fits it. When pods leave, holes open and close by themselves and the balance only spreads
shares. From call to call the cluster's free GPU falls (placements: ``taken``) or rises
(departures, or nodes joining: ``freed``); the balance weight is multiplied by 1 - freed / held,
held = taken - freed the GPU that the pods placed since still hold: 1 while nothing leaves,
0 once as much has been freed as is held.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Flow:
    """The cluster's free GPU at the last call (-1: none yet) and what it lost and gained
    since the first, in hundredths of a GPU."""

    free: int = -1
    taken: int = 0
    freed: int = 0


def follow(flow: Flow, free: int) -> Flow:
    """``flow`` once the cluster's free GPU is ``free``."""
    taken, freed = flow.taken, flow.freed
    if flow.free >= 0:
        change = free - flow.free
        if change > 0:
            freed += change
        else:
            taken -= change
    return Flow(free, taken, freed)


def factor(flow: Flow) -> float:
    """The share of the balance weight in use: 1 - freed / held (see the module)."""
    held = flow.taken - flow.freed
    share = min(1.0, flow.freed / held) if held > 0 else float(flow.freed > 0)
    return 1.0 - share
