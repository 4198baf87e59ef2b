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
give them quickly is its own business and lives here only: every node has a stamp, raised
on each change; a table (of scores, of reasons, of unresolvable nodes) remembers per node
the stamp it was worked out at, and only nodes whose stamps moved, among those asked
about, are worked out again. Work is shared between nodes in the same state (by
:meth:`signature`) and between pods that agree on what the policy reads
(:func:`~scheduler.core.policies.base.demand_key`). A table is keyed by the policy, its
``version`` and that key. Positions are stable: a node keeps its position until it
leaves, and a new node takes a free one. Not thread-safe: callers serialise access. The
GPUs' device states, and what each answers a GPU request, are :mod:`.devstates`'s; the gap
histograms, in all and by GPU group, :mod:`.histograms`'s.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from itertools import repeat
from typing import Any, TypeVar, cast

import numpy as np

from .allocation import Allocation, DeviceShare
from .capacity import (
    DeviceUsage,
    Refusal,
)
from .devstates import NAMES_GPU, UNKNOWN, DeviceStates, Growing, Hosting, kept
from .fit import (
    Fit,
    counted_reason,
    device_share,
    fit,
    fit_options,
    gpu_fit,
    host_reason,
    kind_reason,
    refused_reason,
    sharing_share,
    short_reason,
)
from .fragmentation import ShareCandidates
from .groups import Groups
from .histograms import GapHistograms
from .ids import Ids
from .inventory import Device, Node, SharingMode
from .modes.shared import rows_add_share
from .policies.base import Policy, Reads, capabilities, demand_key, reads, version
from .request import MILLI, Demand, GpuKind, GpuRequest
from .select import NO_MOVE, Placement, Scored, evaluate, finish, firsts, score_firsts
from .state import NodeState

UNKNOWN_NODE = "node unknown to gpuslice"
_READS_PER_NODE = frozenset({Reads.GAPS, Reads.PODS})  # what score_took cannot answer (see Board._score_took)
# nodes from which a policy's score_nodes pays (fgd-reserve on new node states: 1.1x at 16, 0.8x at 32)
_AT_ONCE_FROM = 32


T = TypeVar("T", bound=Growing)


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


class _ScoreTable:
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


class _ReasonTable:
    """Per node, why one full demand does not fit now (a text id, 0 when it fits), and the
    node stamp it is valid for."""

    __slots__ = ("reasons", "stamps")

    def __init__(self, size: int) -> None:
        self.reasons = np.zeros(size, dtype=np.int32)
        self.stamps = np.full(size, -1, dtype=np.int64)

    def grow(self, size: int) -> None:
        extra = size - len(self.stamps)
        if extra > 0:
            self.reasons = np.concatenate([self.reasons, np.zeros(extra, dtype=np.int32)])
            self.stamps = np.concatenate([self.stamps, np.full(extra, -1, dtype=np.int64)])


