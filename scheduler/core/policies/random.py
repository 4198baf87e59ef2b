"""random: one feasible node drawn uniformly (the FGD paper's baseline).

Each feasible node gets a fresh uniform score in [0, 100); the highest wins, which is
a uniform draw among them. Seeded, so a run repeats exactly; never cached. Inside the
node, a uniform draw among the GPUs that fit. A Scoreboard skips the per-node scores
(``uniform_choice``) and draws the winner among the feasible nodes directly: the same
distribution for one random draw per pod instead of one per node.
"""

from __future__ import annotations

import random as _random
from collections.abc import Sequence

from ..allocation import Allocation
from ..request import Demand
from ..state import NodeState
from .base import Policy, register


@register
class Random(Policy):
    name = "random"
    cacheable = False
    uniform_choice = True

    def __init__(self, seed: int = 0) -> None:
        self._rng = _random.Random(seed)

    def place(self, demand: Demand, state: NodeState, allocations: Sequence[Allocation]) -> tuple[float, Allocation]:
        alloc = allocations[self._rng.randrange(len(allocations))] if len(allocations) > 1 else allocations[0]
        return self.score(demand, state, alloc), alloc

    def score(self, demand: Demand, state: NodeState, alloc: Allocation) -> float:
        return 100.0 * self._rng.random()

    def draw(self, candidates: int) -> int:
        return self._rng.randrange(candidates)
