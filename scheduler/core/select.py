"""How a policy's scores become a placement, node by node: the plain answer.

Per node: :func:`~scheduler.core.fit.fit` finds the candidate allocations; candidates
that leave the node in the same state up to which of two identical GPUs they took score
alike (a policy scores what a placement leaves), so each such group is scored once; the
node's score is the best group's, and its allocation the candidate of the best score with
the lowest ``tiebreak`` (then the lowest GPU index). Across nodes, a policy's ``adjust``
sees the whole cluster and its ``normalize`` the candidate nodes; equal scores fall to
``order`` (the simulator's seeded node rank), then to the nodes' given order.

The board (:mod:`scheduler.core.board`) gives the same answers for whole clusters, keeping
what it worked out from call to call; these functions are what it is checked against.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from .allocation import Allocation
from .capacity import GAP_LEVELS, add_share, device_key, free_milli, gap_level
from .fit import gpu_fit, host_reason
from .groups import Groups, groups_of
from .policies.base import Declared, Policy, Reads, capabilities, reads
from .request import Demand, GpuKind
from .state import NodeState

NO_MOVE = (-1, -1)


@dataclass(frozen=True, slots=True)
class Placement:
    node: str
    score: float
    allocation: Allocation


@dataclass(frozen=True, slots=True)
class Scored:
    """A node's best score for a demand (host resources aside), and the gap move of its
    best allocation (see :func:`gap_move`)."""

    score: float
    move: tuple[int, int]


def outcome(state: NodeState, alloc: Allocation) -> Hashable:
    """Allocations with equal keys leave the node in equivalent states (the same GPUs, by
    kind and usage, given the same shares)."""
    node = state.node
    return tuple(
        (device_key(node, node.devices[s.index], state.usage[s.index]), s.memory_mib, s.compute_milli, s.mig)
        for s in alloc.shares
    )


def _groups(state: NodeState, allocations: Sequence[Allocation]) -> list[list[Allocation]]:
    """The candidates grouped by :func:`outcome`, in the order of their first member."""
    if len(allocations) == 1:
        return [list(allocations)]
    groups: dict[Hashable, list[Allocation]] = {}
    for alloc in allocations:
        groups.setdefault(outcome(state, alloc), []).append(alloc)
    return list(groups.values())


def _best_of(policy: Policy, demand: Demand, state: NodeState, members: Sequence[Allocation]) -> Allocation:
    """Among equally scored candidates, the lowest tiebreak, then the first."""
    tiebreaking = capabilities(policy).tiebreak
    if tiebreaking is None or len(members) == 1:
        return members[0]
    return min(members, key=lambda a: tiebreaking.tiebreak(demand, state, a))


def gap_move(demand: Demand, state: NodeState, alloc: Allocation) -> tuple[int, int]:
    """The (before, after) gap level of the GPU a placement shares; (-1, -1) unless it is
    one share of one GPU."""
    if demand.gpu.kind is not GpuKind.SHARE or len(alloc.shares) != 1:
        return NO_MOVE
    share = alloc.shares[0]
    node = state.node
    device = node.devices[share.index]
    after = free_milli(node, device, add_share(device, state.usage[share.index], share))
    return gap_level(state.frees[share.index].milli), gap_level(after)


def _scored(
    policy: Policy, demand: Demand, state: NodeState
) -> tuple[list[list[Allocation]], list[float], float] | str:
    """The candidate groups of ``demand``'s GPU request on the node, their scores and the best
    score; or why the GPU request does not fit."""
    found = gpu_fit(demand, state)
    if not found:
        return found.reason
    groups = _groups(state, found.allocations)
    scores = [policy.score(demand, state, members[0]) for members in groups]
    return groups, scores, max(scores)


def score_node(policy: Policy, demand: Demand, state: NodeState) -> Scored | str:
    """The node's score for ``demand``'s GPU request (host resources not checked), or why
    the GPU request does not fit; with the gap move of its placement for a policy that
    reads the cluster's gaps (else no move, and no tiebreak asked)."""
    found = gpu_fit(demand, state)
    if not found:
        return found.reason
    return score_firsts(policy, demand, state, firsts(state, found.allocations))


def firsts(state: NodeState, allocations: Sequence[Allocation]) -> list[Allocation]:
    """The first of each group of equivalent candidates (see :func:`outcome`), in order."""
    return [members[0] for members in _groups(state, allocations)]


