"""fgd: Fragmentation Gradient Descent (Weng et al., USENIX ATC 2023).

Place the pod where the node's fragmentation against the typical workload grows
least (see :mod:`scheduler.core.fragmentation` for F_n(M)). Score of a placement =
floor(100 * sigmoid((F_before - F_after) / 1000)), F in milli-GPU, so a placement that
leaves no new fragment scores 50 and one that fills a fragment scores above. Inside the
node the highest *integer* score wins, the lowest GPU index on ties, as in the authors'
simulator: two GPUs whose F after differs by less than a score point are equal.

The typical workload: the ``workload`` option if given, else the one the run knows in
advance (the simulator's: the trace's typical pods, as the paper computes them), else a
built-in mix of fractional, whole and multi-GPU pods.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..allocation import Allocation
from ..fragmentation import DEFAULT_WORKLOAD, Fragmentation, Shape, workload_of
from ..request import Demand
from ..state import NodeState
from .base import Context, Preparing, register


def sigmoid_score(delta: float) -> float:
    """floor(100 * sigmoid(delta / 1000)); delta = F_before - F_after in milli-GPU.

    Evaluated as the authors' Go does (``sigmoid(x) * 100``, then truncated), so scores
    on a boundary round the same way.
    """
    x = max(-50.0, min(50.0, delta / 1000))
    return float(math.floor((1.0 / (1.0 + math.exp(-x))) * 100.0))


@dataclass(frozen=True, slots=True)
class FgdOptions:
    workload: tuple[Shape, ...] | None = None  # the typical pods to score against


class Fgd(Preparing):
    name = "fgd"

    def __init__(self, fragmentation: Fragmentation) -> None:
        self.fragmentation = fragmentation

    def prepare(self, demand: Demand, candidates: Sequence[tuple[NodeState, Allocation]]) -> None:
        self.fragmentation.warm(candidates)

    def score(self, demand: Demand, state: NodeState, allocation: Allocation) -> float:
        return sigmoid_score(self.fragmentation.fall(state, allocation))


@register("fgd", FgdOptions)
def make(options: FgdOptions, context: Context) -> Fgd:
    workload = workload_of(options.workload) if options.workload else context.workload or DEFAULT_WORKLOAD
    return Fgd(Fragmentation(workload))
