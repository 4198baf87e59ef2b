"""Which pods to evict from one node so that a pod fits there: the fewest, then the least
important, then the least GPU.

kube-scheduler proposes victims per node by its own filters (CPU, memory, the node's
``gpuslice.io/gpu-units``) and priority; it knows nothing of GPU shares, so it may name pods on
the wrong GPU, or more pods than needed. The extender gives :func:`choose_victims` every pod on
the node it may evict (lower priority than the preemptor, not being deleted), not only the
proposal; it picks, among the candidates it is given, the set whose release makes the core's
:func:`~scheduler.core.fit.fit` succeed (a share on one GPU for a fraction, a legal MIG start
for a profile, enough whole GPUs, joined by NVLink where the pod requires it), ordered by:

1. fewest pods;
2. lowest priority: the highest priority among them, then the sum of their priorities
   (kube-scheduler's own order between candidate nodes);
3. least GPU evicted (the allocated milli-GPU of their allocations);
4. their keys, so that the answer never depends on the order candidates are given in.

The search. ``fit`` is monotone in what is released (releasing more never takes a share
away), so the first size at which some set works is the fewest pods, and no strict subset of
the answer frees a share. Sets are enumerated by size, and only relevant candidates are: a
candidate matters only if it holds a share on a GPU that could host the pod once every
candidate there is gone, unless the node's CPU, memory or pod room is short, when any
candidate may be needed for those (the size then starts where the largest candidates could
cover the shortfall). For a pod on one GPU with room on the host, only sets within one GPU's
candidates are tried; for whole GPUs, only the unions of the candidates of as many GPUs as asked
for (a GPU takes a whole GPU only once empty). A set is checked by fit's own rules on the GPUs' usages without its
shares, without building a node state; the answer is checked by ``fit`` itself.

The bound. After ``limit`` fit questions the enumeration stops. If a set of the current size
was found, the best one found is answered (still the fewest pods; the later tie-breaks may be
missed); otherwise the answer is kube-scheduler's own reprieve rule: every relevant candidate,
each given back in turn, most important first, where the pod still fits without evicting
it. That set is minimal under inclusion (no strict subset frees a share) but perhaps not the
fewest. :attr:`Preemption.fewest` says which happened.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import combinations
from math import comb

from .allocation import Allocation
from .capacity import DeviceUsage, allocated_milli, remove_share
from .fit import fit, host_reason, hosts, linked_set
from .inventory import SharingMode
from .request import Demand, GpuKind
from .state import NodeState

DEFAULT_LIMIT = 2000


@dataclass(frozen=True, slots=True)
class Candidate:
    """A pod that may be evicted: its key on the node and its priority (``spec.priority``)."""

    key: str
    priority: int = 0


@dataclass(frozen=True, slots=True)
class Preemption:
    """The victims chosen (keys, in the candidates' order), the allocation the pod gets once
    they are gone, the GPU they hold (milli-GPU), whether the search was exhaustive (the fewest
    pods, best by every tie-break), and how many fit questions it asked."""

    victims: tuple[str, ...]
    allocation: Allocation
    evicted_milli: int
    fewest: bool
    asked: int


def _release(state: NodeState, keys: Sequence[str]) -> NodeState:
    for key in keys:
        state = state.release(key)
    return state


class _Search:
    """One search: the candidates that matter, and the fit questions asked of them."""

    def __init__(self, demand: Demand, state: NodeState, candidates: Sequence[Candidate], limit: int) -> None:
        self.demand, self.state, self.limit = demand, state, limit
        held = {key: alloc for key, alloc in state.pods}
        # Candidates the state does not hold release nothing: never chosen. The first of a key counts.
        unique = {c.key: c for c in reversed(candidates) if c.key in held}
        self.candidates = [unique[k] for k in dict.fromkeys(c.key for c in candidates) if k in unique]
        self.allocations = {c.key: held[c.key] for c in self.candidates}
        self.priority = {c.key: c.priority for c in self.candidates}
        self.milli = {c.key: allocated_milli(self.allocations[c.key]) for c in self.candidates}
        self.order = {c.key: i for i, c in enumerate(self.candidates)}
        self.asked = 0
        node = state.node
        on_gpu: dict[int, list[str]] = {}
        for c in self.candidates:
            for share in self.allocations[c.key].shares:
                on_gpu.setdefault(share.index, []).append(c.key)
        gpu = demand.gpu
        # GPUs that could host a share of the pod once every candidate on them is gone
        self.hostable: dict[int, list[str]] = {}
        if gpu.kind is not GpuKind.NONE:
            for index, device in enumerate(node.devices):
                keys = on_gpu.get(index, [])
                if hosts(gpu, node, device, self._usage_without(index, keys)):
                    self.hostable[index] = keys
        self.host_short = host_reason(demand, state) is not None
        self.single = gpu.kind is not GpuKind.NONE and gpu.count <= 1
        if self.host_short or gpu.kind is GpuKind.NONE:
            self.relevant = [c.key for c in self.candidates]
        else:
            wanted = {k for keys in self.hostable.values() for k in keys}
            self.relevant = [c.key for c in self.candidates if c.key in wanted]

    def _usage_without(self, index: int, keys: Sequence[str]) -> DeviceUsage:
        usage = self.state.usage[index]
        for key in keys:
            for share in self.allocations[key].shares:
                if share.index == index:
                    usage = remove_share(usage, share)
        return usage

    def works(self, keys: Sequence[str]) -> bool:
        """Whether the pod fits once ``keys`` are gone: fit's own test (a GPU hosts a share, or
        ``count`` of them do, joined by NVLink where required; the host has room), asked only of
        the GPUs that could host, on usages without the released shares: no node state is built."""
        self.asked += 1
        gpu = self.demand.gpu
        if gpu.kind is not GpuKind.NONE:
            node = self.state.node
            hosting = [i for i in self.hostable if hosts(gpu, node, node.devices[i], self._usage_without(i, keys))]
            if len(hosting) < max(1, gpu.count):
                return False
            if gpu.nvlink and gpu.count > 1 and linked_set(node.nvlink, tuple(hosting), gpu.count) is None:
                return False
        return not self.host_short or self._host_fits(keys)

    def _host_fits(self, keys: Sequence[str]) -> bool:
        """:func:`~scheduler.core.fit.host_reason`'s test once ``keys`` are gone."""
        state, demand = self.state, self.demand
        node = state.node
        gone = [self.allocations[k] for k in keys]
        if len(state.pods) - len(gone) >= node.max_pods:
            return False
        if demand.cpu_milli > state.cpu_free + sum(a.cpu_milli for a in gone):
            return False
        return demand.memory_mib <= state.memory_free + sum(a.memory_mib for a in gone)

    def rank(self, keys: Sequence[str]) -> tuple[int, int, int, int, tuple[str, ...]]:
        priorities = [self.priority[k] for k in keys]
        return (
            len(keys),
            max(priorities, default=0),
            sum(priorities),
            sum(self.milli[k] for k in keys),
            tuple(sorted(keys)),
        )

    def smallest_size(self) -> int:
        """The fewest candidates that could cover the node's shortfall of CPU, memory and pod room."""
        if not self.host_short:
            return 1
        state, demand = self.state, self.demand
        allocs = [self.allocations[k] for k in self.relevant]
        need = 1 if len(state.pods) >= state.node.max_pods else 0

        def covering(short: int, amounts: list[int]) -> int:
            if short <= 0:
                return 0
            total = 0
            for n, amount in enumerate(sorted(amounts, reverse=True), start=1):
                total += amount
                if total >= short:
                    return n
            return len(amounts) + 1

        return max(
            1,
            need,
            covering(demand.cpu_milli - state.cpu_free, [a.cpu_milli for a in allocs]),
            covering(demand.memory_mib - state.memory_free, [a.memory_mib for a in allocs]),
        )

    def sets(self, size: int) -> Iterator[tuple[str, ...]]:
        """Every relevant set of ``size`` candidates: for a pod on one GPU with room on the host,
        only the sets within one GPU's candidates (each once, though a pod on several GPUs puts
        it in several GPUs' lists: :meth:`works` asks every GPU that could host)."""
        if self.single and not self.host_short:
            tried: set[frozenset[str]] = set()
            for keys in self.hostable.values():
                for chosen in combinations(keys, size):
                    as_set = frozenset(chosen)
                    if as_set not in tried:
                        tried.add(as_set)
                        yield chosen
            return
        yield from combinations(self.relevant, size)

    def emptied(self) -> list[tuple[str, ...]] | None:
        """For whole GPUs with room on the host, every possible answer, best first: a GPU takes a
        whole GPU only once every pod on it is gone, so an answer is all the candidates on
        ``count`` GPUs that could host. None for other requests (whole GPUs a MIG instance may
        serve among them: a MIG GPU takes one beside other instances), or when there are more
        groups of GPUs than the bound allows."""
        gpu = self.demand.gpu
        if (
            gpu.kind is not GpuKind.WHOLE
            or SharingMode.MIG in gpu.sharing  # a MIG GPU may take one beside other instances
            or self.host_short
            or comb(len(self.hostable), gpu.count) > self.limit
        ):
            return None
        unions = {
            tuple(sorted({k for i in group for k in self.hostable[i]}, key=self.order.__getitem__))
            for group in combinations(sorted(self.hostable), gpu.count)
        }
        return sorted(unions, key=self.rank)

    def reprieved(self) -> tuple[str, ...]:
        """kube-scheduler's rule: every relevant candidate, each given back where the pod fits without it."""
        kept = list(self.relevant)
        for key in sorted(kept, key=lambda k: (-self.priority[k], -self.milli[k], k)):
            trial = [k for k in kept if k != key]
            if self.works(trial):
                kept = trial
        return tuple(kept)


