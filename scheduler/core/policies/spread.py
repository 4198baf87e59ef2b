"""spread (LeastAllocated): prefer the node whose GPUs are least used once the pod is placed.

score = 100 - binpack's score. Inside the node, the tightest GPU. Spreading limits the
blast radius of a node failure and the contention between time-sliced pods.
"""

from __future__ import annotations

from ..allocation import Allocation
from ..request import Demand
from ..state import NodeState
from .base import Context, NoOptions, Reading, Tiebreaking, register
from .binpack import READS, tightest, utilisation_after


class Spread(Reading, Tiebreaking):
    name = "spread"
    reads = READS
    tiebreak = staticmethod(tightest)

    def score(self, demand: Demand, state: NodeState, allocation: Allocation) -> float:
        return 100.0 - utilisation_after(state, allocation)


@register("spread")
def make(options: NoOptions, context: Context) -> Spread:
    return Spread()