def score_firsts(policy: Policy, demand: Demand, state: NodeState, firsts: Sequence[Allocation]) -> Scored:
    """:func:`score_node` from the first candidate of each group of equivalent candidates
    (see :func:`outcome`), in the order of their first member: the rest of a group scores
    alike and loses the ties to its first."""
    scores = [policy.score(demand, state, alloc) for alloc in firsts]
    top = max(scores)
    if Reads.GAPS not in reads(policy):
        return Scored(top, NO_MOVE)
    tied = [alloc for alloc, s in zip(firsts, scores, strict=True) if s == top]
    return Scored(top, gap_move(demand, state, _best_of(policy, demand, state, tied)))


def evaluate(policy: Policy, demand: Demand, state: NodeState) -> Placement | str:
    """The policy's placement of ``demand`` on one node, or why it does not fit."""
    reason = host_reason(demand, state)
    if reason is not None:
        return reason
    scored = _scored(policy, demand, state)
    if isinstance(scored, str):
        return scored
    groups, scores, top = scored
    tied = [a for members, s in zip(groups, scores, strict=True) if s == top for a in members]
    return Placement(state.node.name, top, _best_of(policy, demand, state, tied))


@dataclass(frozen=True, slots=True)
class Ranking:
    placements: list[Placement]  # best first
    failures: dict[str, str]  # node -> reason


class Gaps:
    """A :class:`~scheduler.core.policies.base.Cluster` of given arrays, for the nodes
    ``scored`` of ``cluster`` (its groups worked out when read)."""

    def __init__(
        self,
        gaps: np.ndarray,
        moves: np.ndarray,
        cluster: Sequence[NodeState] = (),
        scored: Sequence[NodeState] = (),
    ) -> None:
        self.gaps = gaps
        self.moves = moves
        self.cpu_milli = sum(s.node.cpu_milli for s in cluster)
        self._cluster = cluster
        self._scored = scored

    @cached_property
    def groups(self) -> Groups:
        return groups_of(self._cluster, self._scored)


def gap_histogram(states: Iterable[NodeState]) -> np.ndarray:
    """How many GPUs of ``states`` have each free share, in hundredths (index 0..GAP_LEVELS)."""
    levels = [level for s in states for level in s.gap_levels()]
    return np.bincount(np.array(levels, dtype=np.int64), minlength=GAP_LEVELS + 1)


def finish(policy: Policy, demand: Demand, scores: np.ndarray, cluster: Any) -> np.ndarray:
    """Raw scores (``-inf`` where the pod does not fit) through the policy's cluster-wide
    ``adjust``, then its ``normalize`` over the nodes that fit. A policy that learns has its
    learned object follow the cluster as the call sees it first (``follow``): learning happens
    there, and ``adjust`` only reads."""
    can = capabilities(policy)
    view = Declared(cluster, can.reads, policy.name)
    if can.learning is not None:
        can.learning.learned.follow(demand, view)
    if can.adjust is not None:
        scores = can.adjust.adjust(demand, scores, view)
    if can.normalize is not None:
        fits = scores > -np.inf
        if fits.any():
            scores = scores.copy()
            scores[fits] = can.normalize.normalize(scores[fits])
    return scores


def rank(
    policy: Policy,
    demand: Demand,
    states: Sequence[NodeState],
    order: Mapping[str, int] | None = None,
    gaps: np.ndarray | None = None,
) -> Ranking:
    """Every node's placement, best first, and the reasons of the nodes that do not fit.

    ``gaps`` is the cluster's gap histogram for a policy's ``adjust`` (by default that of
    ``states``, taken as the whole cluster, as are its CPU and groups).
    """
    placements: list[Placement] = []
    moves: list[tuple[int, int]] = []
    failures: dict[str, str] = {}
    placed: list[NodeState] = []
    for state in states:
        result = evaluate(policy, demand, state)
        if isinstance(result, str):
            failures[state.node.name] = result
        else:
            placements.append(result)
            placed.append(state)
            moves.append(gap_move(demand, state, result.allocation))
    raw = np.array([p.score for p in placements], dtype=np.float64)
    histogram = gap_histogram(states) if gaps is None else gaps
    cluster = Gaps(histogram, np.array(moves, dtype=np.int64).reshape(-1, 2).T, states, placed)
    scores = finish(policy, demand, raw, cluster).tolist()
    placements = [
        p if s == p.score else Placement(p.node, s, p.allocation) for s, p in zip(scores, placements, strict=True)
    ]
    position = {p.node: i for i, p in enumerate(placements)} if order is None else order
    placements.sort(key=lambda p: (-p.score, position.get(p.node, 0)))
    return Ranking(placements, failures)


def best(
    policy: Policy, demand: Demand, states: Sequence[NodeState], order: Mapping[str, int] | None = None
) -> Placement | None:
    """The winning placement (highest score, then lowest ``order``), or None if nothing fits."""
    ranking = rank(policy, demand, states, order)
    return ranking.placements[0] if ranking.placements else None
