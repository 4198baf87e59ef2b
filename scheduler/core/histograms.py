"""The gap histograms of a board: how many GPUs of the cluster have each free share, in
hundredths (a GPU's gap level, see :func:`~.capacity.gap_level`), in all and per GPU group
(:mod:`.groups`); the group of each node; and which (node kind, group) pairs the cluster has,
so that which groups a pod could use at all is asked once per pair. Kept current node by node
as the board's nodes change (by position)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np

from .capacity import GAP_LEVELS
from .groups import device_group, node_group
from .ids import Ids
from .inventory import Device
from .state import NodeState


class GapHistograms:
    def __init__(self) -> None:
        self.gaps = np.zeros(GAP_LEVELS + 1, dtype=np.int64)  # the cluster's
        self.group_ids = Ids()
        self.group_devices: list[Device] = []  # a GPU of each group
        self.group_gaps = np.zeros((0, GAP_LEVELS + 1), dtype=np.int64)  # one histogram per group
        self.node_group = np.zeros(0, dtype=np.int64)  # per position, -1 without GPUs
        self._levels: list[list[int]] = []  # per position, the gap level of each GPU
        self._dev_groups: list[list[int]] = []  # per position, the group of each GPU
        # how many nodes have each (node kind, GPU group), and those pairs as arrays (None:
        # to be made again)
        self._kind_groups: Counter[tuple[int, int]] = Counter()
        self._pairs: tuple[np.ndarray, np.ndarray] | None = None

    def grow(self, extra: int) -> None:
        """Room for ``extra`` more positions, without GPUs."""
        self.node_group = np.concatenate([self.node_group, np.full(extra, -1, dtype=np.int64)])
        self._levels.extend([[] for _ in range(extra)])
        self._dev_groups.extend([[] for _ in range(extra)])

    def take(self, i: int) -> None:
        """Take the GPUs of the node at position ``i`` out of the histograms."""
        for level, group in zip(self._levels[i], self._dev_groups[i], strict=True):
            self.gaps[level] -= 1
            self.group_gaps[group, level] -= 1
        self._levels[i] = []
        self._dev_groups[i] = []
        self.node_group[i] = -1

    def add(self, i: int, state: NodeState) -> None:
        """Count the GPUs of ``state``, the node at position ``i`` (taken out before)."""
        levels = state.gap_levels()
        groups = [self._group_of(device) for device in state.node.devices]
        for level, group in zip(levels, groups, strict=True):
            self.gaps[level] += 1
            self.group_gaps[group, level] += 1
        self._levels[i] = levels
        self._dev_groups[i] = groups
        own = node_group(state.node)
        self.node_group[i] = -1 if own is None else self.group_ids.of(own)

    def change(self, i: int, state: NodeState) -> None:
        """The node at position ``i`` is now in ``state``, the same node as before (its GPUs'
        groups and its own stay): only the GPUs whose gap level moved move."""
        levels = state.gap_levels()
        groups = self._dev_groups[i]
        for level, was, group in zip(levels, self._levels[i], groups, strict=True):
            if level != was:
                self.gaps[was] -= 1
                self.gaps[level] += 1
                self.group_gaps[group, was] -= 1
                self.group_gaps[group, level] += 1
        self._levels[i] = levels

    def moved(self, before: tuple[int, int], now: tuple[int, int]) -> None:
        """A node's (kind, group) pair went from ``before`` to ``now`` (-1 in either: none)."""
        kind_groups = self._kind_groups
        if min(before) >= 0:
            kind_groups[before] -= 1
            if not kind_groups[before]:
                del kind_groups[before]
                self._pairs = None
        if min(now) >= 0:
            kind_groups[now] += 1
            if kind_groups[now] == 1:
                self._pairs = None

    def _group_of(self, device: Device) -> int:
        """The group id of ``device`` (a new group gets a row of the group histogram)."""
        ids = self.group_ids
        known = len(ids)
        group = ids.of(device_group(device))
        if group == known:
            self.group_devices.append(device)
            self.group_gaps = np.vstack([self.group_gaps, np.zeros((1, GAP_LEVELS + 1), dtype=np.int64)])
        return group

    def fits_empty_by_group(self, never_by_kind: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """Per GPU group, whether a pod fits some node of the group that is in the cluster, were
        that node empty, from ``never_by_kind`` (per node kind of the array it is given: 0 where
        the pod fits a node of the kind, were it empty)."""
        if self._pairs is None:
            pairs = sorted(self._kind_groups)
            self._pairs = (
                np.array([kind for kind, _ in pairs], dtype=np.int64),
                np.array([group for _, group in pairs], dtype=np.int64),
            )
        kind_of, group_of = self._pairs
        never = never_by_kind(kind_of)
        out = np.zeros(len(self.group_ids), dtype=bool)
        out[group_of[never[kind_of] == 0]] = True
        return out
