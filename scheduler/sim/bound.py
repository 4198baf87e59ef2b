"""An upper bound on the GPU any placement could allocate to the same arrivals (LP relaxation).

Built so (``gpuslice bound``):

1. The arrivals are the run's own (same seed, same shuffle and inflation), cut where the
   arrived GPU request passes ``pct`` % of capacity (``round(arrived %) <= pct``). Order
   is ignored: an offline packer that may reorder and knows the future can only do
   better than any online policy, so its optimum bounds every policy from above.
2. Pods are grouped into shapes s (equal demands, n_s of them); nodes into classes c
   (equal inventories, N_c of them). For each (s, c) the core itself decides whether s
   fits on an empty node of c (``fit``), and what one pod takes there: its allocated
   milli-GPU v_sc (``allocated_milli``, the objective's weight), and per GPU its compute,
   memory, MIG slots and client/replica use. Shapes that fit no class are left out.
3. Variables x_sc >= 0: how many pods of shape s go to class c. Maximise sum v_sc x_sc
   subject to
   * sum_c x_sc <= n_s                                            (each pod at most once)
   * per class, summed over its N_c nodes: CPU, memory, pod slots  (per-node constraints)
   * per class, summed over its GPUs of one kind: compute (x MPS oversubscription),
     memory (x time-slicing oversubscription), MPS clients, time-slicing replicas,
     exclusive GPUs, MIG memory slots and compute slices        (per-GPU constraints)
   * packing cuts, valid for every integer placement: a GPU holds at most k shares of
     more than 1/(k+1) of its compute or memory, and none beside a whole-GPU share
     (k = 1..8); a node holds at most k pods of more than 1/(k+1) of its CPU, its memory
     or its GPUs taken whole (k = 1..4).
   Summing a per-node or per-GPU constraint over identical nodes or GPUs loses nothing
   in the relaxation (any fractional solution can be averaged over them), so the sums
   are as tight as the per-device LP; the cuts are what integrality adds back.
4. Solved with HiGHS (``scipy.optimize.linprog(method="highs")``). The bound is
   min(LP optimum, requested GPU), as milli-GPU and as % of capacity.

Arrivals-only replays (the FGD protocol); with departures an offline bound would need
time-indexed capacity, which this does not model.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from scheduler.core.capacity import allocated_milli
from scheduler.core.fit import fit
from scheduler.core.inventory import Node, SharingMode
from scheduler.core.request import MILLI, Demand
from scheduler.core.state import NodeState, device_kind

from .model import TIMED, Trace, request_milli
from .protocol import events as make_events

GPU_CUTS = 8
NODE_CUTS = 4


@dataclass(frozen=True)
class Bound:
    trace: str
    seed: int
    pct: int
    pods: int
    requested_milli: int
    bound_milli: float
    capacity_milli: int

    @property
    def bound_pct(self) -> float:
        return 100.0 * self.bound_milli / max(1, self.capacity_milli)

    @property
    def requested_pct(self) -> float:
        return 100.0 * self.requested_milli / max(1, self.capacity_milli)


def _node_class(node: Node) -> tuple[Any, ...]:
    return (
        node.cpu_milli,
        node.memory_mib,
        node.max_pods,
        node.mps_compute_oversub_pct,
        node.ts_memory_oversub_pct,
        tuple(device_kind(d) for d in node.devices),
        node.nvlink,
    )


def arrivals(
    trace: Trace, seed: int, pct: int | None, inflate: float | None = None, shuffle: bool | None = None
) -> list[Demand]:
    """The run's arriving demands (same seed, same order), cut at ``pct`` % arrived (None: all)."""
    if trace.replay == TIMED:
        raise ValueError("the bound covers arrivals-only replays (the FGD protocol), not timed replays")
    rng = random.Random(seed)
    inflate = trace.inflate if inflate is None else inflate
    shuffle = trace.shuffle if shuffle is None else shuffle
    out = []
    total = 0
    reference = trace.reference_memory_mib()
    for event in make_events(trace, rng, "arrivals", inflate, shuffle):
        total += request_milli(event.pod.demand, reference)
        if pct is not None and round(total / max(1, trace.capacity_milli) * 100) > pct:
            break
        out.append(event.pod.demand)
    return out


