"""GPU groups: the cluster's GPUs split by what may run on them (model and sharing mode).

A pod pinned to a GPU model (or to a sharing mode) can only use the GPUs of some groups, so
what is free on one group is not free for every pod. A :class:`GroupLedger` keeps, per
group, how many GPUs have each free share (the gap histogram of :mod:`capacity`, split
by group) and which group each node belongs to, updated as node states are replaced; a
:class:`GroupView` is what a group-aware policy sees of it on each call.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from .capacity import GAP_LEVELS, free_milli, gap_level
from .fit import fit
from .inventory import Node, SharingMode
from .memo import intern
from .request import MILLI, Demand, GpuKind, GpuRequest
from .state import NodeState, device_kind

GroupKey = tuple[str, SharingMode]  # (GPU model name, sharing mode)


def group_key(node: Node) -> GroupKey | None:
    """The group of a node's GPUs (its first GPU's model and mode); None without GPUs."""
    if not node.devices:
        return None
    device = node.devices[0]
    return device.model.name, device.mode


def _node_shape(node: Node) -> Hashable:
    """What decides whether a pod fits on the empty node (the name aside)."""
    return (
        node.cpu_milli,
        node.memory_mib,
        node.max_pods,
        node.nvlink,
        node.mps_compute_oversub_pct,
        node.ts_memory_oversub_pct,
        tuple(device_kind(d) for d in node.devices),
    )


@dataclass(frozen=True, slots=True)
class GroupView:
    """The cluster by GPU group, for one scoring call.

    ``gaps[g, h]``: GPUs of group g whose free share is at level h (hundredths of a GPU);
    ``node_group[i]``: the group of node i (board order), -1 for a node without GPUs;
    ``allowed``: per group, whether the pod being scored fits on some empty node of it.
    """

    keys: tuple[GroupKey, ...]
    node_group: np.ndarray
    gaps: np.ndarray
    allowed: np.ndarray
    ledger: GroupLedger

    def allowed_for(self, demand: Demand) -> np.ndarray:
        return self.ledger.allowed(demand)

    def milli_for(self, gpu: GpuRequest) -> np.ndarray:
        return self.ledger.milli(gpu)


class GroupLedger:
    """Per-group gap histograms of a changing set of node states (see the module docstring)."""

    _MAX_MEMO = 50_000

    def __init__(self, states: Sequence[NodeState]) -> None:
        keys: dict[GroupKey, int] = {}
        for state in states:
            for device in state.node.devices:
                keys.setdefault((device.model.name, device.mode), len(keys))
        shapes: list[dict[Hashable, NodeState]] = [{} for _ in keys]
        for state in states:
            key = group_key(state.node)
            if key is not None:
                shapes[keys[key]].setdefault(_node_shape(state.node), NodeState.empty(state.node))
        self.keys: tuple[GroupKey, ...] = tuple(keys)
        self._index = keys
        self._empty = [tuple(s.values()) for s in shapes]
        self.node_group = self.groups_of(states)
        self.gaps = np.zeros((len(keys), GAP_LEVELS + 1), dtype=np.int64)
        self._allowed: dict[int, np.ndarray] = {}
        self._milli: dict[int, np.ndarray] = {}
        for state in states:
            self._count(state, 1)

    def groups_of(self, states: Sequence[NodeState]) -> np.ndarray:
        """Each state's group index (-1: no GPUs, or a group this ledger does not know)."""
        out = np.full(len(states), -1, dtype=np.int64)
        for i, state in enumerate(states):
            key = group_key(state.node)
            if key is not None:
                out[i] = self._index.get(key, -1)
        return out

    def _count(self, state: NodeState, sign: int) -> None:
        for device, usage in zip(state.node.devices, state.usage, strict=True):
            g = self._index.get((device.model.name, device.mode))
            if g is not None:
                self.gaps[g, gap_level(free_milli(device, usage))] += sign

    def replace(self, old: NodeState, new: NodeState) -> None:
        """Account for one node's state replaced by another."""
        self._count(old, -1)
        self._count(new, 1)

    def allowed(self, demand: Demand) -> np.ndarray:
        """Per group: does ``demand`` fit on some empty node of the group (CPU, memory, GPUs,
        model and mode)? Memoised per demand."""
        key = intern(("groups allowed", demand))
        hit = self._allowed.get(key)
        if hit is None:
            hit = np.array([any(fit(demand, e) for e in empties) for empties in self._empty], dtype=bool)
            if len(self._allowed) > self._MAX_MEMO:
                self._allowed.clear()
            self._allowed[key] = hit
        return hit

    def milli(self, gpu: GpuRequest) -> np.ndarray:
        """Per group, the milli-GPU a pod with request ``gpu`` takes there (on the group's
        first GPU kind): 1000 per whole GPU, a MIG profile's compute slices out of 7, a share
        the larger of its compute and its memory as parts of the GPU. Memoised per request."""
        key = intern(("groups milli", gpu))
        hit = self._milli.get(key)
        if hit is None:
            hit = np.array([_milli_on(gpu, empties[0]) if empties else 0.0 for empties in self._empty])
            self._milli[key] = hit
        return hit

    def view(self, demand: Demand, node_group: np.ndarray | None = None) -> GroupView:
        """The view for scoring ``demand`` on every node (or on nodes of ``node_group``)."""
        groups = self.node_group if node_group is None else node_group
        return GroupView(self.keys, groups, self.gaps, self.allowed(demand), self)


def _milli_on(gpu: GpuRequest, state: NodeState) -> float:
    if gpu.kind is GpuKind.NONE or not state.node.devices:
        return 0.0
    device = state.node.devices[0]
    count = max(1, gpu.count)
    if gpu.kind is GpuKind.WHOLE:
        return float(MILLI * count)
    if gpu.kind is GpuKind.MIG:
        assert gpu.profile is not None
        return float(MILLI * gpu.profile.compute_slices / 7)
    memory, compute = gpu.share_on(device)
    per_gpu = max(compute, memory * MILLI / max(1, device.memory_mib))
    return float(min(MILLI, per_gpu) * count)
