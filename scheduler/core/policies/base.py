"""What a policy is: a placement within one node plus a score, registered by name.

A policy sees one node's state and the candidate allocations ``fit`` found there; it
returns the allocation it prefers and a score in 0..100 (higher is better). The loop
that compares nodes (``scheduler.core.select``) knows no policy by name.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, ClassVar

import numpy as np

from ..allocation import Allocation
from ..capacity import free_after
from ..groups import GroupView
from ..request import Demand, GpuKind
from ..state import NodeState


class Policy:
    """Base: choose the tightest allocation (least free share left on the GPUs it takes,
    lowest index on ties) and score it with :meth:`score`."""

    name: ClassVar[str] = ""
    # Results depend only on (demand, node state): they may be cached per state.
    cacheable: ClassVar[bool] = True
    # Raise when learned parameters change, so cached results are not reused.
    version: int = 0
    # The node is a uniform draw among the feasible ones, whatever their state (random):
    # a Scoreboard then caches only feasibility and lets draw() pick the winner.
    uniform_choice: ClassVar[bool] = False
    # Scores also weigh the whole cluster's histogram of GPU free shares: a Scoreboard then
    # passes its cached scores through adjust() on every call (see Scoreboard.gaps).
    gap_aware: ClassVar[bool] = False
    # A gap_aware policy that also weighs the cluster by GPU group (model and sharing mode):
    # the Scoreboard then calls adjust_groups() with a GroupView instead of adjust().
    group_aware: ClassVar[bool] = False

    def place_key(self, demand: Demand) -> Hashable:
        """What of ``demand`` :meth:`place` depends on. Placements are cached per node state
        under this key and reused for every demand that shares it (feasibility of the
        pod's CPU and memory is checked separately). The default, the GPU request and the
        CPU, fits policies that score CPU; none scores host memory."""
        return (demand.gpu, demand.cpu_milli)

    def place(self, demand: Demand, state: NodeState, allocations: Sequence[Allocation]) -> tuple[float, Allocation]:
        alloc = tightest(state, allocations)
        return self.score(demand, state, alloc), alloc

    def score(self, demand: Demand, state: NodeState, alloc: Allocation) -> float:
        raise NotImplementedError

    def normalize(self, scores: list[float]) -> list[float]:
        """Rescale raw scores over the candidate nodes (identity unless a policy needs it)."""
        return scores

    def observe(self, demand: Demand) -> None:
        """Called once per pod that arrives, before it is scored (online policies learn here)."""

    def adjust(self, demand: Demand, scores: np.ndarray, moves: np.ndarray, gaps: np.ndarray) -> np.ndarray:
        """For ``gap_aware`` policies: every node's score (``-inf`` where the pod does not fit)
        given the cluster. ``moves[:, j]`` is the (before, after) free level, in hundredths of a
        GPU, of the one GPU the node's placement shares (-1 when it takes whole GPUs or several);
        ``gaps[h]`` counts the cluster's GPUs whose free share is at level ``h``."""
        return scores

    def adjust_groups(
        self, demand: Demand, scores: np.ndarray, moves: np.ndarray, gaps: np.ndarray, view: GroupView
    ) -> np.ndarray:
        """For ``group_aware`` policies: as :meth:`adjust`, with the cluster by GPU group
        (``view.node_group[j]`` is the group of the node scored at position j)."""
        return self.adjust(demand, scores, moves, gaps)

    def draw(self, candidates: int) -> int:
        """For ``uniform_choice`` policies: the winner's index among ``candidates`` feasible nodes."""
        raise NotImplementedError


def gpu_only_key(demand: Demand) -> Hashable:
    """A :meth:`Policy.place_key` for policies that score a GPU pod by its GPU request alone."""
    return (demand.gpu,) if demand.gpu.kind is not GpuKind.NONE else (demand.gpu, demand.cpu_milli)


def tightest(state: NodeState, allocations: Sequence[Allocation]) -> Allocation:
    if len(allocations) == 1:
        return allocations[0]
    return min(allocations, key=lambda a: free_after(state, a))


REGISTRY: dict[str, Callable[..., Policy]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    if not cls.name or cls.name in REGISTRY:
        raise ValueError(f"policy {cls.__name__} needs a unique name, got {cls.name!r}")
    REGISTRY[cls.name] = cls
    return cls


def make_policy(name: str, **options: Any) -> Policy:
    """A policy by its config name; ValueError naming the accepted names if unknown."""
    factory = REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"unknown policy {name!r}; accepted: {', '.join(sorted(REGISTRY))}")
    return factory(**options)
