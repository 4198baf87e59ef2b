"""bestfit (the FGD paper's BestFit): prefer the node with the least CPU and GPU left over.

raw = floor(100 * (1 - (0.5 * (cpu_free - cpu_req) / 128000 + 0.5 * (gpu_free - gpu_req) / 8000)))
with GPU in milli over the node's GPUs and the paper's normalisers (128 cores, 8 GPUs);
then min-max normalised to 0..100 over the candidate nodes. Inside the node, the
tightest GPU.
"""

from __future__ import annotations

import numpy as np

from ..allocation import Allocation
from ..capacity import allocated_milli
from ..request import Demand
from ..state import NodeState
from .base import Context, NoOptions, Normalizing, ScoringTook, Tiebreaking, register
from .binpack import tightest

MAX_CPU_MILLI = 128_000
MAX_GPU_MILLI = 8_000


def leftover_score(cpu_free: np.ndarray, cpu_asked: int, gpu_free: np.ndarray, took: np.ndarray) -> np.ndarray:
    """Per node, the paper's raw score of a placement that takes ``cpu_asked`` milli-CPU and
    ``took`` milli-GPU from ``cpu_free`` and ``gpu_free`` (see the module)."""
    cpu_left = (cpu_free - cpu_asked) / MAX_CPU_MILLI
    gpu_left = (gpu_free - took) / MAX_GPU_MILLI
    scores: np.ndarray = np.floor(100 * (1 - (0.5 * cpu_left + 0.5 * gpu_left)))
    return scores


def min_max(scores: np.ndarray) -> np.ndarray:
    """k8s-style normalisation: (s - min) * 100 // (max - min); all equal -> unchanged."""
    if not len(scores):
        return scores
    low, high = float(scores.min()), float(scores.max())
    if high == low:
        return scores
    return np.asarray((scores - low) * 100 // (high - low), dtype=np.float64)


class BestFit(Tiebreaking, ScoringTook, Normalizing):
    name = "bestfit"
    tiebreak = staticmethod(tightest)

    def score(self, demand: Demand, state: NodeState, allocation: Allocation) -> float:
        took = np.array([allocated_milli(allocation)])
        return float(
            leftover_score(np.array([state.cpu_free]), allocation.cpu_milli, np.array([state.free_milli()]), took)[0]
        )

    def score_took(
        self, demand: Demand, cpu_free: np.ndarray, gpu_free: np.ndarray, capacity: np.ndarray, took: np.ndarray
    ) -> np.ndarray:
        """:meth:`score` of placements that take ``took`` milli-GPU, over arrays."""
        return leftover_score(cpu_free, demand.cpu_milli, gpu_free, took)

    def normalize(self, scores: np.ndarray) -> np.ndarray:
        return min_max(scores)


@register("bestfit")
def make(options: NoOptions, context: Context) -> BestFit:
    return BestFit()
