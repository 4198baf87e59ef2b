"""Compare nodes for one pod: the entry point the extender and the simulator share.

Per node: ``fit`` (memoised on the node state) then the policy's placement (memoised on
the state too when the policy is cacheable). A node state is immutable and replaced on
every change, so a cached result can never be stale. Equal scores fall to ``order``
(the simulator's seeded node rank), then to the nodes' given order.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from .allocation import Allocation
from .capacity import GAP_LEVELS, free_after, free_milli, gap_level, gap_levels
from .fit import Fit, device_share, fit, gpu_fit, host_reason
from .groups import GroupLedger
from .memo import intern as _intern
from .policies.base import Policy
from .request import Demand, GpuKind, GpuRequest
from .state import NodeState, device_key


@dataclass(frozen=True, slots=True)
class Placement:
    node: str
    score: float
    allocation: Allocation


def fit_cached(demand: Demand, state: NodeState) -> Fit:
    key = _intern(("fit", demand))
    result: Fit | None = state.memo.get(key)
    if result is None:
        result = state.memo[key] = fit(demand, state)
    return result


def gpu_fit_cached(demand: Demand, state: NodeState) -> Fit:
    """:func:`gpu_fit`, memoised on the state: a policy that re-scores unchanged nodes (a new
    estimate of its workload) does not rebuild their allocations."""
    key = _intern(("gpu-fit", demand))
    result: Fit | None = state.memo.get(key)
    if result is None:
        result = state.memo[key] = gpu_fit(demand, state)
    return result


def placement_key(policy: Policy, demand: Demand) -> int | None:
    """The per-state memo key of ``policy``'s placements for ``demand`` (None: not cacheable)."""
    return _intern((policy, policy.version, policy.place_key(demand))) if policy.cacheable else None


def _place(policy: Policy, demand: Demand, state: NodeState, key: int | None) -> Placement | str:
    """The policy's placement of ``demand``'s GPU request on one node (host resources not
    checked), memoised under ``key``; its allocation may carry another demand's CPU and
    memory when they share the key."""
    if key is not None:
        hit: Placement | str | None = state.memo.get(key)
        if hit is not None:
            return hit
    found = gpu_fit_cached(demand, state)
    if not found:
        result: Placement | str = found.reason
    else:
        score, alloc = policy.place(demand, state, found.allocations)
        result = Placement(state.node.name, score, alloc)
    if key is not None:
        state.memo[key] = result
    return result


def _for(demand: Demand, result: Placement) -> Placement:
    alloc = result.allocation
    if (alloc.cpu_milli, alloc.memory_mib) == (demand.cpu_milli, demand.memory_mib):
        return result
    return Placement(
        result.node, result.score, replace(alloc, cpu_milli=demand.cpu_milli, memory_mib=demand.memory_mib)
    )


def evaluate(policy: Policy, demand: Demand, state: NodeState, key: int | None = None) -> Placement | str:
    """The policy's placement of ``demand`` on one node, or why it does not fit."""
    reason = host_reason(demand, state)
    if reason is not None:
        return reason
    result = _place(policy, demand, state, key if key is not None else placement_key(policy, demand))
    return result if isinstance(result, str) else _for(demand, result)


@dataclass(frozen=True, slots=True)
class Ranking:
    placements: list[Placement]  # best first
    failures: dict[str, str]  # node -> reason


