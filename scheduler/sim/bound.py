"""An upper bound on the GPU any placement could allocate to the same arrivals (LP relaxation).

Built so (``gpuslice bound``):

1. The arrivals are the run's own (same seed, same shuffle and inflation), cut where the
   arrived GPU request passes ``pct`` % of capacity (``round(arrived %) <= pct``). Order
   is ignored: an offline packer that may reorder and knows the future can only do
   better than any online policy, so its optimum bounds every policy from above.
2. Pods are grouped into shapes s (equal demands, n_s of them); nodes into classes c
   (equal inventories, N_c of them); a class's GPUs into kinds k (``device_kind``, G_ck
   GPUs of kind k in class c). For each (s, c) the core itself decides where s fits on an
   empty node of c (``fit``; one candidate per GPU kind it may use) and what one pod takes
   there: its allocated milli-GPU v (``allocated_milli``, the objective's weight), and on
   each GPU kind its shares.
3. Variables x_j >= 0: how many pods of shape s go to class c on candidate j. Maximise
   sum v_j x_j subject to
   * sum_j x_j <= n_s over the candidates of s                    (each pod at most once)
   * per class, summed over its N_c nodes: CPU, memory, pod slots  (per-node constraints)
     and the cuts "a node holds at most k pods of more than 1/(k+1) of its CPU, its memory
     or its GPUs taken whole" (k = 1..4)
   * per shared GPU kind (MPS, time-slicing): a configuration (pattern) model. A pattern
     is a multiset of the share sizes placed on that kind that fits together on one empty
     GPU: each share is added in turn with the core's own ``refusal``/``add_share``, so the
     compute cap (x MPS oversubscription), the memory cap (x time-slicing
     oversubscription), the MPS client limit and the time-slicing replicas are the core's.
     Variables y_p >= 0: how many GPUs of (c, k) are filled after pattern p; per share
     size t, the shares of size t placed on (c, k) <= sum_p y_p count_p(t); and
     sum_p y_p + shares taken whole (alone on their GPU) <= G_ck.
   * per exclusive GPU kind: whole GPUs <= G_ck; per MIG kind: memory slots, compute
     slices and pre-created instances of each profile, summed over the kind's GPUs.
4. Solved with HiGHS (``scipy.optimize.linprog(method="highs")``). The bound is
   min(LP optimum, requested GPU), as milli-GPU and as % of capacity.

Why it is valid for every integer placement: take any placement and read x off it. On
each shared GPU the shares it holds passed ``refusal`` one after another, and the core's
rules for these modes compare running totals (memory, compute, share count) with fixed
caps, so whether a multiset fits does not depend on order and every sub-multiset of one
that fits fits too. Extend each GPU's multiset, size by size, until no size of the kind
can be added: it becomes a *maximal* pattern. Counting GPUs per maximal pattern gives y;
a GPU holds at most as many shares of each size as its pattern, so the linking rows
hold with ``<=`` (a pod may always be left out), and each GPU is a pattern, a whole share
or empty, so the GPU-count row holds. Hence only maximal patterns are enumerated: a
dominated pattern (a sub-multiset of another) is never needed, and "maximal" is exactly
"not dominated" because the sets that fit are closed under taking sub-multisets.
Summing a per-node or per-GPU constraint over identical nodes or GPUs loses nothing in
the relaxation (any fractional solution can be averaged over them); what the patterns add
is the integrality of packing on one GPU (three pods of 0.6 on two GPUs: the sum says
1.8, the patterns 1.2). What the relaxation still drops: which node a GPU belongs to
(GPU and host resources are only tied per class) and integrality across GPUs.

The enumeration is capped at ``PATTERN_CAP`` maximal patterns (and a proportional amount
of search) per kind; where the cap is hit, that kind falls back to the summed rows
(compute, memory, clients or replicas) and the packing cuts "a GPU holds at most k shares
of more than 1/(k+1) of its compute or memory, none beside a whole-GPU share" (k = 1..8),
and the result says so in ``notes``.

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

from scheduler.core.allocation import Allocation, DeviceShare
from scheduler.core.capacity import EMPTY, DeviceUsage, add_share, allocated_milli, device_kind, is_whole, refusal
from scheduler.core.fit import fit
from scheduler.core.inventory import Device, Node, SharingMode
from scheduler.core.request import MILLI, Demand
from scheduler.core.state import NodeState

from .errors import SolverError
from .model import TIMED, Trace, request_milli
from .protocol import events as make_events

GPU_CUTS = 8
NODE_CUTS = 4
PATTERN_CAP = 20_000
SEARCH_PER_PATTERN = 20  # search steps allowed per pattern of the cap


@dataclass(frozen=True)
class Bound:
    trace: str
    seed: int
    pct: int
    pods: int
    requested_milli: int
    bound_milli: float
    capacity_milli: int
    notes: tuple[str, ...] = ()

    @property
    def bound_pct(self) -> float:
        return 100.0 * self.bound_milli / max(1, self.capacity_milli)

    @property
    def requested_pct(self) -> float:
        return 100.0 * self.requested_milli / max(1, self.capacity_milli)


@dataclass(frozen=True)
class Relaxation:
    """The LP optimum (milli-GPU), how many patterns it used, and where it fell back to cuts."""

    value: float
    patterns: int = 0
    notes: tuple[str, ...] = ()


def _node_class(node: Node) -> int:
    return node.kind


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
    """Sparse constraint rows A x <= b over columns allocated with ``column``."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.rhs: list[float] = []
        self.objective: list[float] = []

    def column(self, objective: float = 0.0) -> int:
        self.objective.append(objective)
        return len(self.objective) - 1

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


