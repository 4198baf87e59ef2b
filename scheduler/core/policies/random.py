"""random: one feasible node drawn uniformly (the FGD paper's baseline).

Every placement scores 0, and the cluster-wide adjustment replaces the scores of the nodes
the pod fits by fresh uniform draws in [0, 100): the highest wins, a uniform draw among
them. Inside the node, a uniform draw among the GPUs that fit (the tiebreak). Seeded by
the run's seed (option ``seed`` overrides it), so a run repeats exactly.

It learns nothing, but what it has drawn so far is state of the same kind as what a learning
policy learned: the face that owns the policy owns its generators (:class:`Draws`, its
learned object), and a defragmentation planner draws from a copy of them
(:func:`~.base.over_a_copy`), so planning leaves the served draws as they were. Its
``adjust`` and ``tiebreak`` are the only hooks of a registered policy that change anything:
they draw.
"""

from __future__ import annotations

import copy
import random as _random
from dataclasses import dataclass

import numpy as np

from ..allocation import Allocation
from ..request import Demand
from ..state import NodeState
from .base import Adjusting, Cluster, Context, Learned, Learning, Reading, Reads, Tiebreaking, register


@dataclass(frozen=True, slots=True)
class RandomOptions:
    seed: int | None = None  # default: the run's seed (0 in the service)


class Draws:
    """The two generators of :class:`Random` (nodes, GPUs), as far as they have drawn."""

    version = 0  # what is drawn never makes a kept score stale: every score is 0

    def __init__(self, seed: int) -> None:
        self.nodes = np.random.default_rng(seed)
        self.gpus = _random.Random(seed)

    def observe(self, demand: Demand) -> None:
        """Nothing to learn from a pod."""

    def follow(self, demand: Demand, cluster: Cluster) -> None:
        """Nothing to follow of the cluster."""

    def copy(self) -> Draws:
        return copy.deepcopy(self)


class Random(Reading, Learning, Tiebreaking, Adjusting):
    name = "random"
    reads: frozenset[Reads] = frozenset()
    memos: frozenset[str] = frozenset()

    def __init__(self, learned: Draws) -> None:
        self.learned = learned

    def over(self, learned: Learned) -> Random:
        assert isinstance(learned, Draws)
        return Random(learned)

    def score(self, demand: Demand, state: NodeState, allocation: Allocation) -> float:
        return 0.0

    def tiebreak(self, demand: Demand, state: NodeState, allocation: Allocation) -> float:
        return self.learned.gpus.random()

    def adjust(self, demand: Demand, scores: np.ndarray, cluster: Cluster) -> np.ndarray:
        fits = scores > -np.inf
        drawn = np.full(len(scores), -np.inf)
        drawn[fits] = 100.0 * self.learned.nodes.random(int(fits.sum()))
        return drawn


@register("random", RandomOptions)
def make(options: RandomOptions, context: Context) -> Random:
    return Random(Draws(context.seed if options.seed is None else options.seed))
