"""The device states of a board, and what each answers a GPU request.

Each GPU of each node is known by its device state (its kind, the node's oversubscription, its
usage: :func:`~.capacity.device_key`) as a small int, 0 for no GPU: GPUs in one state answer
every fit question alike, so a request is worked out once per state (there are far fewer
states than GPUs), then per node by counting with arrays (the board's business). A state of a
mode the rules of arrays answer (:mod:`.modes.shared`) is also kept as a row of integers, so
that a request is asked of every such state at once.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Protocol, TypeVar

import numpy as np

from .arrays import distinct
from .capacity import DeviceUsage, Refusal, device_key, share_milli, usage_row
from .fit import device_share, refused_reason, state_question
from .ids import Ids
from .inventory import Device, Node
from .modes.shared import rows_fit, rows_refused_free, rows_refused_rule, rows_shortages
from .request import MILLI, GpuKind, GpuRequest

_ARRAYS_FROM = 24  # refusing device states from which DeviceStates.refused_facts asks with arrays
UNKNOWN, NAMES_GPU = -1, -2  # of a device state's reason kept in a Hosting table (see there)
_COLUMNS = 11  # a device state's row: its device kind, then the ten of capacity.usage_row


class Growing(Protocol):
    def grow(self, size: int) -> None: ...


T = TypeVar("T", bound=Growing)


def kept(tables: OrderedDict[Hashable, T], key: Hashable, make: Callable[[int], T], size: int, limit: int) -> T:
    """The table kept under ``key`` in ``tables`` (made for ``size`` positions if new, the least
    recently used one dropped past ``limit``; else grown to ``size``)."""
    table = tables.get(key)
    if table is None:
        table = tables[key] = make(size)
        if len(tables) > limit:
            tables.popitem(last=False)
    else:
        tables.move_to_end(key)
        table.grow(size)
    return table


class Hosting:
    """What each device state (by id, see :class:`DeviceStates`) answers one GPU request: whether
    the request's selectors allow the GPU, whether it can take one share, and if not why (the
    reason asked only for the states of nodes that must say why); worked out only for the
    device states of the nodes asked about."""

    __slots__ = ("allowed", "free", "hosts", "known", "refusals", "short", "took", "why", "whys")

    def __init__(self) -> None:
        self.known = np.ones(1, dtype=bool)  # id 0: no device
        self.allowed = np.zeros(1, dtype=bool)
        self.hosts = np.zeros(1, dtype=bool)
        self.took = np.zeros(1, dtype=np.int64)  # where it hosts: the milli-GPU its share takes
        self.refusals: dict[int, Refusal] = {}  # why, of the device states that refuse (as asked)
        # a refusing state's fit.refused_reason, as its place in whys (id 0, none refused:
        # "no GPU matches"); UNKNOWN: not asked yet; NAMES_GPU: its text names the GPU, so
        # it is read per node (see reasons.Reasons._refused)
        self.whys = Ids()
        self.whys.of(refused_reason(None))
        self.why = np.zeros(1, dtype=np.int64)
        self.free = np.full(1, -1, dtype=np.int64)  # a refusing state's free MiB (-1: not asked yet)
        self.short = np.zeros((2, 1), dtype=np.int64)  # its rows_shortages (0: another rule)

    def grow(self, size: int) -> None:
        """Nothing to do: :meth:`DeviceStates.hosted` works out device states as they appear."""


class DeviceStates:
    """The device states a board's nodes are in, by id, and per GPU request (the
    :class:`Hosting` tables, the least recently asked dropped past ``max_tables``) what each
    state answers. Ids are given as states are met (:meth:`id_of`) and numbered again from
    nothing by :meth:`clear` (the board then gives them again to the states in use)."""

    MAX_ANSWERS = 65_536  # kept answers of MIG and exclusive GPU states (see _answers)

    def __init__(self, max_tables: int) -> None:
        self._max_tables = max_tables
        self._kind_devices: dict[int, Device] = {}  # a device of each device kind
        self.clear()

    def clear(self) -> None:
        """Forget every state and what was worked out for it."""
        self._ids = Ids()
        self._ids.of(None)
        self._states: list[tuple[Node, Device, DeviceUsage] | None] = [None]
        # per (fit.state_question, device state id) of MIG and exclusive GPUs: the milli-GPU a
        # share takes there, or the refusal; requests of one question share it (a new memory
        # size is a new request, rarely a new question)
        self._answers: dict[tuple[Hashable, int], int | Refusal] = {}
        # per device state id: its device kind, then what the MPS and time-slicing rules read
        # (capacity.usage_row), so that a request is asked of every such state at once
        self._rows: list[tuple[int, ...]] = [(-1,) + (0,) * (_COLUMNS - 1)]  # id 0: no device
        self._array = np.zeros((0, _COLUMNS), dtype=np.int64)  # the rows above, as far as made
        self._hosting: OrderedDict[Hashable, Hosting] = OrderedDict()

    def __len__(self) -> int:
        return len(self._ids)

    def id_of(self, node: Node, device: Device, usage: DeviceUsage) -> int:
        """The id of the state of ``device`` of ``node`` holding ``usage`` (a new one if new)."""
        key = device_key(node, device, usage)
        known = len(self._ids)
        found = self._ids.of(key)
        if found == known:
            self._states.append((node, device, usage))
            self._rows.append((device.kind, *usage_row(node, device, usage)))
            self._kind_devices.setdefault(device.kind, device)
        return found

    def entry(self, device_id: int) -> tuple[Node, Device, DeviceUsage]:
        """A node, device and usage in the state ``device_id`` (the first met)."""
        entry = self._states[device_id]
        assert entry is not None
        return entry

    def hosted(self, gpu: GpuRequest, rows: np.ndarray) -> Hosting:
        """The :class:`Hosting` of ``gpu``, worked out for the device states in ``rows``."""
        table = kept(self._hosting, gpu, lambda _size: Hosting(), 0, self._max_tables)
        total = len(self._ids)
        extra = total - len(table.known)
        if extra > 0:
            table.known = np.concatenate([table.known, np.zeros(extra, dtype=bool)])
            table.allowed = np.concatenate([table.allowed, np.zeros(extra, dtype=bool)])
            table.hosts = np.concatenate([table.hosts, np.zeros(extra, dtype=bool)])
            table.took = np.concatenate([table.took, np.zeros(extra, dtype=np.int64)])
            table.why = np.concatenate([table.why, np.full(extra, UNKNOWN, dtype=np.int64)])
            table.free = np.concatenate([table.free, np.full(extra, -1, dtype=np.int64)])
            table.short = np.concatenate([table.short, np.zeros((2, extra), dtype=np.int64)], axis=1)
        unknown = ~table.known[rows]
        if not unknown.any():
            return table
        ids = self._hosted_at_once(gpu, table, distinct(rows[unknown]))
        questions: dict[int, Hashable | None] = {}  # per device kind
        answers = self._answers
        for device_id in ids.tolist():
            node, device, usage = self.entry(device_id)
            allowed = gpu.allows_model(device.model.name) and gpu.allows_mode(device.mode)
            table.allowed[device_id] = allowed
            table.known[device_id] = True
            if not allowed:  # the pod's selectors rule the GPU out: no capacity question
                continue
            if device.kind not in questions:
                questions[device.kind] = state_question(gpu, device)
            question = questions[device.kind]
            answer = answers.get((question, device_id)) if question is not None else None
            if answer is None:
                result = device_share(gpu, node, device, usage)
                answer = result if isinstance(result, Refusal) else share_milli(result)
                if question is not None:
                    if len(answers) >= self.MAX_ANSWERS:
                        answers.clear()
                    answers[question, device_id] = answer
            if isinstance(answer, Refusal):
                table.refusals[device_id] = answer
            else:
                table.hosts[device_id] = True
                table.took[device_id] = answer
        return table

    def _hosted_at_once(self, gpu: GpuRequest, table: Hosting, ids: np.ndarray) -> np.ndarray:
        """Work out ``table`` for the states among ``ids`` that the capacity rules of arrays
        answer (:meth:`by_arrays`), every such state at once; the other ids are returned, to
        be asked one by one."""
        arrayable = self.by_arrays(gpu, ids)
        if not arrayable.any():
            return ids
        chosen = ids[arrayable]
        rows, allows, memory, compute = self.state_shares(gpu, chosen)
        table.known[chosen] = True
        table.allowed[chosen] = allows
        table.hosts[chosen] = allows & rows_fit(rows, memory, compute)
        table.took[chosen] = np.minimum(MILLI, compute)  # the share is exactly what is asked
        rest: np.ndarray = ids[~arrayable]
        return rest

    def by_arrays(self, gpu: GpuRequest, ids: np.ndarray) -> np.ndarray:
        """Which of the device states ``ids`` (any shape) the capacity rules of arrays answer
        for ``gpu`` (:func:`~.modes.shared.rows_fit`): healthy MPS and time-slicing GPUs, asked for
        a share or whole GPUs."""
        if gpu.kind is not GpuKind.SHARE and gpu.kind is not GpuKind.WHOLE:
            return np.zeros(ids.shape, dtype=bool)
        arrayable: np.ndarray = self.table()[ids, 1] == 1
        return arrayable

    def table(self) -> np.ndarray:
        """Every device state's row (its device kind, then :func:`~.capacity.usage_row`), by id."""
        if len(self._array) < len(self._rows):
            fresh = np.array(self._rows[len(self._array) :], dtype=np.int64)
            self._array = np.concatenate([self._array, fresh])
        return self._array

    def state_shares(self, gpu: GpuRequest, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """For the device states ``ids``: their :func:`~.capacity.usage_row` rows, and per state
        whether ``gpu``'s selectors allow its GPU and the memory and compute of one share of
        ``gpu`` on it (worked out once per device kind)."""
        rows = self.table()[ids]
        unique, inverse = np.unique(rows[:, 0], return_inverse=True)
        allowed = np.zeros(len(unique), dtype=bool)
        shares = np.zeros((2, len(unique)), dtype=np.int64)
        for k, kind in enumerate(unique.tolist()):
            device = self._kind_devices[kind]
            allowed[k] = gpu.allows_model(device.model.name) and gpu.allows_mode(device.mode)
            shares[:, k] = gpu.share_on(device)
        return rows[:, 1:], allowed[inverse], shares[0, inverse], shares[1, inverse]

    def refused_facts(self, gpu: GpuRequest, table: Hosting, ids: np.ndarray) -> None:
        """Keep in ``table`` for the device states ``ids`` (allowed, not hosting ``gpu``) the free
        memory (MiB) their refusals report and, where the rules of arrays answer (MPS and
        time-slicing states), what is short (:func:`~.modes.shared.rows_shortages`), all at once
        from the first rule each breaks; the other states' from :meth:`refusal`."""
        free = np.zeros(len(ids), dtype=np.int64)
        # a few states (a window of nodes moves on) cost less one by one than the arrays' setup
        arrayable = self.by_arrays(gpu, ids) if len(ids) >= _ARRAYS_FROM else np.zeros(len(ids), dtype=bool)
        if arrayable.any():
            rows, _, memory, compute = self.state_shares(gpu, ids[arrayable])
            rule = rows_refused_rule(rows, memory, compute)
            free[arrayable] = rows_refused_free(rows, memory, compute, rule)
            table.short[:, ids[arrayable]] = rows_shortages(rows, memory, compute, rule)
        for k in np.flatnonzero(~arrayable).tolist():
            free[k] = self.refusal(gpu, table, int(ids[k])).free_mib
        table.free[ids] = free

    def refusal(self, gpu: GpuRequest, table: Hosting, device_id: int) -> Refusal:
        """Why the device state ``device_id`` (allowed, not hosting) refuses ``gpu``."""
        found = table.refusals.get(device_id)
        if found is None:
            result = device_share(gpu, *self.entry(device_id))
            assert isinstance(result, Refusal), (device_id, result)  # the rules of arrays agree with it
            found = table.refusals[device_id] = result
        return found