def _candidates(demand: Demand, node: Node) -> list[Allocation]:
    """``demand``'s allocations on an empty ``node``, one per distinct footprint (GPU kinds and
    share sizes): GPUs of one kind are interchangeable here, GPUs of different kinds are not."""
    found = fit(demand, NodeState.empty(node))
    seen: dict[tuple[Any, ...], Allocation] = {}
    for alloc in found.allocations:
        footprint = tuple(
            sorted(
                (
                    repr(device_kind(node.devices[s.index])),
                    s.memory_mib,
                    s.compute_milli,
                    s.mig.profile if s.mig else "",
                )
                for s in alloc.shares
            )
        )
        seen.setdefault(footprint, alloc)
    return list(seen.values())


def lp_bound(nodes: Sequence[Node], demands: Sequence[Demand]) -> float:
    """The LP optimum (milli-GPU) for placing ``demands`` on ``nodes``; see the module doc."""
    return relax(nodes, demands).value


def relax(nodes: Sequence[Node], demands: Sequence[Demand], pattern_cap: int = PATTERN_CAP) -> Relaxation:
    """The LP relaxation of the module doc, with its pattern count and fallback notes."""
    shapes = Counter(demands)
    classes: dict[int, list[Node]] = {}
    for node in nodes:
        classes.setdefault(_node_class(node), []).append(node)
    rows = _Rows()
    by_class: dict[int, list[tuple[int, Demand, Allocation]]] = {}
    class_list = list(classes.values())
    for demand, n in shapes.items():
        terms: dict[int, float] = {}
        for c, members in enumerate(class_list):
            for alloc in _candidates(demand, members[0]):
                j = rows.column(-float(allocated_milli(alloc)))
                terms[j] = 1.0
                by_class.setdefault(c, []).append((j, demand, alloc))
        rows.add(terms, n)
    if not rows.objective:
        return Relaxation(0.0)
    enumerated: dict[tuple[Any, ...], list[tuple[int, ...]] | None] = {}
    patterns = 0
    notes: list[str] = []
    for c, mine in by_class.items():
        members = class_list[c]
        used, fell_back = _class_rows(rows, members, mine, enumerated, pattern_cap)
        patterns += used
        notes.extend(fell_back)
    n_cols = len(rows.objective)
    a = coo_matrix((rows.vals, (rows.rows, rows.cols)), shape=(len(rows.rhs), n_cols)).tocsr()
    result = linprog(np.array(rows.objective), A_ub=a, b_ub=np.array(rows.rhs), bounds=(0, None), method="highs")
    if result.status != 0:
        raise SolverError(f"the LP solver failed: {result.message}")
    return Relaxation(float(-result.fun), patterns, tuple(notes))


