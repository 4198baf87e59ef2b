"""gpupacking (the FGD paper's GpuPacking): fill GPUs already in use, then nodes already
in use, then idle nodes.

With ``left[g]`` each GPU's free milli-GPU before the pod lands, ``n`` the node's GPU
count and the tightest GPUs the pod would take (lowest index on ties):

* the node is idle (every GPU fully free):       max(33 - n, n)
* the pod must take k fully free GPUs (k > 0):   max(50 - k, 33)
* it fits on GPUs already shared:                max(100 - (sum_g trunc(left[g] * 100 / 1000)) // 10, 50)
* the pod needs no GPU:                          0 on every node
"""

from __future__ import annotations

from ..allocation import Allocation
from ..request import MILLI, Demand, GpuKind
from ..state import NodeState
from .base import Context, NoOptions, Reading, Reads, Tiebreaking, register
from .binpack import tightest


def packing_score(state: NodeState, alloc: Allocation) -> float:
    lefts = [f.milli for f in state.free()]
    fully_free = sum(1 for left in lefts if left == MILLI)
    if fully_free == len(lefts):
        return float(max(33 - fully_free, fully_free))
    taken = [lefts[s.index] for s in alloc.shares]
    fresh = sum(1 for left in taken if left == MILLI)
    if fresh:
        return float(max(50 - fresh, 33))
    free_pct = sum(left * 100 // MILLI for left in taken)
    return float(max(100 - free_pct // 10, 50))


class GpuPacking(Reading, Tiebreaking):
    name = "gpupacking"
    reads: frozenset[Reads] = frozenset()
    tiebreak = staticmethod(tightest)

    def score(self, demand: Demand, state: NodeState, allocation: Allocation) -> float:
        if demand.gpu.kind is GpuKind.NONE:
            return 0.0
        return packing_score(state, allocation)


@register("gpupacking")
def make(options: NoOptions, context: Context) -> GpuPacking:
    return GpuPacking()