class _Rows:
    """Sparse constraint rows A x <= b."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.rhs: list[float] = []

    def add(self, terms: Mapping[int, float], limit: float) -> None:
        terms = {j: v for j, v in terms.items() if v}
        if not terms:
            return
        r = len(self.rhs)
        for j, v in terms.items():
            self.rows.append(r)
            self.cols.append(j)
            self.vals.append(v)
        self.rhs.append(limit)


def lp_bound(nodes: Sequence[Node], demands: Sequence[Demand]) -> float:
    """The LP optimum (milli-GPU) for placing ``demands`` on ``nodes``; see the module doc."""
    shapes = Counter(demands)
    classes: dict[tuple[Any, ...], list[Node]] = {}
    for node in nodes:
        classes.setdefault(_node_class(node), []).append(node)
    class_list = list(classes.values())
    variables: list[tuple[Demand, int, Any]] = []  # (shape, class index, allocation on an empty node)
    for demand in shapes:
        for c, members in enumerate(class_list):
            found = fit(demand, NodeState.empty(members[0]))
            if found:
                variables.append((demand, c, found.allocations[0]))
    if not variables:
        return 0.0
    rows = _Rows()
    objective = np.array([-float(allocated_milli(a)) for _, _, a in variables])
    by_shape: dict[Demand, dict[int, float]] = {}
    for j, (demand, _, _) in enumerate(variables):
        by_shape.setdefault(demand, {})[j] = 1.0
    for demand, terms in by_shape.items():
        rows.add(terms, shapes[demand])
    for c, members in enumerate(class_list):
        _class_rows(rows, c, members, variables)
    a = coo_matrix((rows.vals, (rows.rows, rows.cols)), shape=(len(rows.rhs), len(variables))).tocsr()
    result = linprog(objective, A_ub=a, b_ub=np.array(rows.rhs), bounds=(0, None), method="highs")
    if result.status != 0:
        raise RuntimeError(f"the LP solver failed: {result.message}")
    return float(-result.fun)


def _class_rows(rows: _Rows, c: int, members: list[Node], variables: list[tuple[Demand, int, Any]]) -> None:
    node = members[0]
    n = len(members)
    mine = [(j, d, a) for j, (d, cls, a) in enumerate(variables) if cls == c]
    if not mine:
        return
    # per node, summed over the class
    rows.add({j: d.cpu_milli for j, d, _ in mine}, n * node.cpu_milli)
    rows.add({j: d.memory_mib for j, d, _ in mine}, n * node.memory_mib)
    rows.add({j: 1.0 for j, _, _ in mine}, n * node.max_pods)
    for k in range(1, NODE_CUTS + 1):
        rows.add({j: 1.0 for j, d, _ in mine if d.cpu_milli * (k + 1) > node.cpu_milli}, k * n)
        rows.add({j: 1.0 for j, d, _ in mine if d.memory_mib * (k + 1) > node.memory_mib}, k * n)
        rows.add({j: 1.0 for j, _, a in mine if _whole_gpus(a, node) * (k + 1) > len(node.devices)}, k * n)
    # per GPU, summed over the class's GPUs of one kind
    kinds: dict[tuple[Any, ...], list[int]] = {}
    for device in node.devices:
        kinds.setdefault(device_kind(device), []).append(device.index)
    for indices in kinds.values():
        device = node.devices[indices[0]]
        gpus = n * len(indices)
        members_idx = set(indices)

        def on_kind(alloc: Any, members_idx: set[int] = members_idx) -> list[Any]:
            return [s for s in alloc.shares if s.index in members_idx]

        use = [(j, on_kind(a)) for j, _, a in mine]
        use = [(j, shares) for j, shares in use if shares]
        if not use:
            continue
        mem = device.memory_mib
        if device.mode is SharingMode.MIG:
            layout = device.model.mig
            assert layout is not None
            rows.add({j: sum(s.mig.size for s in sh if s.mig) for j, sh in use}, gpus * layout.memory_slots)
            rows.add({j: sum(s.mig.slices for s in sh if s.mig) for j, sh in use}, gpus * layout.compute_slices)
            if device.mig_static:
                for profile in {i.profile.name for i in device.mig_instances}:
                    have = sum(1 for i in device.mig_instances if i.profile.name == profile)
                    rows.add(
                        {j: sum(1 for s in sh if s.mig and s.mig.profile == profile) for j, sh in use}, gpus * have
                    )
            continue
        whole = {j: sum(1 for s in sh if s.compute_milli >= MILLI and s.memory_mib >= mem) for j, sh in use}
        if device.mode is SharingMode.EXCLUSIVE:
            rows.add({j: len(sh) for j, sh in use}, gpus)
            continue
        compute_cap = MILLI * node.mps_compute_oversub_pct / 100 if device.mode is SharingMode.MPS else None
        memory_cap = mem * (node.ts_memory_oversub_pct / 100 if device.mode is SharingMode.TIME_SLICING else 1)
        if compute_cap is not None:
            rows.add({j: sum(s.compute_milli for s in sh) for j, sh in use}, gpus * compute_cap)
            rows.add({j: len(sh) for j, sh in use}, gpus * device.mps_client_limit)
        else:
            rows.add({j: len(sh) for j, sh in use}, gpus * device.replicas)
        rows.add({j: sum(s.memory_mib for s in sh) for j, sh in use}, gpus * memory_cap)
        for k in range(1, GPU_CUTS + 1):
            for size, cap in ((_compute, compute_cap), (_memory, memory_cap)):
                if cap is None:
                    continue
                limit = cap
                terms = {j: _big_shares(sh, size, limit, k, mem) + k * whole[j] for j, sh in use}
                rows.add(terms, k * gpus)


def _whole_gpus(alloc: Any, node: Node) -> int:
    """How many whole GPUs an allocation takes (shares of a GPU do not count)."""
    return sum(
        1
        for s in alloc.shares
        if s.mig is None and s.compute_milli >= MILLI and s.memory_mib >= node.devices[s.index].memory_mib
    )


def _compute(share: Any) -> float:
    return float(share.compute_milli)


def _memory(share: Any) -> float:
    return float(share.memory_mib)


def _big_shares(shares: list[Any], size: Callable[[Any], float], cap: float, k: int, memory: int) -> int:
    """How many of ``shares`` (whole-GPU shares aside) exceed 1/(k+1) of ``cap``."""
    return sum(
        1 for s in shares if size(s) * (k + 1) > cap and not (s.compute_milli >= MILLI and s.memory_mib >= memory)
    )


def bound(
    trace: Trace, seed: int, pct: int | None = 100, inflate: float | None = None, shuffle: bool | None = None
) -> Bound:
    demands = arrivals(trace, seed, pct, inflate, shuffle)
    reference = trace.reference_memory_mib()
    requested = sum(request_milli(d, reference) for d in demands)
    value = min(float(requested), float(trace.capacity_milli), lp_bound(trace.nodes, demands)) if demands else 0.0
    return Bound(trace.name, seed, pct if pct is not None else -1, len(demands), requested, value, trace.capacity_milli)
