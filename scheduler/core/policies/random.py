"""random: one feasible node drawn uniformly (the FGD paper's baseline).

Every placement scores 0, and the cluster-wide adjustment replaces the scores of the nodes
the pod fits by fresh uniform draws in [0, 100): the highest wins, a uniform draw among
them. Inside the node, a uniform draw among the GPUs that fit (the tiebreak). Seeded by
the run's seed (option ``seed`` overrides it), so a run repeats exactly.
"""

from __future__ import annotations

import random as _random
from dataclasses import dataclass

import numpy as np

from ..allocation import Allocation
from ..request import Demand
from ..state import NodeState
from .base import Adjusting, Cluster, Context, Reading, Reads, Tiebreaking, register


@dataclass(frozen=True, slots=True)
class RandomOptions:
    seed: int | None = None  # default: the run's seed (0 in the service)


class Random(Reading, Tiebreaking, Adjusting):
    name = "random"
    reads: frozenset[Reads] = frozenset()

    def __init__(self, seed: int) -> None:
        self._nodes = np.random.default_rng(seed)
        self._gpus = _random.Random(seed)

    def score(self, demand: Demand, state: NodeState, allocation: Allocation) -> float:
        return 0.0

    def tiebreak(self, demand: Demand, state: NodeState, allocation: Allocation) -> float:
        return self._gpus.random()

    def adjust(self, demand: Demand, scores: np.ndarray, cluster: Cluster) -> np.ndarray:
        fits = scores > -np.inf
        drawn = np.full(len(scores), -np.inf)
        drawn[fits] = 100.0 * self._nodes.random(int(fits.sum()))
        return drawn


@register("random", RandomOptions)
def make(options: RandomOptions, context: Context) -> Random:
    return Random(context.seed if options.seed is None else options.seed)
