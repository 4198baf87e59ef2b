"""bestfit (the FGD paper's BestFit): prefer the node with the least CPU and GPU left over.

raw = floor(100 * (1 - (0.5 * (cpu_free - cpu_req) / 128000 + 0.5 * (gpu_free - gpu_req) / 8000)))
with GPU in milli over the node's GPUs and the paper's normalisers (128 cores, 8 GPUs);
then min-max normalised to 0..100 over the candidate nodes. Inside the node, the
tightest GPU.
"""

from __future__ import annotations

import math

from ..allocation import Allocation
from ..capacity import allocated_milli, node_free_milli
from ..request import Demand
from ..state import NodeState
from .base import Policy, register

MAX_CPU_MILLI = 128_000
MAX_GPU_MILLI = 8_000


def min_max(scores: list[float]) -> list[float]:
    """k8s-style normalisation: (s - min) * 100 // (max - min); all equal -> unchanged."""
    if not scores:
        return scores
    low, high = min(scores), max(scores)
    if high == low:
        return scores
    return [float((s - low) * 100 // (high - low)) for s in scores]


@register
class BestFit(Policy):
    name = "bestfit"

    def score(self, demand: Demand, state: NodeState, alloc: Allocation) -> float:
        cpu_left = (state.cpu_free - alloc.cpu_milli) / MAX_CPU_MILLI
        gpu_left = (node_free_milli(state) - allocated_milli(alloc)) / MAX_GPU_MILLI
        return float(math.floor(100 * (1 - (0.5 * cpu_left + 0.5 * gpu_left))))

    def normalize(self, scores: list[float]) -> list[float]:
        return min_max(scores)
