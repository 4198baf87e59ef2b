"""The board: a cluster's node states, and what each pod shape needs of them, kept current.

The extender and the simulator ask it the same questions, one entry point each:

* :meth:`Board.filter` — per listed node, does the pod fit, and if not, why, and could it
  ever (:class:`Outcomes`: ``FITS``, ``UNSCHEDULABLE`` with a reason, ``UNRESOLVABLE``
  when the node could not take the pod even empty, or cannot be used at all);
* :meth:`Board.scores` — per listed node, the policy's finished score (``-inf`` where the
  pod does not fit);
* :meth:`Board.best` — the winning placement over the whole cluster;
* :meth:`Board.put` / :meth:`Board.remove` / :meth:`Board.put_problem` — what changed.

Answers are those of :mod:`scheduler.core.select`, node by node. What the board keeps to
give them quickly is its own business, in parts with one job each; this module only puts
their answers together:

* :mod:`.columns` — the node states as columns by position (positions are stable: a node
  keeps its position until it leaves, and a new node takes a free one), and every node's
  stamp, raised on each change;
* :mod:`.scorecache` — the raw scores per pod shape, kept per node for the stamp they were
  worked out at, shared between nodes in the same state and between pods that agree on what
  the policy reads (:func:`~scheduler.core.policies.base.demand_key`); :mod:`.nodescores`
  works out those it does not hold;
* :mod:`.reasons` — why a pod does not fit, now or ever, kept the same way, as ids into
  :mod:`.texts`;
* :mod:`.devstates` — the GPUs' device states and what each answers a GPU request;
  :mod:`.histograms` — the gap histograms, in all and by GPU group.

Not thread-safe: callers serialise access.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from .columns import Columns
from .groups import Groups
from .policies.base import Policy
from .reasons import UNKNOWN_NODE, Reasons
from .request import Demand
from .scorecache import ScoreCache, ScoreTable
from .select import Placement, evaluate, finish
from .state import NodeState
from .texts import Texts

__all__ = ["UNKNOWN_NODE", "Board", "Outcomes", "Status"]


class Status(IntEnum):
    FITS = 0
    UNSCHEDULABLE = 1  # does not fit now; could after pods leave
    UNRESOLVABLE = 2  # could not fit even empty, or the node cannot be used at all


@dataclass(frozen=True, slots=True)
class Outcomes:
    """Per listed node (in the order asked): its status and reason (an index into ``texts``, 0
    when it fits), and the raw score where it fits (``-inf`` elsewhere)."""

    status: np.ndarray  # int8
    reason: np.ndarray  # int32, into texts
    scores: np.ndarray  # float64
    texts: Sequence[str]

    def fits(self) -> np.ndarray:
        fitting: np.ndarray = self.status == Status.FITS
        return fitting

    def reasons(self, names: Sequence[str], status: Status) -> dict[str, str]:
        """``{name: reason}`` of the listed nodes with ``status``."""
        texts = self.texts
        return {names[i]: texts[self.reason[i]] for i in np.flatnonzero(self.status == status).tolist()}


class _Cluster:
    """The :class:`~scheduler.core.policies.base.Cluster` a policy's ``adjust`` reads; the
    moves and groups are gathered only when read."""

    __slots__ = ("_columns", "_groups", "_moves", "_positions", "_reasons", "_table", "cpu_milli", "gaps")

    def __init__(self, columns: Columns, reasons: Reasons, table: ScoreTable, positions: np.ndarray | None) -> None:
        self._columns = columns
        self._reasons = reasons
        self._groups: Groups | None = None
        self.gaps = columns.histograms.gaps
        self.cpu_milli = columns.cpu_total
        self._table = table
        self._positions = positions
        self._moves: np.ndarray | None = table.moves[:, : columns.size] if positions is None else None

    @property
    def groups(self) -> Groups:
        if self._groups is None:
            self._groups = self._gather_groups()
        return self._groups

    def _gather_groups(self) -> Groups:
        kept = self._columns.histograms
        positions = self._positions
        if positions is None:
            mine = kept.node_group[: self._columns.size]  # as the scores: every position, free ones -1
        else:
            mine = np.where(positions >= 0, kept.node_group[np.maximum(positions, 0)], -1)
        return Groups(
            tuple(kept.group_ids.values),  # type: ignore[arg-type]
            kept.group_gaps,
            mine,
            tuple(kept.group_devices),
            self._reasons.fits_empty_by_group,
        )

    @property
    def moves(self) -> np.ndarray:
        if self._moves is None:
            assert self._positions is not None
            positions = self._positions
            moves = np.full((2, len(positions)), -1, dtype=np.int64)
            where = positions >= 0
            moves[:, where] = self._table.moves[:, positions[where]]
            self._moves = moves
        return self._moves


class Board:
    def __init__(self, states: Iterable[NodeState] = (), order: Mapping[str, int] | None = None) -> None:
        self._columns = Columns(order, Texts())
        self._reasons = Reasons(self._columns)
        self._scores = ScoreCache(self._columns, self._reasons)
        for state in states:
            self.put(state)

    # ------------------------------------------------------------ the cluster

    def __len__(self) -> int:
        return len(self._columns.places)

    def __contains__(self, name: object) -> bool:
        return name in self._columns.places

    @property
    def layout(self) -> int:
        """Raised when a node joins or leaves: positions of names change."""
        return self._columns.places.layout

    @property
    def states(self) -> list[NodeState]:
        """The usable nodes' states, in position order."""
        return [s for s in self._columns.states if s is not None]

    @property
    def gaps(self) -> np.ndarray:
        """How many GPUs of the cluster have each free share, in hundredths (index 0..100)."""
        return self._columns.histograms.gaps

    def get(self, name: str) -> NodeState | None:
        i = self._columns.places.get(name)
        return None if i is None else self._columns.states[i]

    def problem(self, name: str) -> str:
        """Why node ``name`` cannot be used ("" if it can, or is unknown)."""
        columns = self._columns
        i = columns.places.get(name)
        return "" if i is None else columns.texts.values[columns.problem[i]]

    def names(self) -> list[str]:
        """Every node's name by position ("" for a free position); the same list object while
        :attr:`layout` stays."""
        return self._columns.places.names()

    def positions(self, names: Sequence[str]) -> np.ndarray:
        """Each name's position (``-1`` if unknown); stable until :attr:`layout` changes."""
        return self._columns.places.positions(names)

    def everyone(self) -> np.ndarray:
        """The positions of every node, in position order."""
        return self._columns.places.everyone()

    def put(self, state: NodeState) -> None:
        """Add a node or replace its state."""
        self._columns.put(state)

    def put_problem(self, name: str, problem: str) -> None:
        """Node ``name`` exists but cannot be used, for ``problem``: it fits no pod until put again."""
        self._columns.put_problem(name, problem)

    def remove(self, name: str) -> None:
        self._columns.remove(name)

    # ------------------------------------------------------------ questions

    def filter(self, policy: Policy, demand: Demand, positions: np.ndarray | None = None) -> Outcomes:
        """Per position (all nodes if None; ``-1`` for a node unknown here): fits, or why not."""
        positions = self.everyone() if positions is None else positions
        before = self._columns.texts.values
        outcomes = self._outcomes(policy, demand, positions)
        if outcomes.texts is not before:
            # the texts started afresh during the call (see .texts): the reasons worked out
            # before are ids of the old list, so all are worked out again in the new one
            outcomes = self._outcomes(policy, demand, positions)
        return outcomes

    def _outcomes(self, policy: Policy, demand: Demand, positions: np.ndarray) -> Outcomes:
        scores, table = self._scores.raw(policy, demand, positions)
        status = np.zeros(len(positions), dtype=np.int8)
        reason = np.zeros(len(positions), dtype=np.int32)
        failing = np.flatnonzero(scores == -np.inf)
        if len(failing):
            at = positions[failing]
            status[failing] = Status.UNSCHEDULABLE
            unknown = at < 0
            if unknown.any():
                reason[failing[unknown]] = self._columns.texts.of(UNKNOWN_NODE)
            known, at = failing[~unknown], at[~unknown]
            never = self._reasons.never_fits(demand, at)
            lost = never > 0
            status[known[lost]] = Status.UNRESOLVABLE
            reason[known[lost]] = never[lost]
            reason[known[~lost]] = self._reasons.now(demand, at[~lost], table.reasons)
        return Outcomes(status, reason, scores, self._columns.texts.values)

    def refused(self, outcomes: Outcomes, refusals: Sequence[tuple[int, str]]) -> Outcomes:
        """``outcomes`` with each listed node ``i`` of ``refusals`` unschedulable for its text
        (a rule outside the board's, such as a namespace's GPU quota)."""
        texts, text = outcomes.texts, self._columns.texts.of
        status, reason, scores = outcomes.status.copy(), outcomes.reason.copy(), outcomes.scores.copy()
        for i, refusal in refusals:
            status[i], reason[i], scores[i] = Status.UNSCHEDULABLE, text(refusal), -np.inf
        if texts is not self._columns.texts.values:  # the table of reasons started afresh meanwhile: ids anew
            reason = np.array([text(texts[r]) for r in outcomes.reason.tolist()], dtype=np.int32)
            for i, refusal in refusals:
                reason[i] = text(refusal)
        return Outcomes(status, reason, scores, self._columns.texts.values)

    def scores(self, policy: Policy, demand: Demand, positions: np.ndarray | None = None) -> np.ndarray:
        """Per position (all nodes if None), the policy's finished score: adjusted for the
        cluster, normalised over the listed nodes that fit; ``-inf`` where the pod does not fit."""
        if positions is None:
            return self._finished(policy, demand, None)[self._columns.places.alive[: self._columns.size]]
        return self._finished(policy, demand, positions)

    def _finished(self, policy: Policy, demand: Demand, positions: np.ndarray | None) -> np.ndarray:
        scores, table = self._scores.raw(policy, demand, positions)
        return finish(policy, demand, scores, _Cluster(self._columns, self._reasons, table, positions))

    def pick(self, scores: np.ndarray, positions: np.ndarray) -> int | None:
        """Which of ``positions`` the highest of ``scores`` (one per position) goes to, as
        :meth:`best` picks (ties: the lowest ``order``, then position); None if none fits."""
        feasible = np.flatnonzero(scores > -np.inf)
        if not len(feasible):
            return None
        values = scores[feasible]
        top = feasible[values == values.max()]
        if len(top) == 1:
            return int(top[0])
        return int(top[np.argmin(self._columns.places.rank[positions[top]])])

    def best(self, policy: Policy, demand: Demand) -> Placement | None:
        """The winning placement over every node (ties: the lowest ``order``, then position)."""
        if not len(self):
            return None
        scores = self._finished(policy, demand, None)
        chosen = self.pick(scores, np.arange(self._columns.size))
        if chosen is None:
            return None
        result = evaluate(policy, demand, self._columns.state(chosen))
        assert not isinstance(result, str), result
        return Placement(result.node, float(scores[chosen]), result.allocation)