def _class_rows(
    rows: _Rows,
    members: list[Node],
    mine: list[tuple[int, Demand, Allocation]],
    enumerated: dict[tuple[Any, ...], list[tuple[int, ...]] | None],
    pattern_cap: int,
) -> tuple[int, list[str]]:
    """The rows of one node class; returns the patterns it added and its fallback notes."""
    node = members[0]
    n = len(members)
    # per node, summed over the class
    rows.add({j: d.cpu_milli for j, d, _ in mine}, n * node.cpu_milli)
    rows.add({j: d.memory_mib for j, d, _ in mine}, n * node.memory_mib)
    rows.add({j: 1.0 for j, _, _ in mine}, n * node.max_pods)
    for k in range(1, NODE_CUTS + 1):
        rows.add({j: 1.0 for j, d, _ in mine if d.cpu_milli * (k + 1) > node.cpu_milli}, k * n)
        rows.add({j: 1.0 for j, d, _ in mine if d.memory_mib * (k + 1) > node.memory_mib}, k * n)
        rows.add({j: 1.0 for j, _, a in mine if _whole_gpus(a, node) * (k + 1) > len(node.devices)}, k * n)
    # per GPU kind, summed over the class's GPUs of that kind
    kinds: dict[int, list[int]] = {}
    for device in node.devices:
        kinds.setdefault(device_kind(device), []).append(device.index)
    added = 0
    notes: list[str] = []
    for kind, indices in kinds.items():
        device = node.devices[indices[0]]
        gpus = n * len(indices)
        on_kind = set(indices)
        use = [(j, [s for s in a.shares if s.index in on_kind]) for j, _, a in mine]
        use = [(j, sh) for j, sh in use if sh]
        if not use:
            continue
        if device.mode is SharingMode.MIG:
            _mig_rows(rows, device, gpus, use)
            continue
        whole = {j: sum(1 for s in sh if is_whole(node.devices[s.index], s)) for j, sh in use}
        if device.mode is SharingMode.EXCLUSIVE:
            rows.add({j: len(sh) for j, sh in use}, gpus)
            continue
        sizes = sorted(
            {(s.compute_milli, s.memory_mib) for _, sh in use for s in sh if not is_whole(device, s)}, reverse=True
        )
        key = (kind, node.mps_compute_oversub_pct, node.ts_memory_oversub_pct, tuple(sizes))
        if key not in enumerated:
            enumerated[key] = share_patterns(node, device, sizes, pattern_cap)
        found = enumerated[key]
        if found is None:
            notes.append(
                f"{n} node(s) like {node.name}, {len(indices)} x {device.model.name} ({device.mode}): more than "
                f"{pattern_cap} share patterns (or too long a search) for {len(sizes)} share sizes; "
                "summed rows and packing cuts instead"
            )
            _cut_rows(rows, node, device, gpus, use, whole)
            continue
        ys = [rows.column() for _ in found]
        added += len(ys)
        for t, size in enumerate(sizes):
            terms = {j: float(sum(1 for s in sh if (s.compute_milli, s.memory_mib) == size)) for j, sh in use}
            terms.update({y: -float(p[t]) for y, p in zip(ys, found, strict=True) if p[t]})
            rows.add(terms, 0.0)
        rows.add({**{j: float(w) for j, w in whole.items()}, **{y: 1.0 for y in ys}}, gpus)
    return added, notes


