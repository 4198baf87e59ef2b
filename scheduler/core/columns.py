"""The board's columns of node state: one array per fact the board's questions read (free CPU,
memory, room for pods, GPU share, node kind, state signature, device states), indexed by a
node's position, and the stamp of each node, raised on every change.

Positions are stable: a node keeps its position until it leaves, and a new node takes a free
one (:class:`Positions`). Every array has room for as many positions as the largest, grown by
doubling; only the first ``size`` entries matter. What each question works out from these
columns, and keeps per pod shape, is elsewhere (:mod:`.scorecache`, :mod:`.reasons`): a kept
answer notes the stamp of the node it was worked out at, and is worked out again once the
stamp moves. The node signatures and device states are numbered again from those in use when
their tables outgrow the nodes (:meth:`Columns.numbering` says when).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from itertools import repeat
from typing import Any

import numpy as np

from .devstates import DeviceStates
from .histograms import GapHistograms
from .ids import Ids
from .inventory import Node
from .request import MILLI
from .state import NodeState
from .texts import Texts

MAX_TABLES = 128  # per kind of table kept per pod shape or GPU request (the least recently used goes)
ID_SLACK = 4096  # ids past four per node (per GPU) and this many: numbered again


def signature(kind: int, state: NodeState) -> Hashable:
    """What a node's score can depend on (see Reads): nodes with equal signatures score alike."""
    return (kind, state.usage, state.cpu_milli, state.memory_mib, len(state.pods))


class Positions:
    """Which node name sits at which position, the positions in use (``alive``) and each one's
    rank for ties (its name's ``order``, else after every ordered name by position). ``layout``
    is raised when a node joins or leaves: the positions of names change."""

    __slots__ = ("_free", "_index", "_names", "_order", "alive", "layout", "rank", "size")

    def __init__(self, order: Mapping[str, int] | None) -> None:
        self._order = dict(order or {})
        self._index: dict[str, int] = {}
        self._free: list[int] = []
        self.size = 0  # positions in use or free: the length that matters of every array
        self.alive = np.zeros(0, dtype=bool)
        self.rank = np.zeros(0, dtype=np.float64)
        self.layout = 0
        self._names: tuple[int, list[str]] = (-1, [])

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def get(self, name: str) -> int | None:
        return self._index.get(name)

    def full(self, capacity: int) -> bool:
        """Whether a new node needs a position past ``capacity``."""
        return not self._free and self.size >= capacity

    def grow(self, extra: int) -> None:
        self.alive = np.concatenate([self.alive, np.zeros(extra, dtype=bool)])
        self.rank = np.concatenate([self.rank, np.zeros(extra, dtype=np.float64)])

    def join(self, name: str) -> int:
        """Give ``name`` a position (a free one if any), within the arrays' room."""
        if self._free:
            i = self._free.pop()
        else:
            i = self.size
            self.size += 1
        self._index[name] = i
        self.alive[i] = True
        self.rank[i] = self._order.get(name, len(self._order) + i)
        self.layout += 1
        return i

    def leave(self, name: str) -> int | None:
        """Free the position of ``name`` (None: unknown)."""
        i = self._index.pop(name, None)
        if i is not None:
            self.alive[i] = False
            self._free.append(i)
            self.layout += 1
        return i

    def names(self) -> list[str]:
        """Every node's name by position ("" for a free position); the same list object while
        ``layout`` stays."""
        if self._names[0] != self.layout:
            out = [""] * self.size
            for name, i in self._index.items():
                out[i] = name
            self._names = (self.layout, out)
        return self._names[1]

    def positions(self, names: Sequence[str]) -> np.ndarray:
        """Each name's position (``-1`` if unknown); stable until ``layout`` changes."""
        return np.fromiter(map(self._index.get, names, repeat(-1)), dtype=np.int64, count=len(names))

    def everyone(self) -> np.ndarray:
        """The positions of every node, in position order."""
        return np.flatnonzero(self.alive[: self.size])


