"""fgd-cpu: fragmentation gradient descent that also counts the GPU a node strands for lack of CPU.

Cost of a node state, in milli-GPU:

    C_n = F_n(M) + lambda * S_n,    S_n = max(0, gpu_free_n - r * cpu_free_n)

F_n(M) is FGD's fragmentation against the typical workload M
(:mod:`scheduler.core.fragmentation`); r is M's GPU per CPU (popularity-weighted
milli-GPU over milli-CPU of its GPU shapes), so S_n is the idle GPU that pods of the
typical mix could not use because the node's CPU runs out first. A placement is scored
by the fall of C it causes: score = 50 + 50 * tanh((C_before - C_after) / 2000), in
0..100 and continuous (ties only between equivalent placements; then the lowest node
rank). Inside the node every candidate GPU or MIG slot is tried and the lowest C wins.

Why it wastes less than FGD: FGD sees CPU only through single typical pods ("can one
more fit?"), so a 96-core node with 8 GPUs looks unfragmented until its last CPU is
gone, and CPU-heavy or CPU-only pods that land there strand its GPUs. S prices that
early and steers CPU-heavy pods to CPU-rich nodes (on the openb trace: the 2-GPU,
104-core T4 nodes) and CPU-light pods to CPU-poor ones; with continuous scores the
pod also goes to the exact best hole instead of a random one among equal integers.
On the default openb trace (seeds 42-45, 130 % inflation, arrived = 100 %) it leaves
4.14 % of GPU unallocated against 4.78 % for FGD.

M and r are learned online from the pods seen so far (:class:`OnlineWorkload`), never
from the trace in advance; each re-estimate raises :attr:`version` so cached scores are
not reused.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..allocation import Allocation
from ..capacity import allocated_milli
from ..fragmentation import DEFAULT_WORKLOAD, Fragmentation, OnlineWorkload, TypicalWorkload
from ..request import MILLI, Demand, GpuKind, GpuRequest
from ..state import NodeState
from .base import Policy, register
from .fgd import distinct

DEFAULT_STRANDING_WEIGHT = 4.0
SCORE_SCALE_MILLI = 2000.0


def nominal_milli(gpu: GpuRequest) -> int:
    """A request's share of one GPU in milli-GPU; a memory-only share is read against an 80 GiB GPU."""
    if gpu.kind is not GpuKind.SHARE:
        return MILLI
    return gpu.fraction_milli or gpu.compute_milli or min(MILLI, gpu.memory_mib * MILLI // 81920)


def gpu_per_cpu(workload: TypicalWorkload) -> float:
    """Milli-GPU per milli-CPU of the workload's GPU shapes (0 when they ask for no CPU)."""
    gpu = cpu = 0.0
    for demand, p in workload.shapes:
        g = demand.gpu
        if g.kind is GpuKind.NONE:
            continue
        gpu += p * nominal_milli(g) * g.count
        cpu += p * demand.cpu_milli
    return gpu / cpu if cpu else 0.0


@register
class FgdCpu(Policy):
    name = "fgd-cpu"

    def __init__(
        self,
        workload: TypicalWorkload | None = None,
        stranding_weight: float = DEFAULT_STRANDING_WEIGHT,
        learn: bool = True,
    ) -> None:
        """``workload``: the starting estimate (default: the built-in one); ``learn``: refine it
        from the pods observed (turn off only to pin a workload, for instance in a test)."""
        self.online = OnlineWorkload(workload or DEFAULT_WORKLOAD) if learn else None
        self.stranding_weight = stranding_weight
        self._adopt(workload or DEFAULT_WORKLOAD)

    def _adopt(self, workload: TypicalWorkload) -> None:
        self.fragmentation = Fragmentation(workload)
        self.ratio = gpu_per_cpu(workload)

    def observe(self, demand: Demand) -> None:
        if self.online is not None and self.online.observe(demand):
            self._adopt(self.online.workload)
            self.version += 1

    def stranded(self, gpu_free: float, cpu_free: int) -> float:
        if not self.ratio:
            return 0.0
        return max(0.0, gpu_free - self.ratio * cpu_free)

    def place(self, demand: Demand, state: NodeState, allocations: Sequence[Allocation]) -> tuple[float, Allocation]:
        frag = self.fragmentation
        profiles = frag.profiles(state)
        gpu_free = sum(free for free, _ in profiles)
        before = frag.node_frag(state) + self.stranding_weight * self.stranded(gpu_free, state.cpu_free)
        best_cost = math.inf
        best = 0
        for i, alloc in distinct(state, profiles, allocations):
            cost = self._cost_after(state, alloc, profiles, gpu_free)
            if cost < best_cost:
                best_cost, best = cost, i
        return self._score(before - best_cost), allocations[best]

    def _cost_after(
        self, state: NodeState, alloc: Allocation, profiles: list[tuple[int, int]], gpu_free: float
    ) -> float:
        frag_after = self.fragmentation.frag_after(state, alloc, profiles)
        left = gpu_free - allocated_milli(alloc)
        return frag_after + self.stranding_weight * self.stranded(left, state.cpu_free - alloc.cpu_milli)

    @staticmethod
    def _score(fall: float) -> float:
        return 50.0 + 50.0 * math.tanh(fall / SCORE_SCALE_MILLI)

    def score(self, demand: Demand, state: NodeState, alloc: Allocation) -> float:
        frag = self.fragmentation
        profiles = frag.profiles(state)
        gpu_free = sum(free for free, _ in profiles)
        before = frag.node_frag(state) + self.stranding_weight * self.stranded(gpu_free, state.cpu_free)
        return self._score(before - self._cost_after(state, alloc, profiles, gpu_free))
