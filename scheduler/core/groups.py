"""GPU groups: the cluster's GPUs split by what may run on them (model and sharing mode).

A pod pinned to a GPU model (or to a sharing mode, or too large for some nodes) can use the
GPUs of some groups only, so what is free on one group is not free for every pod. A policy
that declares ``Reads.GROUPS`` sees the cluster this way in ``adjust``: a :class:`Groups`
holds, per group, how many GPUs have each free share (the gap histogram of
:mod:`scheduler.core.capacity`, split by group), the group of each scored node, one GPU of
each group (to size requests on it) and which groups a pod could use at all. The board
keeps these current as nodes change; :func:`groups_of` works them out from node states
(the plain answer the board is checked against).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from .capacity import GAP_LEVELS
from .fit import fit
from .inventory import Device, Node, SharingMode
from .request import Demand
from .state import NodeState

GroupKey = tuple[str, SharingMode]  # (GPU model name, sharing mode)


def device_group(device: Device) -> GroupKey:
    return device.model.name, device.mode


def node_group(node: Node) -> GroupKey | None:
    """A node's group: that of its first GPU (None without GPUs)."""
    return device_group(node.devices[0]) if node.devices else None


@dataclass(frozen=True, slots=True)
class Groups:
    """The cluster by GPU group, for one scoring call (its arrays are valid for that call only).

    ``gaps[g, h]``: GPUs of group g whose free share is at level h (hundredths of a GPU);
    ``node_group[j]``: the group of the j-th scored node, -1 for a node without GPUs;
    ``devices[g]``: one GPU of group g; :meth:`allowed`: per group, whether ``demand``
    fits some node of the group when that node is empty (CPU, memory, GPU count, model
    and mode).
    """

    keys: tuple[GroupKey, ...]
    gaps: np.ndarray
    node_group: np.ndarray
    devices: tuple[Device, ...]
    fits_empty: Callable[[Demand], np.ndarray]

    def allowed(self, demand: Demand) -> np.ndarray:
        return self.fits_empty(demand)


def _node_shape(node: Node) -> Hashable:
    """What decides whether a pod fits a node when it is empty (its name aside)."""
    return node.kind


def groups_of(cluster: Sequence[NodeState], scored: Sequence[NodeState]) -> Groups:
    """The :class:`Groups` of ``cluster``, for the nodes ``scored`` (in their order)."""
    index: dict[GroupKey, int] = {}
    devices: list[Device] = []
    levels: list[tuple[int, int]] = []
    empties: dict[int, dict[Hashable, NodeState]] = {}
    for state in cluster:
        for device, level in zip(state.node.devices, state.gap_levels(), strict=True):
            key = device_group(device)
            if key not in index:
                index[key] = len(devices)
                devices.append(device)
            levels.append((index[key], level))
        own = node_group(state.node)
        if own is not None:
            empties.setdefault(index[own], {}).setdefault(_node_shape(state.node), NodeState.empty(state.node))
    gaps = np.zeros((len(devices), GAP_LEVELS + 1), dtype=np.int64)
    for g, level in levels:
        gaps[g, level] += 1
    mine = np.array([index.get(k, -1) if (k := node_group(s.node)) else -1 for s in scored], dtype=np.int64)

    def fits_empty(demand: Demand) -> np.ndarray:
        return np.array([any(fit(demand, e) for e in empties.get(g, {}).values()) for g in range(len(devices))])

    return Groups(tuple(index), gaps, mine, tuple(devices), fits_empty)
