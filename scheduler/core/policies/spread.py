"""spread (LeastAllocated): prefer the node whose GPUs are least used once the pod is placed.

score = 100 - binpack's score. Spreading limits the blast radius of a node failure and
the contention between time-sliced pods.
"""

from __future__ import annotations

from ..allocation import Allocation
from ..request import Demand
from ..state import NodeState
from .base import Policy, register
from .binpack import utilisation_after


@register
class Spread(Policy):
    name = "spread"

    def score(self, demand: Demand, state: NodeState, alloc: Allocation) -> float:
        return float(100 - int(utilisation_after(state, alloc)))
