"""binpack (MostAllocated): prefer the node whose GPUs are most used once the pod is placed.

score = floor(100 * (capacity - free after) / capacity), in milli-GPU over the node's GPUs;
for a pod without GPUs the same over the node's CPU. Inside the node, the tightest GPU (the
least free share left on the GPUs it takes). Packing keeps other nodes whole for large pods.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..allocation import Allocation
from ..capacity import allocated_milli
from ..request import MILLI, Demand
from ..state import NodeState
from .base import Context, NoOptions, Reading, Reads, ScoringTook, ScoringWithoutGpu, Tiebreaking, register

READS = frozenset({Reads.CPU_WITHOUT_GPU})


def gpu_used_pct(capacity: np.ndarray, gpu_free: np.ndarray, took: np.ndarray) -> np.ndarray:
    """Per node, the percent of its GPU (``capacity`` milli-GPU, ``gpu_free`` of it free) in
    use once a placement takes ``took`` milli-GPU more, truncated to an integer."""
    used = capacity - gpu_free + took
    percent: np.ndarray = np.trunc(100.0 * np.minimum(capacity, used) / capacity)
    return percent


def cpu_used_pct(cpu: np.ndarray, used: np.ndarray) -> np.ndarray:
    """Per node, the percent of its CPU (``cpu`` milli-CPU) that ``used`` milli-CPU is,
    truncated to an integer (0 for a node without CPU)."""
    percent: np.ndarray = np.trunc(np.divide(100.0 * used, cpu, out=np.zeros(len(cpu)), where=cpu > 0))
    return percent


def utilisation_after(state: NodeState, alloc: Allocation) -> float:
    """Percent of the node's GPU (or, for a pod without GPUs, CPU) in use once ``alloc`` is
    placed, truncated: the arrays' arithmetic on one node."""
    capacity = MILLI * len(state.node.devices)
    if not alloc.shares or not capacity:
        return float(cpu_used_pct(np.array([state.node.cpu_milli]), np.array([state.cpu_milli + alloc.cpu_milli]))[0])
    took = np.array([allocated_milli(alloc)])
    return float(gpu_used_pct(np.array([capacity]), np.array([state.free_milli()]), took)[0])


def tightest(demand: Demand, state: NodeState, allocation: Allocation) -> float:
    """The tiebreak of the packing policies: the free share left on the GPUs ``allocation`` takes."""
    return float(state.free_after(allocation))


class Binpack(Reading, Tiebreaking, ScoringTook, ScoringWithoutGpu):
    name = "binpack"
    reads = READS
    tiebreak = staticmethod(tightest)

    def score(self, demand: Demand, state: NodeState, allocation: Allocation) -> float:
        return utilisation_after(state, allocation)

    def score_took(
        self, demand: Demand, cpu_free: np.ndarray, gpu_free: np.ndarray, capacity: np.ndarray, took: np.ndarray
    ) -> np.ndarray:
        """:meth:`score` of placements that take ``took`` milli-GPU, over arrays."""
        return gpu_used_pct(capacity, gpu_free, took)

    def score_without_gpu(self, demand: Demand, states: Sequence[NodeState], labels: np.ndarray) -> list[float]:
        """:meth:`score` of a pod that asks no GPU on each of ``states``: the node's CPU in use
        once it is placed, over arrays (``labels`` unread)."""
        cpu = np.array([state.node.cpu_milli for state in states], dtype=np.int64)
        used = np.array([state.cpu_milli for state in states], dtype=np.int64) + demand.cpu_milli
        scores: list[float] = cpu_used_pct(cpu, used).tolist()
        return scores


@register("binpack")
def make(options: NoOptions, context: Context) -> Binpack:
    return Binpack()
