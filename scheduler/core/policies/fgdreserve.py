"""fgd-reserve: fgd-cpu, plus a price on GPU groups that pinned pods will need.

(docstring to be completed: the rule and why it wastes less)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..allocation import Allocation
from ..fragmentation import DEFAULT_WORKLOAD, Fragmentation, OnlineWorkload, TypicalWorkload
from ..groups import GroupView
from ..inventory import Node
from ..memo import intern
from ..request import Demand, GpuKind
from ..state import NodeState, device_kind
from .base import register
from .fgdcpu import DEFAULT_BALANCE_WEIGHT, DEFAULT_STRANDING_WEIGHT, SCORE_SCALE_MILLI, FgdCpu, gpu_per_cpu
from .reserve import free_by_group, pressure, price, squash

_SIGNATURE_MEMO = 200_000


@dataclass(frozen=True, slots=True)
class ReserveOptions:
    """fgd-reserve's knobs (defaults are the recorded policy)."""

    stranding_weight: float = DEFAULT_STRANDING_WEIGHT  # milli-GPU of cost per stranded milli-GPU
    balance_weight: float = DEFAULT_BALANCE_WEIGHT  # score points per unit rise of the gap balance per GPU
    reserve_weight: float = 4.0  # milli-GPU of cost per milli-GPU taken on a group at full price
    reserve_start: float = 0.5  # pressure at which a group's price starts to rise (reaches 1 at 1)
    learn_first: int = 4  # first estimate of the workload after this many pods
    learn_growth: float = 1.5  # then each time the count grows by this factor ...
    learn_settle: int = 256  # ... until this many pods,
    learn_late_growth: float = 4.0  # then by this factor

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int | float) or value < 0:
                raise ValueError(f"fgd-reserve option {field.name}={value!r}: accepted: a number >= 0")
        if not 0 <= self.reserve_start < 1:
            raise ValueError(f"fgd-reserve option reserve_start={self.reserve_start}: accepted: 0 <= x < 1")
        if self.learn_first < 1 or self.learn_growth <= 1 or self.learn_late_growth <= 1:
            raise ValueError("fgd-reserve options: learn_first >= 1, learn_growth > 1 and learn_late_growth > 1")


def node_shape(node: Node) -> Hashable:
    """What a placement's score depends on of a node, apart from its state (not its name)."""
    return (
        node.cpu_milli,
        node.max_pods,
        node.nvlink,
        node.mps_compute_oversub_pct,
        node.ts_memory_oversub_pct,
        tuple(device_kind(d) for d in node.devices),
    )


@register
class FgdReserve(FgdCpu):
    name = "fgd-reserve"
    gap_aware = True
    group_aware = True

    def __init__(self, prior: TypicalWorkload | None = None, learn: bool = True, **options: Any) -> None:
        accepted = {f.name for f in dataclasses.fields(ReserveOptions)}
        unknown = set(options) - accepted
        if unknown:
            raise ValueError(
                f"fgd-reserve: unknown option(s) {', '.join(sorted(unknown))}; accepted: {', '.join(sorted(accepted))}"
            )
        self.options = opts = ReserveOptions(**options)
        self._hosts: dict[tuple[Any, ...], bool] = {}
        self._signatures: dict[Hashable, tuple[float, int]] = {}
        self._shapes: dict[int, Hashable] = {}
        super().__init__(prior, opts.stranding_weight, learn, opts.balance_weight)
        if self.online is not None:
            self.online = OnlineWorkload(
                prior or DEFAULT_WORKLOAD,
                first=opts.learn_first,
                growth=opts.learn_growth,
                settle=opts.learn_settle,
                late_growth=opts.learn_late_growth,
            )
        self._pending: list[Demand] = []
        self._class_rows: dict[bytes, int] = {}  # allowed-group mask -> row of _masks / _volumes
        self._masks = np.zeros((0, 0), dtype=bool)
        self._volumes = np.zeros(0)

    def _adopt(self, workload: TypicalWorkload) -> None:
        self.fragmentation = Fragmentation(workload, self._hosts)
        self.ratio = gpu_per_cpu(workload)
        self._signatures.clear()

    def observe(self, demand: Demand) -> None:
        super().observe(demand)
        if demand.gpu.kind is not GpuKind.NONE:
            self._pending.append(demand)

    # ------------------------------------------------------------ the node's own score

    def _shape(self, node: Node) -> Hashable:
        shape = self._shapes.get(id(node))
        if shape is None:
            shape = self._shapes[id(node)] = (node, node_shape(node))
        return shape[1]  # type: ignore[index]

    def place(self, demand: Demand, state: NodeState, allocations: Sequence[Allocation]) -> tuple[float, Allocation]:
        """fgd-cpu's placement, shared by nodes of one shape in one state (idle nodes above all)."""
        key = (intern(demand.gpu), demand.cpu_milli, self._shape(state.node), state.usage, state.cpu_free)
        hit = self._signatures.get(key)
        if hit is None:
            score, alloc = super().place(demand, state, allocations)
            index = next(i for i, a in enumerate(allocations) if a is alloc)
            if len(self._signatures) > _SIGNATURE_MEMO:
                self._signatures.clear()
            self._signatures[key] = hit = (score, index)
        return hit[0], allocations[hit[1]]

    # ------------------------------------------------------------ the cluster's weight

    def _learn_classes(self, view: GroupView) -> None:
        for d in self._pending:
            allowed = view.allowed_for(d)
            row = self._class_rows.setdefault(allowed.tobytes(), len(self._class_rows))
            if row == len(self._volumes):
                self._masks = np.vstack([self._masks.reshape(-1, allowed.size), allowed[None, :]])
                self._volumes = np.append(self._volumes, 0.0)
            milli = view.milli_for(d.gpu)
            self._volumes[row] += float(milli[allowed].mean() if allowed.any() else milli.mean())
        self._pending.clear()

    def adjust_groups(
        self, demand: Demand, scores: np.ndarray, moves: np.ndarray, gaps: np.ndarray, view: GroupView
    ) -> np.ndarray:
        out = self.adjust(demand, scores, moves, gaps)
        self._learn_classes(view)
        opts = self.options
        if demand.gpu.kind is GpuKind.NONE or not opts.reserve_weight or not self._volumes.size:
            return out
        rho = pressure(self._masks, self._volumes, free_by_group(view.gaps))
        cost = price(rho, opts.reserve_start) * view.milli_for(demand.gpu)
        if not cost.any():
            return out
        per_node = np.where(view.node_group >= 0, cost[np.maximum(view.node_group, 0)], 0.0)
        points = opts.reserve_weight * per_node * 50.0 / SCORE_SCALE_MILLI
        return np.where(scores > -np.inf, squash(out - points), -np.inf)
