"""binpack (MostAllocated): prefer the node whose GPUs are most used once the pod is placed.

score = 100 * (capacity - free after) / capacity, in milli-GPU over the node's GPUs;
for a pod without GPUs the same over the node's CPU. Packing keeps other nodes whole
for large pods.
"""

from __future__ import annotations

from collections.abc import Hashable

from ..allocation import Allocation
from ..capacity import allocated_milli, node_capacity_milli, node_free_milli
from ..request import Demand
from ..state import NodeState
from .base import Policy, gpu_only_key, register


def utilisation_after(state: NodeState, alloc: Allocation) -> float:
    capacity = node_capacity_milli(state)
    if not alloc.shares or not capacity:
        cpu = state.node.cpu_milli
        return 100.0 * (state.cpu_milli + alloc.cpu_milli) / cpu if cpu else 0.0
    used = capacity - node_free_milli(state) + allocated_milli(alloc)
    return 100.0 * min(capacity, used) / capacity


@register
class Binpack(Policy):
    name = "binpack"

    def place_key(self, demand: Demand) -> Hashable:
        return gpu_only_key(demand)

    def score(self, demand: Demand, state: NodeState, alloc: Allocation) -> float:
        return float(int(utilisation_after(state, alloc)))