def share_patterns(
    node: Node, device: Device, sizes: Sequence[tuple[int, int]], cap: int = PATTERN_CAP
) -> list[tuple[int, ...]] | None:
    """The maximal multisets of shares (``sizes``: (compute milli, memory MiB)) that fit on one
    empty ``device`` of ``node``, as counts per size; None if more than ``cap`` of them, or if
    the search takes more than ``SEARCH_PER_PATTERN * cap`` steps.

    Each share is added with the core's ``refusal``/``add_share``; a multiset is maximal when no
    size can be added. The last size is always taken as often as it fits (fewer would leave
    room for one more, so the multiset would not be maximal)."""
    shares = [DeviceShare(device.uuid, device.index, device.mode, memory, compute) for compute, memory in sizes]
    out: list[tuple[int, ...]] = []
    fits: dict[tuple[DeviceUsage, int], DeviceUsage | None] = {}
    budget = [SEARCH_PER_PATTERN * cap]

    def after(usage: DeviceUsage, t: int) -> DeviceUsage | None:
        key = (usage, t)
        if key not in fits:
            budget[0] -= 1
            fits[key] = None if refusal(node, device, usage, shares[t]) else add_share(device, usage, shares[t])
        return fits[key]

    last = len(shares) - 1

    def walk(t: int, usage: DeviceUsage, counts: list[int]) -> bool:
        if budget[0] < 0 or len(out) > cap:
            return False
        chain = [usage]
        while (more := after(chain[-1], t)) is not None:
            chain.append(more)
        if t == last:
            if all(after(chain[-1], u) is None for u in range(last)):
                out.append((*counts, len(chain) - 1))
            return True
        return all(walk(t + 1, chain[count], [*counts, count]) for count in range(len(chain) - 1, -1, -1))

    if not shares:
        return []
    complete = walk(0, EMPTY, [])
    return out if complete and len(out) <= cap else None


def _mig_rows(rows: _Rows, device: Device, gpus: int, use: list[tuple[int, list[DeviceShare]]]) -> None:
    layout = device.model.mig
    assert layout is not None
    rows.add({j: sum(s.mig.size for s in sh if s.mig) for j, sh in use}, gpus * layout.memory_slots)
    rows.add({j: sum(s.mig.slices for s in sh if s.mig) for j, sh in use}, gpus * layout.compute_slices)
    if device.mig_static:
        for profile in {i.profile.name for i in device.mig_instances}:
            have = sum(1 for i in device.mig_instances if i.profile.name == profile)
            rows.add({j: sum(1 for s in sh if s.mig and s.mig.profile == profile) for j, sh in use}, gpus * have)


def _cut_rows(
    rows: _Rows,
    node: Node,
    device: Device,
    gpus: int,
    use: list[tuple[int, list[DeviceShare]]],
    whole: Mapping[int, int],
) -> None:
    """The fallback for a shared kind with too many patterns: summed caps and packing cuts."""
    mem = device.memory_mib
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
            terms = {j: _big_shares(device, sh, size, cap, k) + k * whole[j] for j, sh in use}
            rows.add(terms, k * gpus)


def _whole_gpus(alloc: Allocation, node: Node) -> int:
    """How many whole GPUs an allocation takes (shares of a GPU do not count)."""
    return sum(1 for s in alloc.shares if is_whole(node.devices[s.index], s))


def _compute(share: DeviceShare) -> float:
    return float(share.compute_milli)


def _memory(share: DeviceShare) -> float:
    return float(share.memory_mib)


def _big_shares(
    device: Device, shares: list[DeviceShare], size: Callable[[DeviceShare], float], cap: float, k: int
) -> int:
    """How many of ``shares`` (whole-GPU shares aside) exceed 1/(k+1) of ``cap``."""
    return sum(1 for s in shares if size(s) * (k + 1) > cap and not is_whole(device, s))


def bound(
    trace: Trace, seed: int, pct: int | None = 100, inflate: float | None = None, shuffle: bool | None = None
) -> Bound:
    demands = arrivals(trace, seed, pct, inflate, shuffle)
    reference = trace.reference_memory_mib()
    requested = sum(request_milli(d, reference) for d in demands)
    relaxation = relax(trace.nodes, demands) if demands else Relaxation(0.0)
    value = min(float(requested), float(trace.capacity_milli), relaxation.value) if demands else 0.0
    return Bound(
        trace.name,
        seed,
        pct if pct is not None else -1,
        len(demands),
        requested,
        value,
        trace.capacity_milli,
        relaxation.notes,
    )
