"""dotprod (the FGD paper's DotProd, after Tetris): prefer the node whose free resources
line up least with the pod's request.

v_node = (cpu_free / 128000, gpu_free / 8000), v_pod = (cpu_req / 128000, gpu_req / 8000),
with GPU in milli summed over the node's GPUs (free before the pod lands) and over the
pod's GPUs; score = floor(100 * (1 - v_node . v_pod / 2)). Inside the node, the tightest
GPU (lowest index on ties), as the authors' experiments ran it (GPU selection "best",
dimension "merge", normalisation "max").
"""

from __future__ import annotations

import math

from ..allocation import Allocation
from ..capacity import allocated_milli
from ..request import Demand
from ..state import NodeState
from .base import Context, NoOptions, Tiebreaking, register
from .bestfit import MAX_CPU_MILLI, MAX_GPU_MILLI
from .binpack import tightest


def dot_product_score(cpu_free: int, gpu_free: int, cpu_req: int, gpu_req: int) -> float:
    """The authors' arithmetic, in their order (normalise, multiply, halve, invert, scale)."""
    dot = 0.0
    dot += (cpu_free / MAX_CPU_MILLI) * (cpu_req / MAX_CPU_MILLI)
    dot += (gpu_free / MAX_GPU_MILLI) * (gpu_req / MAX_GPU_MILLI)
    return float(math.floor(100.0 * (1.0 - dot / 2.0)))


class DotProd(Tiebreaking):
    name = "dotprod"
    tiebreak = staticmethod(tightest)

    def score(self, demand: Demand, state: NodeState, allocation: Allocation) -> float:
        return dot_product_score(state.cpu_free, state.free_milli(), allocation.cpu_milli, allocated_milli(allocation))


@register("dotprod")
def make(options: NoOptions, context: Context) -> DotProd:
    return DotProd()