class _Cluster:
    """The :class:`~scheduler.core.policies.base.Cluster` a policy's ``adjust`` reads; the
    moves and groups are gathered only when read."""

    __slots__ = ("_board", "_groups", "_moves", "_positions", "_table", "cpu_milli", "gaps")

    def __init__(self, board: Board, table: _ScoreTable, positions: np.ndarray | None) -> None:
        size = board._size
        self._board = board
        self._groups: Groups | None = None
        self.gaps = board._histograms.gaps
        self.cpu_milli = board._cpu_total
        self._table = table
        self._positions = positions
        self._moves: np.ndarray | None = table.moves[:, :size] if positions is None else None

    @property
    def groups(self) -> Groups:
        if self._groups is None:
            self._groups = self._gather_groups()
        return self._groups

    def _gather_groups(self) -> Groups:
        board = self._board
        kept = board._histograms
        positions = self._positions
        if positions is None:
            mine = kept.node_group[: board._size]  # as the scores: every position, free ones -1
        else:
            mine = np.where(positions >= 0, kept.node_group[np.maximum(positions, 0)], -1)
        return Groups(
            tuple(kept.group_ids.values),  # type: ignore[arg-type]
            kept.group_gaps,
            mine,
            tuple(kept.group_devices),
            board._fits_empty_by_group,
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


def _unique_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct rows of a 2-D integer array (in ascending order), the index of each one's
    first occurrence, and each row's place among them: ``np.unique(rows, axis=0,
    return_index=True, return_inverse=True)``, by one sort of the columns (numpy's sorts
    rows as opaque records, several times slower)."""
    order = np.lexsort(rows.T[::-1])
    ranked = rows[order]
    new = np.ones(len(rows), dtype=bool)
    new[1:] = (ranked[1:] != ranked[:-1]).any(axis=1)
    inverse = np.empty(len(rows), dtype=np.int64)
    inverse[order] = np.cumsum(new) - 1
    return ranked[new], order[new], inverse


def _share_on(gpu: GpuRequest, node: Node, device: Device, usage: DeviceUsage, by_arrays: bool) -> DeviceShare:
    """The share ``gpu`` takes of ``device`` beside ``usage``, which hosts it (``by_arrays``: a
    state the rules of arrays answer, where the share is exactly what is asked). A whole GPU
    takes all of one in every mode but MIG, whatever its state (a MIG GPU hosts one only as an
    instance, for a pod listing mig in sharing: fit's answer)."""
    if gpu.kind is GpuKind.WHOLE and device.mode is not SharingMode.MIG:
        return DeviceShare(device.uuid, device.index, device.mode, device.memory_mib, MILLI)
    if by_arrays:
        return sharing_share(gpu, device)
    answer = device_share(gpu, node, device, usage)
    assert not isinstance(answer, Refusal), answer  # the device state hosts it
    return answer


def _as_arrays(scored: Sequence[Scored | str]) -> tuple[np.ndarray, np.ndarray]:
    """The scores and gap moves (one row per node) of nodes scored one by one."""
    assert not any(isinstance(found, str) for found in scored), scored  # fit agrees with _gpu_fits' counts
    found = cast(Sequence[Scored], scored)
    values = np.array([s.score for s in found], dtype=float)
    return values, np.array([s.move for s in found], dtype=np.int64).reshape(-1, 2)


def _signature(kind: int, state: NodeState) -> Hashable:
    """What a node's score can depend on (see Reads): nodes with equal signatures score alike."""
    return (kind, state.usage, state.cpu_milli, state.memory_mib, len(state.pods))


class Board:
    _MAX_ANSWERS = 65_536  # kept answers of MIG and exclusive GPU states (see _answers)
    _MAX_TABLES = 128  # per kind of table; a score table is about 36 bytes per node
    _MAX_TEXTS = 100_000
    _ID_SLACK = 4096  # ids past four per node (per GPU) and this many: numbered again

    def __init__(self, states: Iterable[NodeState] = (), order: Mapping[str, int] | None = None) -> None:
        self._order = dict(order or {})
        self._states: list[NodeState | None] = []
        self._index: dict[str, int] = {}
        self._free_positions: list[int] = []
        self._size = 0  # positions in use or free: the length that matters of every array
        self._clock = 0  # the last stamp given
        self._stamp = np.zeros(0, dtype=np.int64)  # raised on every change of the node
        self._alive = np.zeros(0, dtype=bool)
        self._cpu_free = np.zeros(0, dtype=np.int64)
        self._memory_free = np.zeros(0, dtype=np.int64)
        self._room = np.zeros(0, dtype=np.int64)
        self._gpu_free = np.zeros(0, dtype=np.int64)  # free share of the node's GPUs, milli-GPU
        self._gpu_capacity = np.zeros(0, dtype=np.int64)  # milli-GPU of all its GPUs
        self._rank = np.zeros(0, dtype=np.float64)
        self._problem = np.zeros(0, dtype=np.int32)  # text id of why the node cannot be used (0: it can)
        self._kind = np.zeros(0, dtype=np.int64)  # node kind id (-1 for none)
        self._signature = np.zeros(0, dtype=np.int64)  # node state signature id (-1 for none)
        self._cpu_total = 0  # allocatable milli-CPU of the usable nodes
        self._histograms = GapHistograms()  # the gap histograms, in all and by GPU group
        self._kind_nodes: dict[int, Node] = {}  # a node of each kind (to fit pods on it empty)
        self._kind_empty: dict[int, NodeState] = {}  # that node, empty (made when first asked)
        # Each GPU of each node by its device state id (see DeviceStates), 0 for no GPU: a
        # request is worked out once per state, then per node by counting with arrays.
        self._devs = np.zeros((0, 0), dtype=np.int32)
        self._dev_states = DeviceStates(self._MAX_TABLES)
        self._kinds = Ids()
        self._signatures = Ids()
        self._scores: OrderedDict[Hashable, _ScoreTable] = OrderedDict()
        self._reasons: OrderedDict[Hashable, _ReasonTable] = OrderedDict()
        self._never: OrderedDict[Hashable, np.ndarray] = OrderedDict()  # per demand, per kind: text id, -1 unknown
        self._texts: list[str] = [""]
        self._text_ids: dict[str, int] = {"": 0}
        self.layout = 0  # raised when a node joins or leaves: positions of names change
        self._names: tuple[int, list[str]] = (-1, [])
        for state in states:
            self.put(state)

    # ------------------------------------------------------------ the cluster

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    @property
    def states(self) -> list[NodeState]:
        """The usable nodes' states, in position order."""
        return [s for s in self._states if s is not None]

    @property
    def gaps(self) -> np.ndarray:
        """How many GPUs of the cluster have each free share, in hundredths (index 0..100)."""
        return self._histograms.gaps

    def get(self, name: str) -> NodeState | None:
        i = self._index.get(name)
        return None if i is None else self._states[i]

    def problem(self, name: str) -> str:
        """Why node ``name`` cannot be used ("" if it can, or is unknown)."""
        i = self._index.get(name)
        return "" if i is None else self._texts[self._problem[i]]

    def names(self) -> list[str]:
        """Every node's name by position ("" for a free position); the same list object while
        :attr:`layout` stays."""
        if self._names[0] != self.layout:
            out = [""] * self._size
            for name, i in self._index.items():
                out[i] = name
            self._names = (self.layout, out)
        return self._names[1]

    def positions(self, names: Sequence[str]) -> np.ndarray:
        """Each name's position (``-1`` if unknown); stable until :attr:`layout` changes."""
        return np.fromiter(map(self._index.get, names, repeat(-1)), dtype=np.int64, count=len(names))

    def put(self, state: NodeState) -> None:
        """Add a node or replace its state."""
        name = state.node.name
        i = self._index.get(name)
        if i is None:
            i = self._join(name)
        elif self._states[i] is state:
            return
        self._set(i, state, "")

    def put_problem(self, name: str, problem: str) -> None:
        """Node ``name`` exists but cannot be used, for ``problem``: it fits no pod until put again."""
        i = self._index.get(name)
        if i is None:
            i = self._join(name)
        self._set(i, None, problem)

    def remove(self, name: str) -> None:
        i = self._index.pop(name, None)
        if i is None:
            return
        self._set(i, None, "")
        self._alive[i] = False
        self._free_positions.append(i)
        self.layout += 1

    def _join(self, name: str) -> int:
        if self._free_positions:
            i = self._free_positions.pop()
        else:
            i = self._size
            if i >= len(self._stamp):
                self._grow(max(16, 2 * len(self._stamp)))
            self._size += 1
        self._index[name] = i
        self._alive[i] = True
        self._rank[i] = self._order.get(name, len(self._order) + i)
        self.layout += 1
        return i

    def _grow(self, capacity: int) -> None:
        extra = capacity - len(self._stamp)

        def more(array: np.ndarray, fill: Any) -> np.ndarray:
            return np.concatenate([array, np.full(extra, fill, dtype=array.dtype)])

        self._stamp = more(self._stamp, 0)
        self._alive = more(self._alive, False)
        self._cpu_free = more(self._cpu_free, 0)
        self._memory_free = more(self._memory_free, 0)
        self._room = more(self._room, 0)
        self._gpu_free = more(self._gpu_free, 0)
        self._gpu_capacity = more(self._gpu_capacity, 0)
        self._rank = more(self._rank, 0.0)
        self._problem = more(self._problem, 0)
        self._kind = more(self._kind, -1)
        self._signature = more(self._signature, -1)
        self._devs = np.concatenate([self._devs, np.zeros((extra, self._devs.shape[1]), dtype=np.int32)])
        self._states.extend([None] * extra)
        self._histograms.grow(extra)

    def _set(self, i: int, state: NodeState | None, problem: str) -> None:
        histograms = self._histograms
        pair = (int(self._kind[i]), int(histograms.node_group[i]))
        self._set_state(i, state, problem)
        now = (int(self._kind[i]), int(histograms.node_group[i]))
        if now != pair:
            histograms.moved(pair, now)

    def _set_state(self, i: int, state: NodeState | None, problem: str) -> None:
        self._histograms.take(i)
        old = self._states[i]
        if old is not None:
            self._cpu_total -= old.node.cpu_milli
        self._states[i] = state
        self._problem[i] = self._text(problem) if problem else 0
        self._clock += 1
        self._stamp[i] = self._clock
        if state is None:
            self._cpu_free[i] = self._memory_free[i] = self._room[i] = 0
            self._gpu_free[i] = self._gpu_capacity[i] = 0
            self._kind[i] = self._signature[i] = -1
            self._devs[i] = 0
            return
        self._set_devices(i, state)
        self._histograms.add(i, state)
        self._cpu_total += state.node.cpu_milli
        self._cpu_free[i] = state.cpu_free
        self._memory_free[i] = state.memory_free
        self._room[i] = state.node.max_pods - len(state.pods)
        self._gpu_free[i] = state.free_total
        self._gpu_capacity[i] = MILLI * len(state.node.devices)
        kind = self._kinds.of(state.node.kind)
        self._kind[i] = kind
        self._kind_nodes.setdefault(kind, state.node)
        self._signature[i] = self._signatures.of(_signature(kind, state))
        slack = self._ID_SLACK
        if len(self._signatures) > 4 * self._size + slack or len(self._dev_states) > 4 * self._devs.size + slack:
            self._compact()

    def _fits_empty_by_group(self, demand: Demand) -> np.ndarray:
        """Per GPU group, whether ``demand`` fits some node of the group that is in the
        cluster, were that node empty."""
        return self._histograms.fits_empty_by_group(lambda kinds: self._never_by_kind(demand, kinds))

    def _compact(self) -> None:
        """Number the node signatures and device states again from those in use: states come
        and go with every bind, and the tables of ids would otherwise grow for ever. What was
        worked out per id goes with them."""
        self._signatures = Ids()
        self._dev_states.clear()
        for table in self._scores.values():
            table.by_signature.clear()
        for i, state in enumerate(self._states):
            if state is not None:
                self._signature[i] = self._signatures.of(_signature(int(self._kind[i]), state))
                self._set_devices(i, state)

    def _set_devices(self, i: int, state: NodeState) -> None:
        node = state.node
        width = len(node.devices)
        if width > self._devs.shape[1]:
            grown = np.zeros((len(self._devs), width), dtype=np.int32)
            grown[:, : self._devs.shape[1]] = self._devs
            self._devs = grown
        row = self._devs[i]
        row[:] = 0
        id_of = self._dev_states.id_of
        for g, (device, usage) in enumerate(zip(node.devices, state.usage, strict=True)):
            row[g] = id_of(node, device, usage)

    def _hosted(self, gpu: GpuRequest, rows: np.ndarray) -> Hosting:
        """What the device states in ``rows`` answer ``gpu`` (see :class:`.devstates.Hosting`)."""
        return self._dev_states.hosted(gpu, rows)

    def _by_arrays(self, gpu: GpuRequest, ids: np.ndarray) -> np.ndarray:
        return self._dev_states.by_arrays(gpu, ids)

    def _gpu_fits(self, gpu: GpuRequest, positions: np.ndarray) -> np.ndarray:
        """Per position, whether ``gpu`` finds enough GPUs (fit's own test, counted with arrays)."""
        if gpu.kind is GpuKind.NONE:
            fits: np.ndarray = self._kind[positions] >= 0
            return fits
        rows = self._devs[positions]
        counts = self._hosted(gpu, rows).hosts[rows].sum(axis=1)
        enough: np.ndarray = counts >= max(1, gpu.count)
        return enough

    def _gpu_reasons(self, gpu: GpuRequest, positions: np.ndarray) -> np.ndarray:
        """Text ids of why ``gpu`` does not fit on each of ``positions`` (nodes with a state
        where it does not): fit's own reason (:func:`~.fit.shortage`), from what decides it,
        worked out with arrays: per node, how many GPUs can host a share, and of the GPUs the
        selectors allow that refuse, the first with the most free memory; the text is written
        once per distinct reason that GPU refuses (how many GPUs can host is not in the text:
        see :mod:`.fit`, "Reasons")."""
        devices = self._devs[positions]
        table = self._hosted(gpu, devices)
        hosting = table.hosts[devices]
        refused = table.allowed[devices] & ~hosting
        free = np.full(devices.shape, -1, dtype=np.int64)  # of the refused GPUs (refusals have >= 0)
        if refused.any():
            ids = np.unique(devices[refused])
            fresh = ids[table.free[ids] < 0]
            if len(fresh):
                self._dev_states.refused_facts(gpu, table, fresh)
            free = np.where(refused, table.free[devices], -1)
        best = free.argmax(axis=1)  # the first of the most free memory
        lines = np.arange(len(positions))
        best_id = np.where(refused.any(axis=1), devices[lines, best], 0)  # 0: none refused
        column = np.where(best_id > 0, best, 0)  # of that GPU: a refusal may name it
        keys = np.column_stack([self._kind[positions].astype(np.int64), best_id, column])
        unique, first, inverse = _unique_rows(keys)
        kinds, best_ids, columns = unique.T
        whys, why_of = self._refused_reasons(gpu, table, best_ids, positions[first], columns)
        for kind in np.unique(kinds).tolist():  # the kind's own reason (no model or mode accepted) first
            found = kind_reason(gpu, self._kind_nodes[kind])
            if found is not None:
                why_of[kinds == kind] = len(whys)
                whys.append(found)
        if gpu.count > 1:
            why_of[best_ids == 0] = -1  # none refused: the count alone says why
        distinct, why_at = np.unique(why_of, return_inverse=True)
        texts = np.array(
            [self._text(counted_reason(gpu, whys[w] if w >= 0 else None)) for w in distinct.tolist()], dtype=np.int32
        )
        reasons: np.ndarray = texts[why_at[inverse]]
        return reasons

    def _refused_reasons(
        self, gpu: GpuRequest, table: Hosting, ids: np.ndarray, at: np.ndarray, columns: np.ndarray
    ) -> tuple[list[str], np.ndarray]:
        """:func:`~.fit.refused_reason` of the refusals of the device states ``ids`` (allowed, not
        hosting ``gpu``, their facts kept by :meth:`.DeviceStates.refused_facts`; 0: none refused) by the
        GPU in column ``columns[k]`` of the node at position ``at[k]``, as texts and each one's
        place among them. Each state's is kept in ``table`` once written: where what is short
        is known, one text per distinct shortage; the others from :meth:`.DeviceStates.refusal`, and those
        whose text names the GPU read per node for the GPU's own index (a state's refusal is
        kept from the first GPU met in it)."""
        known = table.why
        distinct = np.unique(ids)
        fresh = distinct[known[distinct] == UNKNOWN]
        if len(fresh):
            written: dict[tuple[int, int], int] = {}
            what, need = table.short[:, fresh].tolist()
            for device_id, shortage in zip(fresh.tolist(), zip(what, need, strict=True), strict=True):
                if shortage[0]:
                    place = written.get(shortage)
                    if place is None:
                        place = written[shortage] = table.whys.of(short_reason(*shortage))
                    known[device_id] = place
                else:
                    refusal = self._dev_states.refusal(gpu, table, device_id)
                    known[device_id] = NAMES_GPU if refusal.gpu >= 0 else table.whys.of(refused_reason(refusal))
        places = known[ids]
        whys = cast(list[str], list(table.whys.values))  # texts only
        told: dict[tuple[int, int], int] = {}
        for k in np.flatnonzero(places == NAMES_GPU).tolist():
            device_id = int(ids[k])
            refusal = self._dev_states.refusal(gpu, table, device_id).on(
                self._state(int(at[k])).node.devices[int(columns[k])].index
            )
            found = told.get((device_id, refusal.gpu))
            if found is None:
                found = told[device_id, refusal.gpu] = len(whys)
                whys.append(refused_reason(refusal))
            places[k] = found
        return whys, places

    def _text(self, text: str) -> int:
        found = self._text_ids.get(text)
        if found is None:
            if len(self._texts) > self._MAX_TEXTS:  # reasons name numbers: keep the table bounded
                self._forget_texts()
            found = self._text_ids[text] = len(self._texts)
            self._texts.append(text)
        return found

    def _forget_texts(self) -> None:
        problems = {i: self._texts[t] for i, t in enumerate(self._problem.tolist()) if t}
        self._texts, self._text_ids = [""], {"": 0}
        self._scores.clear()
        self._reasons.clear()
        self._never.clear()
        for i, problem in problems.items():
            self._problem[i] = self._text(problem)

    # ------------------------------------------------------------ questions

    def everyone(self) -> np.ndarray:
        """The positions of every node, in position order."""
        return np.flatnonzero(self._alive[: self._size])

    def _kept(self, tables: OrderedDict[Hashable, T], key: Hashable, make: Callable[[int], T]) -> T:
        """The table kept under ``key`` (made if new, the least recently used one dropped)."""
        return kept(tables, key, make, self._size, self._MAX_TABLES)

    def _score_table(self, policy: Policy, demand: Demand, positions: np.ndarray | None) -> _ScoreTable:
        """The score table of (policy, demand), brought up to date on ``positions`` (all known;
        None: every position)."""
        table = self._kept(self._scores, (policy, version(policy), demand_key(policy, demand)), _ScoreTable)
        if positions is None:
            n = self._size
            stale = np.flatnonzero(table.stamps[:n] != self._stamp[:n])
        else:
            stale = positions[table.stamps[positions] != self._stamp[positions]]
        if len(stale):
            fits = np.zeros(len(stale), dtype=bool)
            # nodes whose kind could not host the GPU request even empty are not asked about
            # their GPU states (a pod that fits nowhere costs nothing per GPU state then)
            hopeful = self._never_fits(Demand(0, 0, demand.gpu), stale) == 0
            if hopeful.any():
                fits[hopeful] = self._gpu_fits(demand.gpu, stale[hopeful])
            out = stale[~fits]
            table.scores[out] = -np.inf
            table.moves[:, out] = -1
            table.reasons[out] = -1  # worked out when asked (see _reasons_now)
            work = stale[fits]
            if len(work):
                self._score(policy, demand, table, work)
            table.stamps[stale] = self._stamp[stale]
        return table

    def _state(self, i: int) -> NodeState:
        state = self._states[i]
        assert state is not None, i
        return state

    def _score(self, policy: Policy, demand: Demand, table: _ScoreTable, work: np.ndarray) -> None:
        """Score ``work`` (positions where the GPU request fits), once per node state: nodes
        with one signature share the answer (unless the policy reads the pods themselves); or,
        for a policy that scores by what a share takes (``score_took``), all at once."""
        if self._score_took(policy, demand, table, work):
            return
        table.reasons[work] = 0
        if Reads.PODS in reads(policy):
            values, moves = self._score_nodes(policy, demand, work)
            table.scores[work], table.moves[:, work] = values, moves.T
            return
        memo = table.by_signature
        if len(memo) > self._size // 2 + 256:
            memo.clear()
        # one question per signature: the positions that share one are told apart by arrays
        signatures, first, at = np.unique(self._signature[work], return_index=True, return_inverse=True)
        signatures_list = signatures.tolist()
        new = [k for k, sig in enumerate(signatures_list) if sig not in memo]
        if new:
            values, moves = self._score_nodes(policy, demand, work[first[new]])
            rows = zip(values.tolist(), *moves.T.tolist(), strict=True)
            memo.update(zip([signatures_list[k] for k in new], rows, strict=True))
            if len(new) == len(signatures_list):  # every one new: no need to read them back
                table.scores[work], table.moves[:, work] = values[at], moves[at].T
                return
        found = np.array([memo[sig] for sig in signatures_list]).reshape(-1, 3)
        table.scores[work] = found[at, 0]
        table.moves[:, work] = found[at, 1:].T.astype(np.int64)

    def _score_took(self, policy: Policy, demand: Demand, table: _ScoreTable, work: np.ndarray) -> bool:
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
        rows = self._devs[work]
        hosting = self._hosted(gpu, rows)
        took = np.where(hosting.hosts[rows], hosting.took[rows], -1).max(axis=1)
        table.scores[work] = score_took.score_took(
            demand, self._cpu_free[work], self._gpu_free[work], self._gpu_capacity[work], took
        )
        table.moves[:, work] = -1
        table.reasons[work] = 0
        return True

    def _score_nodes(self, policy: Policy, demand: Demand, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:func:`~.select.score_node` of each of ``positions`` (where the GPU request fits), as
        arrays: the scores, and the gap moves (one row per position).

        A request for one share of one GPU (or one whole GPU, or one MIG instance) has one
        candidate per GPU that hosts it, and candidates on GPUs in one device state are
        equivalent (:func:`~.select.outcome`): so one candidate per distinct device state that
        hosts it, from the first GPU in that state, found from the board's device states
        instead of asking every GPU again. A policy with ``score_nodes`` scores them all at
        once when there are many (``_AT_ONCE_FROM`` nodes or more); else one with ``prepare``
        is told every candidate first. A pod without a GPU request has one placement per node,
        taking no GPU: a policy with ``score_without_gpu`` scores many such nodes at once."""
        gpu = demand.gpu
        can = capabilities(policy)
        prepare, without_gpu = can.prepare, can.score_without_gpu
        if gpu.kind is GpuKind.NONE and without_gpu is not None and len(positions) >= _AT_ONCE_FROM:
            # one placement per node, taking no GPU: no gap move
            states = list(map(self._state, positions.tolist()))
            values = np.array(without_gpu.score_without_gpu(demand, states, self._devs[positions]), dtype=float)
            return values, np.full((len(values), 2), NO_MOVE, dtype=np.int64)
        if gpu.kind is GpuKind.NONE or gpu.count > 1:
            found = (
                [(state, gpu_fit(demand, state)) for state in map(self._state, positions.tolist())]
                if gpu.kind is GpuKind.NONE
                else self._several_fits(demand, positions)
            )
            candidates = [(state, firsts(state, got.allocations)) for state, got in found if got]
            if prepare is not None:
                prepare.prepare(demand, [(state, alloc) for state, allocs in candidates for alloc in allocs])
            scored = iter([score_firsts(policy, demand, state, allocs) for state, allocs in candidates])
            return _as_arrays([next(scored) if got else got.reason for _, got in found])
        rows = self._devs[positions]
        hosts = self._hosted(gpu, rows).hosts[rows]
        at_once = can.score_nodes
        if at_once is not None and len(positions) >= _AT_ONCE_FROM:
            values, moves = at_once.score_nodes(demand, self._candidates(gpu, positions, rows, hosts))
            return values, moves
        # the states the rules of arrays answer take exactly what is asked where they host it
        sharing = (hosts & self._by_arrays(gpu, rows)).tolist()
        nodes: list[tuple[NodeState, list[Allocation]]] = []
        for i, row, hosting, asked in zip(positions.tolist(), rows.tolist(), hosts.tolist(), sharing, strict=True):
            state = self._state(i)
            node = state.node
            seen: set[int] = set()
            mine: list[Allocation] = []
            for g, device_id in enumerate(row[: len(node.devices)]):
                if hosting[g] and device_id not in seen:
                    seen.add(device_id)
                    share = _share_on(gpu, node, node.devices[g], state.usage[g], asked[g])
                    mine.append(Allocation(node.name, (share,), demand.cpu_milli, demand.memory_mib))
            nodes.append((state, mine))
        if prepare is not None:
            prepare.prepare(demand, [(state, alloc) for state, allocs in nodes for alloc in allocs])
        return _as_arrays([score_firsts(policy, demand, state, allocs) for state, allocs in nodes])

    def _several_fits(self, demand: Demand, positions: np.ndarray) -> list[tuple[NodeState, Fit]]:
        """:func:`~.fit.gpu_fit` of a request of several GPUs on each of ``positions`` (where
        enough GPUs host one of its shares), its options found from the board's hosting table
        (one share per hosting GPU, in device order) instead of asking every GPU again."""
        gpu = demand.gpu
        rows = self._devs[positions]
        hosts = self._hosted(gpu, rows).hosts[rows].tolist()
        sharing = self._by_arrays(gpu, rows).tolist()
        found: list[tuple[NodeState, Fit]] = []
        for i, hosting, asked in zip(positions.tolist(), hosts, sharing, strict=True):
            state = self._state(i)
            node = state.node
            options = [
                _share_on(gpu, node, device, state.usage[g], asked[g])
                for g, device in enumerate(node.devices)
                if hosting[g]
            ]
            enough = len(options) >= gpu.count  # as _gpu_fits counted; else fit's own reason
            found.append((state, fit_options(demand, node, options) if enough else gpu_fit(demand, state)))
        return found

    def _candidates(
        self, gpu: GpuRequest, positions: np.ndarray, rows: np.ndarray, hosts: np.ndarray
    ) -> ShareCandidates:
        """The candidates of one share of ``gpu`` on ``positions`` (whose device states are
        ``rows``, hosting it where ``hosts``) as arrays: on each node the first GPU of each
        device state that hosts it, labelled by device state, with the share placed on each
        such state."""
        states = cast(list[NodeState], [self._states[i] for i in positions.tolist()])  # scored: known
        width = rows.shape[1]
        first = hosts & (rows > 0)  # a GPU of the node (0: none, past its last GPU)
        for g in range(1, width):
            first[:, g] &= (rows[:, :g] != rows[:, g : g + 1]).all(axis=1)
        node, column = np.nonzero(first)
        placed = np.unique(rows[node, column])
        arrayable = self._by_arrays(gpu, placed)
        shares: dict[int, DeviceShare] = {}
        for device_id in placed[~arrayable].tolist():
            host, device, usage = self._dev_states.entry(device_id)
            shares[device_id] = _share_on(gpu, host, device, usage, False)
        after = None
        if arrayable.any():  # the others: what their states become, as rows (ShareCandidates.after)
            ids = placed[arrayable]
            usage_rows, _, memory, compute = self._dev_states.state_shares(gpu, ids)
            after_rows = np.column_stack(
                [self._dev_states.table()[ids, 0], rows_add_share(usage_rows, memory, compute)]
            )
            after = (ids, after_rows, np.minimum(MILLI, compute))  # share_milli of such a share
        return ShareCandidates(states, rows, node, column, shares, after, self._cpu_free[positions])

    def _raw(self, policy: Policy, demand: Demand, positions: np.ndarray | None) -> tuple[np.ndarray, _ScoreTable]:
        """Raw scores per position (None: every position, in order, free ones never fitting),
        ``-inf`` where the pod does not fit; and the score table."""
        if positions is None:  # slices: no gathering of every array
            n = self._size
            table = self._score_table(policy, demand, None)
            fits = (
                self._alive[:n]
                & (self._room[:n] > 0)
                & (self._cpu_free[:n] >= demand.cpu_milli)
                & (self._memory_free[:n] >= demand.memory_mib)
            )
            return np.where(fits, table.scores[:n], -np.inf), table
        if 2 * len(positions) >= self._size:  # most of the cluster: work on slices, gather once
            everywhere, table = self._raw(policy, demand, None)
            return np.where(positions >= 0, everywhere[positions], -np.inf), table
        where = positions >= 0
        known = positions if where.all() else positions[where]
        table = self._score_table(policy, demand, known)
        fits = (
            (self._room[known] > 0)
            & (self._cpu_free[known] >= demand.cpu_milli)
            & (self._memory_free[known] >= demand.memory_mib)
        )
        listed = np.where(fits, table.scores[known], -np.inf)
        if known is positions:
            return listed, table
        scores = np.full(len(positions), -np.inf)
        scores[where] = listed
        return scores, table

    def filter(self, policy: Policy, demand: Demand, positions: np.ndarray | None = None) -> Outcomes:
        """Per position (all nodes if None; ``-1`` for a node unknown here): fits, or why not."""
        positions = self.everyone() if positions is None else positions
        scores, table = self._raw(policy, demand, positions)
        status = np.zeros(len(positions), dtype=np.int8)
        reason = np.zeros(len(positions), dtype=np.int32)
        failing = np.flatnonzero(scores == -np.inf)
        if len(failing):
            at = positions[failing]
            status[failing] = Status.UNSCHEDULABLE
            unknown = at < 0
            if unknown.any():
                reason[failing[unknown]] = self._text(UNKNOWN_NODE)
            known, at = failing[~unknown], at[~unknown]
            never = self._never_fits(demand, at)
            lost = never > 0
            status[known[lost]] = Status.UNRESOLVABLE
            reason[known[lost]] = never[lost]
            reason[known[~lost]] = self._reasons_now(demand, at[~lost], table)
        return Outcomes(status, reason, scores, self._texts)

    def refused(self, outcomes: Outcomes, refusals: Sequence[tuple[int, str]]) -> Outcomes:
        """``outcomes`` with each listed node ``i`` of ``refusals`` unschedulable for its text
        (a rule outside the board's, such as a namespace's GPU quota)."""
        texts = outcomes.texts
        status, reason, scores = outcomes.status.copy(), outcomes.reason.copy(), outcomes.scores.copy()
        for i, text in refusals:
            status[i], reason[i], scores[i] = Status.UNSCHEDULABLE, self._text(text), -np.inf
        if texts is not self._texts:  # the table of reasons started afresh meanwhile: ids anew
            reason = np.array([self._text(texts[r]) for r in outcomes.reason.tolist()], dtype=np.int32)
            for i, text in refusals:
                reason[i] = self._text(text)
        return Outcomes(status, reason, scores, self._texts)

    def _reasons_now(self, demand: Demand, positions: np.ndarray, scored: _ScoreTable) -> np.ndarray:
        """Why ``demand`` does not fit now on ``positions``, nodes it could fit empty (text ids)."""
        table = self._kept(self._reasons, (demand.cpu_milli, demand.memory_mib, demand.gpu), _ReasonTable)
        stale = positions[table.stamps[positions] != self._stamp[positions]]
        # host_reason's questions over arrays: only the nodes whose room, CPU or memory fall
        # short are asked for its text
        host = (
            (self._room[stale] <= 0)
            | (self._cpu_free[stale] < demand.cpu_milli)
            | (self._memory_free[stale] < demand.memory_mib)
        )
        for i in stale[host].tolist():
            state = self._states[i]
            assert state is not None  # nodes without a state are never resolvable
            why = host_reason(demand, state)
            assert why is not None, i  # the arrays agree with it
            table.reasons[i] = self._text(why)
        rest = stale[~host]
        known = scored.reasons[rest] >= 0
        table.reasons[rest[known]] = scored.reasons[rest[known]]
        at = rest[~known]
        if len(at):
            table.reasons[at] = scored.reasons[at] = self._gpu_reasons(demand.gpu, at)
        table.stamps[stale] = self._stamp[stale]
        reasons: np.ndarray = table.reasons[positions]
        return reasons

    def _never_fits(self, demand: Demand, positions: np.ndarray) -> np.ndarray:
        """Per position, the text id of why ``demand`` could not fit the node even empty, or of
        why the node cannot be used (0: it could fit)."""
        kinds = self._kind[positions]
        has = kinds >= 0
        by_kind = self._never_by_kind(demand, kinds[has])
        out = np.where(has, by_kind[np.where(has, kinds, 0)], 0).astype(np.int32)
        none = ~has
        if none.any():
            problems = self._problem[positions[none]]
            out[none] = np.where(problems > 0, problems, self._text(UNKNOWN_NODE))
        return out

    def _never_by_kind(self, demand: Demand, kinds: np.ndarray) -> np.ndarray:
        """Per node kind, the text id of why ``demand`` could not fit a node of that kind even
        empty (0: it could; -1: not worked out), worked out for ``kinds`` (node kind ids, any
        number of times each) at least."""
        key = (demand.cpu_milli, demand.memory_mib, demand.gpu)
        by_kind = self._never.get(key)
        if by_kind is None or len(by_kind) < len(self._kinds):
            fresh = np.full(len(self._kinds), -1, dtype=np.int64)
            if by_kind is not None:
                fresh[: len(by_kind)] = by_kind
            by_kind = self._never[key] = fresh
            if len(self._never) > self._MAX_TABLES:
                self._never.popitem(last=False)
        else:
            self._never.move_to_end(key)
        missing = kinds[by_kind[kinds] < 0]  # usually none: a table is made once per demand
        if not len(missing):
            return by_kind
        missing = np.unique(missing)
        if demand.cpu_milli or demand.memory_mib:
            # fit on an empty node: its room, CPU and memory first, then the GPU request, whose
            # answer the pod's CPU and memory do not change (the GPU request's own table)
            gpu_only = self._never_by_kind(Demand(0, 0, demand.gpu), missing)
            for kind in missing.tolist():
                why = host_reason(demand, self._empty_of(kind))
                by_kind[kind] = gpu_only[kind] if why is None else self._text(why)
            return by_kind
        for kind in missing.tolist():
            empty = fit(demand, self._empty_of(kind))
            by_kind[kind] = 0 if empty else self._text(empty.reason)
        return by_kind

    def _empty_of(self, kind: int) -> NodeState:
        """The node of ``kind`` (see ``_kind_nodes``) with nothing on it, made once."""
        found = self._kind_empty.get(kind)
        if found is None:
            found = self._kind_empty[kind] = NodeState.empty(self._kind_nodes[kind])
        return found

    def scores(self, policy: Policy, demand: Demand, positions: np.ndarray | None = None) -> np.ndarray:
        """Per position (all nodes if None), the policy's finished score: adjusted for the
        cluster, normalised over the listed nodes that fit; ``-inf`` where the pod does not fit."""
        if positions is None:
            return self._finished(policy, demand, None)[self._alive[: self._size]]
        return self._finished(policy, demand, positions)

    def _finished(self, policy: Policy, demand: Demand, positions: np.ndarray | None) -> np.ndarray:
        scores, table = self._raw(policy, demand, positions)
        return finish(policy, demand, scores, _Cluster(self, table, positions))

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
        return int(top[np.argmin(self._rank[positions[top]])])

    def best(self, policy: Policy, demand: Demand) -> Placement | None:
        """The winning placement over every node (ties: the lowest ``order``, then position)."""
        if not self._index:
            return None
        scores = self._finished(policy, demand, None)
        chosen = self.pick(scores, np.arange(self._size))
        if chosen is None:
            return None
        state = self._states[chosen]
        assert state is not None
        result = evaluate(policy, demand, state)
        assert not isinstance(result, str), result
        return Placement(result.node, float(scores[chosen]), result.allocation)