def choose_victims(
    demand: Demand, state: NodeState, candidates: Sequence[Candidate], limit: int = DEFAULT_LIMIT
) -> Preemption | str:
    """The victims among ``candidates`` whose eviction lets ``demand`` fit on ``state``'s node
    (see the module for the order and the bound), or why no set of them does.

    An empty set of victims means the pod fits already. ``candidates`` the state holds no
    allocation of release nothing and are never chosen.
    """
    search = _Search(demand, state, candidates, limit)
    if fit(demand, state):
        return _answer(search, (), True)
    # Releasing every candidate is the most any set can do (the irrelevant ones change nothing).
    found = fit(demand, _release(state, [c.key for c in search.candidates]))
    search.asked += 1
    if not found:
        return f"evicting all {len(candidates)} candidates on node {state.node.name} frees no share: {found.reason}"
    unions = search.emptied()
    for union in unions or ():  # best first: the first that works is the answer
        if search.works(union):
            return _answer(search, union, True)
    best: tuple[str, ...] | None = None
    for size in range(search.smallest_size(), len(search.relevant) + 1):
        for chosen in search.sets(size):
            if search.asked >= limit:
                return _answer(search, best, False) if best is not None else _answer(search, search.reprieved(), False)
            if search.works(chosen) and (best is None or search.rank(chosen) < search.rank(best)):
                best = chosen
        if best is not None:
            return _answer(search, best, True)
    raise AssertionError("releasing every relevant candidate frees a share, so some size must work")


def _answer(search: _Search, victims: Sequence[str], fewest: bool) -> Preemption:
    ordered = tuple(sorted(victims, key=search.order.__getitem__))
    after = _release(search.state, ordered)
    found = fit(search.demand, after)
    assert found, "the chosen victims free a share"
    freed = {s.index for k in ordered for s in search.allocations[k].shares}
    allocation = next(
        (a for a in found.allocations if any(s.index in freed for s in a.shares)),
        found.allocations[0],
    )
    return Preemption(ordered, allocation, sum(search.milli[k] for k in ordered), fewest, search.asked)
