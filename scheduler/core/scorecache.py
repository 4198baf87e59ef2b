"""The board's raw scores of a pod shape, per node, kept current (:meth:`ScoreCache.raw`).

A table (:class:`ScoreTable`) is kept per policy, its ``version`` and what the policy reads of
the pod (:func:`~.policies.base.demand_key`): per node the best score, the gap move of that
placement, why the GPU request does not fit where it does not (worked out when asked, by
:mod:`.reasons`), and the node stamp they are valid for. Only nodes whose stamps moved, among
those asked about, are scored again (:mod:`.nodescores`), and work is shared between nodes in
the same state (one question per node signature, unless the policy reads the pods
themselves), or done for all at once by what a share takes (``score_took``). A table's
answers per signature go when the board numbers its signatures again (``numbering``); the
tables go when the texts start afresh.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

import numpy as np

from .columns import MAX_TABLES, Columns
from .devstates import kept
from .nodescores import score_nodes
from .policies.base import Policy, Reads, capabilities, demand_key, reads, version
from .reasons import Reasons
from .request import Demand, GpuKind, GpuRequest

_READS_PER_NODE = frozenset({Reads.GAPS, Reads.PODS})  # what score_took cannot answer (see _score_took)


class ScoreTable:
    """Per node: the best score of one (policy, version, demand key), the gap move of that
    placement, why the GPU request does not fit (a text id), and the node stamp they are
    valid for. Per node signature, the same, shared by nodes in one state."""

    __slots__ = ("by_signature", "moves", "reasons", "scores", "stamps")

    def __init__(self, size: int) -> None:
        self.scores = np.full(size, -np.inf)
        self.moves = np.full((2, size), -1, dtype=np.int64)
        self.reasons = np.zeros(size, dtype=np.int32)
        self.stamps = np.full(size, -1, dtype=np.int64)
        self.by_signature: dict[int, tuple[float, int, int]] = {}  # score, gap move

    def grow(self, size: int) -> None:
        extra = size - len(self.stamps)
        if extra > 0:
            self.scores = np.concatenate([self.scores, np.full(extra, -np.inf)])
            self.moves = np.concatenate([self.moves, np.full((2, extra), -1, dtype=np.int64)], axis=1)
            self.reasons = np.concatenate([self.reasons, np.zeros(extra, dtype=np.int32)])
            self.stamps = np.concatenate([self.stamps, np.full(extra, -1, dtype=np.int64)])


def gpu_fits(columns: Columns, gpu: GpuRequest, positions: np.ndarray) -> np.ndarray:
    """Per position, whether ``gpu`` finds enough GPUs (fit's own test, counted with arrays)."""
    if gpu.kind is GpuKind.NONE:
        fits: np.ndarray = columns.kind[positions] >= 0
        return fits
    rows = columns.devs[positions]
    counts = columns.dev_states.hosted(gpu, rows).hosts[rows].sum(axis=1)
    enough: np.ndarray = counts >= max(1, gpu.count)
    return enough


class ScoreCache:
    def __init__(self, columns: Columns, reasons: Reasons) -> None:
        self._columns = columns
        self._reasons = reasons
        self._tables: OrderedDict[Hashable, ScoreTable] = OrderedDict()
        self._numbering = columns.numbering
        columns.texts.on_forget(lambda _old: self._tables.clear())

    def raw(self, policy: Policy, demand: Demand, positions: np.ndarray | None) -> tuple[np.ndarray, ScoreTable]:
        """Raw scores per position (None: every position, in order, free ones never fitting),
        ``-inf`` where the pod does not fit; and the score table."""
        columns = self._columns
        if positions is None:  # slices: no gathering of every array
            n = columns.size
            table = self.table(policy, demand, None)
            fits = (
                columns.places.alive[:n]
                & (columns.room[:n] > 0)
                & (columns.cpu_free[:n] >= demand.cpu_milli)
                & (columns.memory_free[:n] >= demand.memory_mib)
            )
            return np.where(fits, table.scores[:n], -np.inf), table
        if 2 * len(positions) >= columns.size:  # most of the cluster: work on slices, gather once
            everywhere, table = self.raw(policy, demand, None)
            return np.where(positions >= 0, everywhere[positions], -np.inf), table
        where = positions >= 0
        known = positions if where.all() else positions[where]
        table = self.table(policy, demand, known)
        fits = (
            (columns.room[known] > 0)
            & (columns.cpu_free[known] >= demand.cpu_milli)
            & (columns.memory_free[known] >= demand.memory_mib)
        )
        listed = np.where(fits, table.scores[known], -np.inf)
        if known is positions:
            return listed, table
        scores = np.full(len(positions), -np.inf)
        scores[where] = listed
        return scores, table

    def table(self, policy: Policy, demand: Demand, positions: np.ndarray | None) -> ScoreTable:
        """The score table of (policy, demand), brought up to date on ``positions`` (all known;
        None: every position)."""
        columns = self._columns
        if self._numbering != columns.numbering:  # signatures numbered again: answers per id go
            for kept_table in self._tables.values():
                kept_table.by_signature.clear()
            self._numbering = columns.numbering
        key = (policy, version(policy), demand_key(policy, demand))
        table = kept(self._tables, key, ScoreTable, columns.size, MAX_TABLES)
        stamp = columns.stamp
        if positions is None:
            n = columns.size
            stale = np.flatnonzero(table.stamps[:n] != stamp[:n])
        else:
            stale = positions[table.stamps[positions] != stamp[positions]]
        if len(stale):
            fits = np.zeros(len(stale), dtype=bool)
            # nodes whose kind could not host the GPU request even empty are not asked about
            # their GPU states (a pod that fits nowhere costs nothing per GPU state then)
            hopeful = self._reasons.never_fits(Demand(0, 0, demand.gpu), stale) == 0
            if hopeful.any():
                fits[hopeful] = gpu_fits(columns, demand.gpu, stale[hopeful])
            out = stale[~fits]
            table.scores[out] = -np.inf
            table.moves[:, out] = -1
            table.reasons[out] = -1  # worked out when asked (see Reasons.now)
            work = stale[fits]
            if len(work):
                self._score(policy, demand, table, work)
            table.stamps[stale] = stamp[stale]
        return table

    def _score(self, policy: Policy, demand: Demand, table: ScoreTable, work: np.ndarray) -> None:
        """Score ``work`` (positions where the GPU request fits), once per node state: nodes
        with one signature share the answer (unless the policy reads the pods themselves); or,
        for a policy that scores by what a share takes (``score_took``), all at once."""
        if self._score_took(policy, demand, table, work):
            return
        columns = self._columns
        table.reasons[work] = 0
        if Reads.PODS in reads(policy):
            values, moves = score_nodes(columns, policy, demand, work)
            table.scores[work], table.moves[:, work] = values, moves.T
            return
        memo = table.by_signature
        if len(memo) > columns.size // 2 + 256:
            memo.clear()
        # one question per signature: the positions that share one are told apart by arrays
        signatures, first, at = np.unique(columns.signature[work], return_index=True, return_inverse=True)
        signatures_list = signatures.tolist()
        new = [k for k, sig in enumerate(signatures_list) if sig not in memo]
        if new:
            values, moves = score_nodes(columns, policy, demand, work[first[new]])
            rows = zip(values.tolist(), *moves.T.tolist(), strict=True)
            memo.update(zip([signatures_list[k] for k in new], rows, strict=True))
            if len(new) == len(signatures_list):  # every one new: no need to read them back
                table.scores[work], table.moves[:, work] = values[at], moves[at].T
                return
        found = np.array([memo[sig] for sig in signatures_list]).reshape(-1, 3)
        table.scores[work] = found[at, 0]
        table.moves[:, work] = found[at, 1:].T.astype(np.int64)

    def _score_took(self, policy: Policy, demand: Demand, table: ScoreTable, work: np.ndarray) -> bool:
        """Score ``work`` with the policy's ``score_took`` (see :mod:`.policies.base`) where it
        applies: a request for one share of one GPU (or one whole GPU, or one MIG instance), a
        policy that reads neither the gaps nor the pods. A node's score is then that of the
        share that takes the most of its hosting GPUs (the score never falls as a share takes
        more); what a share takes is known per device state (:class:`.devstates.Hosting`). False where
        it does not apply."""
        score_took = capabilities(policy).score_took
        gpu = demand.gpu
        if score_took is None or gpu.kind is GpuKind.NONE or gpu.count > 1 or reads(policy) & _READS_PER_NODE:
            return False
        columns = self._columns
        rows = columns.devs[work]
        hosting = columns.dev_states.hosted(gpu, rows)
        took = np.where(hosting.hosts[rows], hosting.took[rows], -1).max(axis=1)
        table.scores[work] = score_took.score_took(
            demand, columns.cpu_free[work], columns.gpu_free[work], columns.gpu_capacity[work], took
        )
        table.moves[:, work] = -1
        table.reasons[work] = 0
        return True
