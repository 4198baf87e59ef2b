"""gpuclustering (the FGD paper's GpuClustering): keep pods of one GPU shape together.

Each GPU pod carries a tag: ``share`` (one partial GPU or MIG instance) or ``k-gpu``
(k whole GPUs). With ``left`` the node's free milli-GPU before the pod lands,
base = trunc(25 * (8000 - left) / 8000) (integer arithmetic, as the authors' Go), and

* the node hosts only pods of this tag:            base + 75
* it hosts this tag among others:                  base + 50
* it hosts no tagged pod:                          base + 25
* it hosts only other tags:                        base
* the pod needs no GPU:                            0 on every node

Inside the node, the tightest GPU (lowest index on ties).
"""

from __future__ import annotations

from ..allocation import Allocation
from ..request import MILLI, Demand, GpuKind, GpuRequest
from ..state import NodeState
from .base import Context, NoOptions, Reading, Reads, Tiebreaking, register
from .bestfit import MAX_GPU_MILLI
from .binpack import tightest

SHARE_TAG = "share"


def request_tag(gpu: GpuRequest) -> str | None:
    """The pod's tag, or None for a pod without GPUs."""
    if gpu.kind is GpuKind.NONE:
        return None
    if gpu.kind is GpuKind.WHOLE:
        return f"{gpu.count}-gpu"
    return SHARE_TAG if gpu.count <= 1 else f"{gpu.count}-share"


def allocation_tag(alloc: Allocation) -> str | None:
    """The tag of a pod already on the node, read from its allocation."""
    if not alloc.shares:
        return None
    whole = all(s.mig is None and s.compute_milli >= MILLI for s in alloc.shares)
    if whole:
        return f"{len(alloc.shares)}-gpu"
    return SHARE_TAG if len(alloc.shares) == 1 else f"{len(alloc.shares)}-share"


def _trunc_div(a: int, b: int) -> int:
    """Integer division rounding toward zero (Go's), not toward minus infinity."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def clustering_score(tag: str | None, tags_on_node: set[str], gpu_left: int) -> float:
    if tag is None:
        return 0.0
    base = _trunc_div(25 * (MAX_GPU_MILLI - gpu_left), MAX_GPU_MILLI)
    if tag in tags_on_node:
        return float(base + (75 if len(tags_on_node) == 1 else 50))
    return float(base + (25 if not tags_on_node else 0))


class GpuClustering(Reading, Tiebreaking):
    name = "gpuclustering"
    reads = frozenset({Reads.PODS})
    tiebreak = staticmethod(tightest)

    def score(self, demand: Demand, state: NodeState, allocation: Allocation) -> float:
        tags = {t for _, a in state.pods if (t := allocation_tag(a)) is not None}
        return clustering_score(request_tag(demand.gpu), tags, state.free_milli())


@register("gpuclustering")
def make(options: NoOptions, context: Context) -> GpuClustering:
    return GpuClustering()
