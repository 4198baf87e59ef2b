"""fgd: Fragmentation Gradient Descent (Weng et al., USENIX ATC 2023).

Place the pod where the node's fragmentation against the typical workload grows
least (see :mod:`scheduler.core.fragmentation` for F_n(M)). Score of a placement =
floor(100 * sigmoid((F_before - F_after) / 1000)), F in milli-GPU, so a placement that
leaves no new fragment scores 50 and one that fills a fragment scores above. Inside the
node every candidate GPU (or MIG slot) is scored and the first (lowest index) with the
highest *integer* score wins, as in the authors' simulator: two GPUs whose F after
differs by less than a score point are equal, and the lower index is taken. The node's
score is that placement's score.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator, Sequence

from ..allocation import Allocation
from ..fragmentation import DEFAULT_WORKLOAD, Fragmentation, TypicalWorkload
from ..memo import intern
from ..request import Demand
from ..state import NodeState
from .base import Policy, register


def sigmoid_score(delta: float) -> float:
    """floor(100 * sigmoid(delta / 1000)); delta = F_before - F_after in milli-GPU.

    Evaluated as the authors' Go does (``sigmoid(x) * 100``, then truncated), so scores
    on a boundary round the same way.
    """
    x = max(-50.0, min(50.0, delta / 1000))
    return float(math.floor((1.0 / (1.0 + math.exp(-x))) * 100.0))


def same_outcome(state: NodeState, profiles: Sequence[tuple[int, int]], alloc: Allocation) -> Hashable:
    """Allocations with equal keys leave the node in equivalent states (same models, usage and shares)."""
    return tuple(
        (
            state.node.devices[s.index].model.name,
            state.usage[s.index],
            profiles[s.index],
            s.memory_mib,
            s.compute_milli,
            s.mig,
        )
        for s in alloc.shares
    )


def distinct(
    state: NodeState, profiles: Sequence[tuple[int, int]], allocations: Sequence[Allocation]
) -> Iterator[tuple[int, Allocation]]:
    """(index, allocation) of the first of each group of equivalent allocations: GPUs in the
    same state give the same outcome, so each state is tried once."""
    tried: set[Hashable] = set()
    for i, alloc in enumerate(allocations):
        same = same_outcome(state, profiles, alloc)
        if same not in tried:
            tried.add(same)
            yield i, alloc


@register
class Fgd(Policy):
    name = "fgd"

    def __init__(self, workload: TypicalWorkload = DEFAULT_WORKLOAD) -> None:
        self.fragmentation = Fragmentation(workload)

    def place(self, demand: Demand, state: NodeState, allocations: Sequence[Allocation]) -> tuple[float, Allocation]:
        frag = self.fragmentation
        # F after depends on the GPU request and on which typical shapes' CPU still fits,
        # not on the pod's exact CPU or memory: memoise on that coarser key.
        key = (frag, intern(demand.gpu), frag.cpu_level(state.cpu_free - demand.cpu_milli), len(allocations))
        hit: tuple[float, int] | None = state.memo.get(key)
        if hit is not None:
            return hit[0], allocations[hit[1]]
        profiles = frag.profiles(state)
        before = frag.node_frag(state)
        best_score = -math.inf
        best = 0
        for i, alloc in distinct(state, profiles, allocations):
            candidate = sigmoid_score(before - frag.frag_after(state, alloc, profiles))
            if candidate > best_score:
                best_score, best = candidate, i
        score = float(best_score)
        state.memo[key] = (score, best)
        return score, allocations[best]

    def score(self, demand: Demand, state: NodeState, alloc: Allocation) -> float:
        frag = self.fragmentation
        return sigmoid_score(frag.node_frag(state) - frag.frag_after(state, alloc))