class NodeKinds:
    """The node kinds met (by id), a node of each (to fit pods on it empty), and that node empty
    (made when first asked)."""

    __slots__ = ("_empty", "_ids", "_nodes")

    def __init__(self) -> None:
        self._ids = Ids()
        self._nodes: dict[int, Node] = {}
        self._empty: dict[int, NodeState] = {}

    def __len__(self) -> int:
        return len(self._ids)

    def of(self, node: Node) -> int:
        kind = self._ids.of(node.kind)
        self._nodes.setdefault(kind, node)
        return kind

    def node(self, kind: int) -> Node:
        return self._nodes[kind]

    def empty(self, kind: int) -> NodeState:
        found = self._empty.get(kind)
        if found is None:
            found = self._empty[kind] = NodeState.empty(self._nodes[kind])
        return found


class Columns:
    def __init__(self, order: Mapping[str, int] | None, texts: Texts) -> None:
        self.places = Positions(order)
        self.texts = texts
        self.states: list[NodeState | None] = []
        self.clock = 0  # the last stamp given
        self.stamp = np.zeros(0, dtype=np.int64)  # raised on every change of the node
        self.cpu_free = np.zeros(0, dtype=np.int64)
        self.memory_free = np.zeros(0, dtype=np.int64)
        self.room = np.zeros(0, dtype=np.int64)
        self.gpu_free = np.zeros(0, dtype=np.int64)  # free share of the node's GPUs, milli-GPU
        self.gpu_capacity = np.zeros(0, dtype=np.int64)  # milli-GPU of all its GPUs
        self.problem = np.zeros(0, dtype=np.int32)  # text id of why the node cannot be used (0: it can)
        self.kind = np.zeros(0, dtype=np.int64)  # node kind id (-1 for none)
        self.signature = np.zeros(0, dtype=np.int64)  # node state signature id (-1 for none)
        self.cpu_total = 0  # allocatable milli-CPU of the usable nodes
        self.histograms = GapHistograms()  # the gap histograms, in all and by GPU group
        self.kinds = NodeKinds()
        # Each GPU of each node by its device state id (see DeviceStates), 0 for no GPU: a
        # request is worked out once per state, then per node by counting with arrays.
        self.devs = np.zeros((0, 0), dtype=np.int32)
        self.dev_states = DeviceStates(MAX_TABLES)
        self.signatures = Ids()
        self.numbering = 0  # raised when signatures and device states are numbered again
        self.id_slack = ID_SLACK
        texts.on_forget(self._problems_again)

    @property
    def size(self) -> int:
        return self.places.size

    def state(self, i: int) -> NodeState:
        """The state of the node at position ``i`` (which has one)."""
        state = self.states[i]
        assert state is not None, i
        return state

    def put(self, state: NodeState) -> None:
        """Add a node or replace its state."""
        name = state.node.name
        i = self.places.get(name)
        if i is None:
            i = self._join(name)
        elif self.states[i] is state:
            return
        self._set(i, state, "")

    def put_problem(self, name: str, problem: str) -> None:
        """Node ``name`` exists but cannot be used, for ``problem``: it fits no pod until put again."""
        i = self.places.get(name)
        if i is None:
            i = self._join(name)
        self._set(i, None, problem)

    def remove(self, name: str) -> None:
        i = self.places.leave(name)
        if i is not None:
            self._set(i, None, "")

    def _join(self, name: str) -> int:
        if self.places.full(len(self.stamp)):
            self._grow(max(16, 2 * len(self.stamp)))
        return self.places.join(name)

    def _grow(self, capacity: int) -> None:
        extra = capacity - len(self.stamp)

        def more(array: np.ndarray, fill: Any) -> np.ndarray:
            return np.concatenate([array, np.full(extra, fill, dtype=array.dtype)])

        self.places.grow(extra)
        self.stamp = more(self.stamp, 0)
        self.cpu_free = more(self.cpu_free, 0)
        self.memory_free = more(self.memory_free, 0)
        self.room = more(self.room, 0)
        self.gpu_free = more(self.gpu_free, 0)
        self.gpu_capacity = more(self.gpu_capacity, 0)
        self.problem = more(self.problem, 0)
        self.kind = more(self.kind, -1)
        self.signature = more(self.signature, -1)
        self.devs = np.concatenate([self.devs, np.zeros((extra, self.devs.shape[1]), dtype=np.int32)])
        self.states.extend([None] * extra)
        self.histograms.grow(extra)

    def _set(self, i: int, state: NodeState | None, problem: str) -> None:
        histograms = self.histograms
        pair = (int(self.kind[i]), int(histograms.node_group[i]))
        self._set_state(i, state, problem)
        now = (int(self.kind[i]), int(histograms.node_group[i]))
        if now != pair:
            histograms.moved(pair, now)

    def _set_state(self, i: int, state: NodeState | None, problem: str) -> None:
        old = self.states[i]
        # the same node in another state (a bind, a hold, a pod gone): only its GPUs whose usage
        # changed are asked again (a state made by apply or release keeps the others' usage)
        same = old is not None and state is not None and old.node is state.node
        if same:
            assert state is not None
            self.histograms.change(i, state)
        else:
            self.histograms.take(i)
        if old is not None:
            self.cpu_total -= old.node.cpu_milli
        self.states[i] = state
        self.problem[i] = self.texts.of(problem) if problem else 0
        self.clock += 1
        self.stamp[i] = self.clock
        if state is None:
            self.cpu_free[i] = self.memory_free[i] = self.room[i] = 0
            self.gpu_free[i] = self.gpu_capacity[i] = 0
            self.kind[i] = self.signature[i] = -1
            self.devs[i] = 0
            return
        self._set_devices(i, state, old if same else None)
        if not same:
            self.histograms.add(i, state)
        self.cpu_total += state.node.cpu_milli
        self.cpu_free[i] = state.cpu_free
        self.memory_free[i] = state.memory_free
        self.room[i] = state.node.max_pods - len(state.pods)
        self.gpu_free[i] = state.free_total
        self.gpu_capacity[i] = MILLI * len(state.node.devices)
        kind = self.kinds.of(state.node)
        self.kind[i] = kind
        self.signature[i] = self.signatures.of(signature(kind, state))
        slack = self.id_slack
        if len(self.signatures) > 4 * self.size + slack or len(self.dev_states) > 4 * self.devs.size + slack:
            self._compact()

    def _compact(self) -> None:
        """Number the node signatures and device states again from those in use: states come
        and go with every bind, and the tables of ids would otherwise grow for ever. What was
        worked out per id goes with them (those who keep it watch ``numbering``)."""
        self.signatures = Ids()
        self.dev_states.clear()
        self.numbering += 1
        for i, state in enumerate(self.states):
            if state is not None:
                self.signature[i] = self.signatures.of(signature(int(self.kind[i]), state))
                self._set_devices(i, state)

    def _set_devices(self, i: int, state: NodeState, old: NodeState | None = None) -> None:
        """The device state ids of the node at ``i`` in ``state``; ``old``, its state before (the
        same node), whose GPUs with the very same usage keep their ids."""
        node = state.node
        width = len(node.devices)
        if width > self.devs.shape[1]:
            grown = np.zeros((len(self.devs), width), dtype=np.int32)
            grown[:, : self.devs.shape[1]] = self.devs
            self.devs = grown
        row = self.devs[i]
        id_of = self.dev_states.id_of
        if old is not None:
            for g, (device, usage, was) in enumerate(zip(node.devices, state.usage, old.usage, strict=True)):
                if usage is not was:
                    row[g] = id_of(node, device, usage)
            return
        row[:] = 0
        for g, (device, usage) in enumerate(zip(node.devices, state.usage, strict=True)):
            row[g] = id_of(node, device, usage)

    def _problems_again(self, old: list[str]) -> None:
        """The texts started afresh: number the nodes' problems again."""
        problems = {i: old[t] for i, t in enumerate(self.problem.tolist()) if t}
        for i, problem in problems.items():
            self.problem[i] = self.texts.of(problem)