def rank(
    policy: Policy,
    demand: Demand,
    states: Sequence[NodeState],
    order: Mapping[str, int] | None = None,
    gaps: np.ndarray | None = None,
    ledger: GroupLedger | None = None,
) -> Ranking:
    """Every node's placement, best first, and the reasons of the nodes that do not fit.

    A gap-aware policy's scores pass through its ``adjust`` with ``gaps``, the cluster's gap
    histogram (by default that of ``states``, taken as the whole cluster), as in
    :class:`Scoreboard`; a group-aware one's through ``adjust_groups`` with ``ledger``'s view
    (by default a ledger of ``states``).
    """
    key = placement_key(policy, demand)
    placements: list[Placement] = []
    moves: list[tuple[int, int]] = []
    failures: dict[str, str] = {}
    for state in states:
        result = evaluate(policy, demand, state, key)
        if isinstance(result, str):
            failures[state.node.name] = result
        else:
            placements.append(result)
            if policy.gap_aware:
                moves.append(gap_move(demand, state, result))
    raw = [p.score for p in placements]
    if moves:
        histogram = gap_histogram(states) if gaps is None else gaps
        scored, move_array = np.array(raw), np.array(moves, dtype=np.int64).T
        if policy.group_aware:
            ledger = ledger or GroupLedger(states)
            placed = [s for s in states if s.node.name not in failures]
            view = ledger.view(demand, ledger.groups_of(placed))
            raw = policy.adjust_groups(demand, scored, move_array, histogram, view).tolist()
        else:
            raw = policy.adjust(demand, scored, move_array, histogram).tolist()
    scores = policy.normalize(raw)
    if scores is not None and any(s != p.score for s, p in zip(scores, placements, strict=True)):
        placements = [Placement(p.node, s, p.allocation) for s, p in zip(scores, placements, strict=True)]
    position = {p.node: i for i, p in enumerate(placements)} if order is None else order
    placements.sort(key=lambda p: (-p.score, position.get(p.node, 0)))
    return Ranking(placements, failures)


def best(
    policy: Policy, demand: Demand, states: Sequence[NodeState], order: Mapping[str, int] | None = None
) -> Placement | None:
    """The winning placement (highest score, then lowest ``order``), or None if nothing fits."""
    ranking = rank(policy, demand, states, order)
    return ranking.placements[0] if ranking.placements else None


def gap_histogram(states: Iterable[NodeState]) -> np.ndarray:
    """How many GPUs of ``states`` have each free share, in hundredths (index 0..GAP_LEVELS)."""
    levels = [level for s in states for level in gap_levels(s)]
    return np.bincount(np.array(levels, dtype=np.int64), minlength=GAP_LEVELS + 1)


def gap_move(demand: Demand, state: NodeState, result: Placement | str) -> tuple[int, int]:
    """The (before, after) gap level of the GPU a placement shares; (-1, -1) unless it is
    one share of one GPU."""
    if isinstance(result, str) or demand.gpu.kind is not GpuKind.SHARE or len(result.allocation.shares) != 1:
        return -1, -1
    share = result.allocation.shares[0]
    before = free_milli(state.node.devices[share.index], state.usage[share.index])
    return gap_level(before), gap_level(free_after(state, result.allocation))


class _Table:
    """Every node's score for one (policy, demand), valid up to ``seen`` in the change log;
    for gap-aware policies also each placement's gap move (see :func:`gap_move`)."""

    __slots__ = ("moves", "scores", "seen")

    def __init__(self, scores: np.ndarray, seen: int, moves: np.ndarray | None = None) -> None:
        self.scores = scores
        self.seen = seen
        self.moves = moves


