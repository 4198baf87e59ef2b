"""Why a pod does not fit a node, per node, as the board answers it: now (:meth:`Reasons.now`),
or ever, were the node empty (:meth:`Reasons.never_fits`).

The texts are :mod:`.fit`'s own (the plain node-by-node answers of :mod:`.select`), worked out
with arrays over the board's columns (:mod:`.columns`) and its device states: host_reason's
questions (room, CPU, memory) for every node at once, the GPU request's reason from how many
GPUs of each node can host a share and the refusal of the GPU that decides it. Kept per pod
shape: a table of reasons now per (CPU, memory, GPU request), valid per node for the node's
stamp; per node kind, why the shape could not fit a node of that kind even empty. Reasons are
ids into the board's :class:`~.texts.Texts`; the tables go when the texts start afresh.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import cast

import numpy as np

from .arrays import distinct, unique_rows
from .columns import MAX_TABLES, Columns
from .devstates import NAMES_GPU, UNKNOWN, Hosting, kept
from .fit import counted_reason, fit, host_reason, kind_reason, refused_reason, short_reason
from .request import Demand, GpuRequest

UNKNOWN_NODE = "node unknown to gpuslice"


class ReasonTable:
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


class Reasons:
    def __init__(self, columns: Columns) -> None:
        self._columns = columns
        self._tables: OrderedDict[Hashable, ReasonTable] = OrderedDict()
        self._never: OrderedDict[Hashable, np.ndarray] = OrderedDict()  # per demand, per kind: text id, -1 unknown
        columns.texts.on_forget(self._forget)

    def _forget(self, _old: list[str]) -> None:
        self._tables.clear()
        self._never.clear()

    def now(self, demand: Demand, positions: np.ndarray, gpu_known: np.ndarray) -> np.ndarray:
        """Why ``demand`` does not fit now on ``positions``, nodes it could fit empty (text ids).
        ``gpu_known`` is the score table's own per node (why the GPU request does not fit, -1
        not worked out yet): read where known, written where worked out here."""
        columns = self._columns
        key = (demand.cpu_milli, demand.memory_mib, demand.gpu)
        table = kept(self._tables, key, ReasonTable, columns.size, MAX_TABLES)
        stamp = columns.stamp
        stale = positions[table.stamps[positions] != stamp[positions]]
        # host_reason's questions over arrays: only the nodes whose room, CPU or memory fall
        # short are asked for its text
        host = (
            (columns.room[stale] <= 0)
            | (columns.cpu_free[stale] < demand.cpu_milli)
            | (columns.memory_free[stale] < demand.memory_mib)
        )
        for i in stale[host].tolist():
            state = columns.states[i]
            assert state is not None  # nodes without a state are never resolvable
            why = host_reason(demand, state)
            assert why is not None, i  # the arrays agree with it
            table.reasons[i] = columns.texts.of(why)
        rest = stale[~host]
        known = gpu_known[rest] >= 0
        table.reasons[rest[known]] = gpu_known[rest[known]]
        at = rest[~known]
        if len(at):
            table.reasons[at] = gpu_known[at] = self._gpu(demand.gpu, at)
        table.stamps[stale] = stamp[stale]
        reasons: np.ndarray = table.reasons[positions]
        return reasons

    def never_fits(self, demand: Demand, positions: np.ndarray) -> np.ndarray:
        """Per position, the text id of why ``demand`` could not fit the node even empty, or of
        why the node cannot be used (0: it could fit)."""
        columns = self._columns
        kinds = columns.kind[positions]
        has = kinds >= 0
        by_kind = self.never_by_kind(demand, kinds[has])
        out = np.where(has, by_kind[np.where(has, kinds, 0)], 0).astype(np.int32)
        none = ~has
        if none.any():
            problems = columns.problem[positions[none]]
            out[none] = np.where(problems > 0, problems, columns.texts.of(UNKNOWN_NODE))
        return out

    def never_by_kind(self, demand: Demand, kinds: np.ndarray) -> np.ndarray:
        """Per node kind, the text id of why ``demand`` could not fit a node of that kind even
        empty (0: it could; -1: not worked out), worked out for ``kinds`` (node kind ids, any
        number of times each) at least."""
        node_kinds, texts = self._columns.kinds, self._columns.texts
        key = (demand.cpu_milli, demand.memory_mib, demand.gpu)
        by_kind = self._never.get(key)
        if by_kind is None or len(by_kind) < len(node_kinds):
            fresh = np.full(len(node_kinds), -1, dtype=np.int64)
            if by_kind is not None:
                fresh[: len(by_kind)] = by_kind
            by_kind = self._never[key] = fresh
            if len(self._never) > MAX_TABLES:
                self._never.popitem(last=False)
        else:
            self._never.move_to_end(key)
        missing = kinds[by_kind[kinds] < 0]  # usually none: a table is made once per demand
        if not len(missing):
            return by_kind
        missing = distinct(missing)
        if demand.cpu_milli or demand.memory_mib:
            # fit on an empty node: its room, CPU and memory first, then the GPU request, whose
            # answer the pod's CPU and memory do not change (the GPU request's own table)
            gpu_only = self.never_by_kind(Demand(0, 0, demand.gpu), missing)
            for kind in missing.tolist():
                why = host_reason(demand, node_kinds.empty(kind))
                by_kind[kind] = gpu_only[kind] if why is None else texts.of(why)
            return by_kind
        for kind in missing.tolist():
            empty = fit(demand, node_kinds.empty(kind))
            by_kind[kind] = 0 if empty else texts.of(empty.reason)
        return by_kind

    def fits_empty_by_group(self, demand: Demand) -> np.ndarray:
        """Per GPU group, whether ``demand`` fits some node of the group that is in the
        cluster, were that node empty."""
        return self._columns.histograms.fits_empty_by_group(lambda kinds: self.never_by_kind(demand, kinds))

    def _gpu(self, gpu: GpuRequest, positions: np.ndarray) -> np.ndarray:
        """Text ids of why ``gpu`` does not fit on each of ``positions`` (nodes with a state
        where it does not): fit's own reason (:func:`~.fit.shortage`), from what decides it,
        worked out with arrays: per node, how many GPUs can host a share, and of the GPUs the
        selectors allow that refuse, the first with the most free memory; the text is written
        once per distinct reason that GPU refuses (how many GPUs can host is not in the text:
        see :mod:`.fit`, "Reasons")."""
        columns = self._columns
        devices = columns.devs[positions]
        table = columns.dev_states.hosted(gpu, devices)
        hosting = table.hosts[devices]
        refused = table.allowed[devices] & ~hosting
        free = np.full(devices.shape, -1, dtype=np.int64)  # of the refused GPUs (refusals have >= 0)
        if refused.any():
            ids = distinct(devices[refused])
            fresh = ids[table.free[ids] < 0]
            if len(fresh):
                columns.dev_states.refused_facts(gpu, table, fresh)
            free = np.where(refused, table.free[devices], -1)
        best = free.argmax(axis=1)  # the first of the most free memory
        lines = np.arange(len(positions))
        best_id = np.where(refused.any(axis=1), devices[lines, best], 0)  # 0: none refused
        column = np.where(best_id > 0, best, 0)  # of that GPU: a refusal may name it
        keys = np.column_stack([columns.kind[positions].astype(np.int64), best_id, column])
        unique, first, inverse = unique_rows(keys)
        kinds, best_ids, columns_of = unique.T
        whys, why_of = self._refused(gpu, table, best_ids, positions[first], columns_of)
        for kind in distinct(kinds).tolist():  # the kind's own reason (no model or mode accepted) first
            found = kind_reason(gpu, columns.kinds.node(kind))
            if found is not None:
                why_of[kinds == kind] = len(whys)
                whys.append(found)
        if gpu.count > 1:
            why_of[best_ids == 0] = -1  # none refused: the count alone says why
        written, why_at = np.unique(why_of, return_inverse=True)
        texts = np.array(
            [columns.texts.of(counted_reason(gpu, whys[w] if w >= 0 else None)) for w in written.tolist()],
            dtype=np.int32,
        )
        reasons: np.ndarray = texts[why_at[inverse]]
        return reasons

    def _refused(
        self, gpu: GpuRequest, table: Hosting, ids: np.ndarray, at: np.ndarray, columns: np.ndarray
    ) -> tuple[list[str], np.ndarray]:
        """:func:`~.fit.refused_reason` of the refusals of the device states ``ids`` (allowed, not
        hosting ``gpu``, their facts kept by :meth:`.DeviceStates.refused_facts`; 0: none refused) by the
        GPU in column ``columns[k]`` of the node at position ``at[k]``, as texts and each one's
        place among them. Each state's is kept in ``table`` once written: where what is short
        is known, one text per distinct shortage; the others from :meth:`.DeviceStates.refusal`, and those
        whose text names the GPU read per node for the GPU's own index (a state's refusal is
        kept from the first GPU met in it)."""
        dev_states = self._columns.dev_states
        known = table.why
        states = distinct(ids)
        fresh = states[known[states] == UNKNOWN]
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
                    refusal = dev_states.refusal(gpu, table, device_id)
                    known[device_id] = NAMES_GPU if refusal.gpu >= 0 else table.whys.of(refused_reason(refusal))
        places = known[ids]
        whys = cast(list[str], list(table.whys.values))  # texts only
        told: dict[tuple[int, int], int] = {}
        for k in np.flatnonzero(places == NAMES_GPU).tolist():
            device_id = int(ids[k])
            refusal = dev_states.refusal(gpu, table, device_id).on(
                self._columns.state(int(at[k])).node.devices[int(columns[k])].index
            )
            found = told.get((device_id, refusal.gpu))
            if found is None:
                found = told[device_id, refusal.gpu] = len(whys)
                whys.append(refused_reason(refusal))
            places[k] = found
        return whys, places
