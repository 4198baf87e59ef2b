"""spread (LeastAllocated): prefer the node whose GPUs are least used once the pod is placed.

score = 100 - binpack's score. Spreading limits the blast radius of a node failure and
the contention between time-sliced pods.
"""

from __future__ import annotations

from collections.abc import Hashable

from ..allocation import Allocation
from ..request import Demand
from ..state import NodeState
from .base import Policy, gpu_only_key, register
from .binpack import utilisation_after


@register
class Spread(Policy):
    name = "spread"

    def place_key(self, demand: Demand) -> Hashable:
        return gpu_only_key(demand)

    def score(self, demand: Demand, state: NodeState, alloc: Allocation) -> float:
        return float(100 - int(utilisation_after(state, alloc)))