class Scoreboard:
    """A cluster's node states, with each node's score per (policy, demand) kept up to date.

    Scoring a pod against N nodes costs N memo look-ups the first time; afterwards only
    the nodes that changed since the last pod of the same demand are scored again, and
    the winner is found by a vectorised argmax (ties: lowest ``order``, then position).
    Nodes the pod cannot fit are skipped without calling ``fit``: feasibility is exactly
    ``fit``'s own test (pod room, CPU, memory, and enough GPUs that can host one share),
    kept as arrays of free CPU, memory and pod room plus, per GPU request, the count of
    GPUs that can host it (refreshed like the score tables).
    Not thread-safe: callers serialise access (the extender holds a lock).
    """

    _MAX_TABLES = 512
    _MAX_DEVICE_MEMO = 200_000

    def __init__(self, states: Iterable[NodeState] = (), order: Mapping[str, int] | None = None) -> None:
        self._states: list[NodeState] = []
        self._index: dict[str, int] = {}
        self._order = dict(order or {})
        self._rank = np.zeros(0)
        self._log: list[int] = []  # positions changed by put, in order
        self._dropped = 0  # log entries dropped so far (see ``mark``)
        self._tables: OrderedDict[int, _Table] = OrderedDict()
        self._hosts: OrderedDict[int, _Table] = OrderedDict()
        self._device_hosts: dict[tuple[int, tuple[object, ...]], bool] = {}
        self._cpu_free = np.zeros(0, dtype=np.int64)
        self._memory_free = np.zeros(0, dtype=np.int64)
        self._room = np.zeros(0, dtype=np.int64)
        self._gaps = np.zeros(GAP_LEVELS + 1, dtype=np.int64)
        self._ledger = GroupLedger(())
        for state in states:
            self._index[state.node.name] = len(self._states)
            self._states.append(state)
        self._reset()

    def _reset(self) -> None:
        n = len(self._states)
        self._rank = np.array(
            [self._order.get(s.node.name, n + i) for i, s in enumerate(self._states)], dtype=np.float64
        )
        self._tables.clear()
        self._hosts.clear()
        self._dropped += len(self._log) + 1  # positions move: every earlier mark is void
        self._log.clear()
        self._cpu_free = np.array([s.cpu_free for s in self._states], dtype=np.int64)
        self._memory_free = np.array([s.memory_free for s in self._states], dtype=np.int64)
        self._room = np.array([s.node.max_pods - len(s.pods) for s in self._states], dtype=np.int64)
        self._gaps = gap_histogram(self._states)
        self._ledger = GroupLedger(self._states)

    # ------------------------------------------------------------ state

    @property
    def states(self) -> Sequence[NodeState]:
        return self._states

    @property
    def gaps(self) -> np.ndarray:
        """How many GPUs of the cluster have each free share, in hundredths (index 0..100)."""
        return self._gaps

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def get(self, name: str) -> NodeState | None:
        i = self._index.get(name)
        return None if i is None else self._states[i]

    def put(self, state: NodeState) -> None:
        """Add a node or replace its state."""
        i = self._index.get(state.node.name)
        if i is None:
            self._index[state.node.name] = len(self._states)
            self._states.append(state)
            self._reset()
            return
        old = self._states[i]
        if old is state:
            return
        for level in gap_levels(old):
            self._gaps[level] -= 1
        for level in gap_levels(state):
            self._gaps[level] += 1
        self._ledger.replace(old, state)
        self._states[i] = state
        self._cpu_free[i] = state.cpu_free
        self._memory_free[i] = state.memory_free
        self._room[i] = state.node.max_pods - len(state.pods)
        self._log.append(i)
        if len(self._log) > 8 * len(self._states) + 1024:
            self._tables.clear()
            self._hosts.clear()
            self._dropped += len(self._log)
            self._log.clear()

    @property
    def mark(self) -> int:
        """A point in the board's history, for :meth:`changed_since`."""
        return self._dropped + len(self._log)

    def changed_since(self, mark: int) -> set[int] | None:
        """The positions of the nodes put since ``mark``; None when that is no longer known
        (the log was trimmed, or a node joined or left and positions moved)."""
        start = mark - self._dropped
        return None if start < 0 else set(self._log[start:])

    def remove(self, name: str) -> None:
        i = self._index.pop(name, None)
        if i is None:
            return
        del self._states[i]
        self._index = {s.node.name: j for j, s in enumerate(self._states)}
        self._reset()

    # ------------------------------------------------------------ scoring

    def _host_count(self, gpu: GpuRequest, gpu_key: int, state: NodeState) -> int:
        """How many of the node's GPUs can host one share of ``gpu``: ``len(gpu_options(...)[0])``,
        answered per device from a memo keyed by what ``device_share`` reads (device kind,
        its usage, the node's oversubscription), so an unchanged GPU is never asked twice."""
        hit = state.memo.get(gpu_key)
        if hit is not None:
            return int(hit)
        node = state.node
        memo = self._device_hosts
        count = 0
        for device, usage in zip(node.devices, state.usage, strict=True):
            key = (gpu_key, device_key(node, device, usage))
            hosts = memo.get(key)
            if hosts is None:
                hosts = (
                    gpu.allows_model(device.model.name)
                    and gpu.allows_mode(device.mode)
                    and not isinstance(device_share(gpu, node, device, usage), str)
                )
                if len(memo) > self._MAX_DEVICE_MEMO:
                    memo.clear()
                memo[key] = hosts
            count += hosts
        state.memo[gpu_key] = count
        return count

    def _host_counts(self, gpu: GpuRequest) -> np.ndarray:
        """Per node, how many GPUs can host one share of ``gpu`` (``fit``'s candidates)."""
        key = _intern(("hosts", gpu))
        table = self._hosts.get(key)
        if table is None:
            counts = np.array([self._host_count(gpu, key, s) for s in self._states], dtype=np.float64)
            table = self._hosts[key] = _Table(counts, len(self._log))
            if len(self._hosts) > self._MAX_TABLES:
                self._hosts.popitem(last=False)
            return counts
        self._hosts.move_to_end(key)
        if table.seen < len(self._log):
            for i in set(self._log[table.seen :]):
                table.scores[i] = self._host_count(gpu, key, self._states[i])
            table.seen = len(self._log)
        return table.scores

    def _fits(self, demand: Demand) -> np.ndarray:
        """Per node, whether ``fit(demand, state)`` finds an allocation (the same test, vectorised)."""
        mask = (self._room > 0) & (self._cpu_free >= demand.cpu_milli) & (self._memory_free >= demand.memory_mib)
        gpu = demand.gpu
        if gpu.kind is not GpuKind.NONE:
            mask &= self._host_counts(gpu) >= max(1, gpu.count)
        return mask

    def _gpu_fits(self, gpu: GpuRequest) -> np.ndarray:
        if gpu.kind is GpuKind.NONE:
            return np.ones(len(self._states), dtype=bool)
        return self._host_counts(gpu) >= max(1, gpu.count)

    def _table(self, policy: Policy, demand: Demand) -> np.ndarray:
        """Scores of every node (``-inf`` where the pod does not fit), refreshed incrementally.

        The cached table holds, per (policy, place key), the scores of every node the GPU
        request fits, whatever the pod's CPU and memory; those are applied on each call.
        A gap-aware policy's scores then pass through its ``adjust`` with the cluster's
        gap histogram, which changes with every pod and so is never cached.
        """
        states = self._states
        fits = self._fits(demand)
        aware = policy.gap_aware
        if not policy.cacheable:
            scores = np.full(len(states), -np.inf)
            moves = np.full((2, len(states)), -1, dtype=np.int64) if aware else None
            for j in np.flatnonzero(fits).tolist():
                result = evaluate(policy, demand, states[j])
                scores[j] = _score(result)
                if moves is not None:
                    moves[:, j] = gap_move(demand, states[j], result)
            return self._adjust(policy, demand, scores, moves) if moves is not None else scores
        key = placement_key(policy, demand)
        assert key is not None
        table = self._tables.get(key)
        if table is None:
            gpu_fits = self._gpu_fits(demand.gpu)
            table = _Table(
                np.full(len(states), -np.inf),
                len(self._log),
                np.full((2, len(states)), -1, dtype=np.int64) if aware else None,
            )
            for j in np.flatnonzero(gpu_fits).tolist():
                self._refresh(table, policy, demand, j, key)
            self._tables[key] = table
            if len(self._tables) > self._MAX_TABLES:
                self._tables.popitem(last=False)
        else:
            self._tables.move_to_end(key)
            if table.seen < len(self._log):
                gpu_fits = self._gpu_fits(demand.gpu)
                for i in set(self._log[table.seen :]):
                    if gpu_fits[i]:
                        self._refresh(table, policy, demand, i, key)
                    else:
                        table.scores[i] = -np.inf
                table.seen = len(self._log)
        scores = np.where(fits, table.scores, -np.inf)
        if table.moves is not None:
            return self._adjust(policy, demand, scores, table.moves)
        return scores

    def _adjust(self, policy: Policy, demand: Demand, scores: np.ndarray, moves: np.ndarray) -> np.ndarray:
        if policy.group_aware:
            return policy.adjust_groups(demand, scores, moves, self._gaps, self._ledger.view(demand))
        return policy.adjust(demand, scores, moves, self._gaps)

    def _refresh(self, table: _Table, policy: Policy, demand: Demand, i: int, key: int) -> None:
        result = _place(policy, demand, self._states[i], key)
        table.scores[i] = _score(result)
        if table.moves is not None:
            table.moves[:, i] = gap_move(demand, self._states[i], result)

    def scores(self, policy: Policy, demand: Demand) -> np.ndarray:
        """Every node's raw score in :attr:`states` order, ``-inf`` where the pod does not fit.

        A fresh array on every call.
        """
        if not self._states:
            return np.zeros(0)
        return self._table(policy, demand)

    def positions(self, names: Sequence[str]) -> np.ndarray:
        """Each name's index in :attr:`states` (``-1`` if unknown); stable until a node is added or removed."""
        index = self._index
        return np.fromiter((index.get(n, -1) for n in names), dtype=np.int64, count=len(names))

    def feasible(self, demand: Demand) -> np.ndarray:
        """Indices (in :attr:`states` order) of the nodes ``demand`` fits on."""
        if not self._states:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(self._fits(demand))

    def best(self, policy: Policy, demand: Demand) -> Placement | None:
        """The winning placement over all nodes, or None if the pod fits nowhere."""
        if not self._states:
            return None
        if policy.uniform_choice:
            candidates = self.feasible(demand)
            if candidates.size == 0:
                return None
            drawn = evaluate(policy, demand, self._states[int(candidates[policy.draw(int(candidates.size))])])
            assert not isinstance(drawn, str)
            return drawn
        scores = self._table(policy, demand)
        feasible = np.flatnonzero(scores > -np.inf)
        if feasible.size == 0:
            return None
        values = scores[feasible]
        if type(policy).normalize is not Policy.normalize:
            values = np.array(policy.normalize(values.tolist()), dtype=np.float64)
        top = feasible[values == values.max()]
        i = int(top[np.argmin(self._rank[top])]) if top.size > 1 else int(top[0])
        result = evaluate(policy, demand, self._states[i])
        assert not isinstance(result, str)
        if result.score != values.max():
            result = Placement(result.node, float(values.max()), result.allocation)
        return result

    def rank(self, policy: Policy, demand: Demand, names: Iterable[str] | None = None) -> Ranking:
        """Placements on ``names`` (all nodes if None), best first, and the others' reasons.

        Names that are not in the cluster are reported as failures.
        """
        if names is None:
            return rank(policy, demand, self._states, self._order or None, self._gaps, self._ledger)
        states: list[NodeState] = []
        unknown: dict[str, str] = {}
        for name in names:
            i = self._index.get(name)
            if i is None:
                unknown[name] = "node unknown to gpuslice"
            else:
                states.append(self._states[i])
        ranking = rank(policy, demand, states, self._order or None, self._gaps, self._ledger)
        ranking.failures.update(unknown)
        return ranking


def _score(result: Placement | str) -> float:
    return -np.inf if isinstance(result, str) else result.score
