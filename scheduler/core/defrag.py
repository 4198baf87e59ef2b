"""Defragmentation: a short list of moves (running pods to evict; their controllers recreate
them and they land elsewhere) that lets pending pods in, or failing that lowers the
fragmentation measure most per evicted pod.

What the planner is given: the cluster's node states; the pending pods (their demands and
priorities); the running pods that may move (:class:`Mover`: the face decides which, and
passes only those; any other pod is never evicted); the policy that will place the recreated
pods (kube-scheduler asks gpuslice, so the cluster's own policy) with the node ranks that break
its ties; the fragmentation measure; and a budget (:class:`PlanOptions`).

Phase 1, letting pending pods in, highest priority first (then in the order given):

* a pod that fits somewhere now needs no move; it is counted where the policy puts it, so that
  later moves see the room it takes;
* otherwise, on each node, the fewest movers whose eviction frees a share the pod fits
  (:func:`scheduler.core.preempt.choose_victims`: fewest, then least important, then least GPU),
  each of which must then fit somewhere (where the policy puts it, largest first) once the
  pending pod has taken its share there: no move strands the pod it evicts. The node with the
  fewest evictions wins (then the least important victims, the least GPU, the node's rank);
* a pod no move lets in, within what is left of the budget, is stranded, with the reason.

A pod moves at most once in a plan: once evicted it is recreated as a new pod, which the plan
cannot name.

Phase 2, only when phase 1 made no move: single-pod moves, each the one that lowers the
cluster's fragmentation measure most (its removal from its node, then its landing where the
policy puts it), as long as the fall is at least ``min_fall_milli`` and the budget lasts. Each
move lowers the measure, so no pod is moved back and forth. Only the ``fragmentation_candidates``
pods whose removal alone lowers their node's measure most are tried for a landing.

The plan is a prediction: it assumes the pending pod is placed before the pods evicted for it
are recreated (kube-scheduler takes pending pods by priority, then by how long they waited), that
they are recreated in the order of the move's ``evict`` (largest first, the order they are
evicted in), and that nothing else changes meanwhile.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .allocation import Allocation, DeviceShare
from .board import Board
from .capacity import allocated_milli, percent
from .errors import ConfigError
from .fit import fit
from .fragmentation import Fragmentation
from .policies.base import Policy
from .preempt import Candidate, choose_victims
from .request import Demand
from .select import evaluate
from .state import NodeState


@dataclass(frozen=True, slots=True)
class Waiting:
    """A pending pod: its key, its demand and its priority."""

    key: str
    demand: Demand
    priority: int = 0


@dataclass(frozen=True, slots=True)
class Mover:
    """A running pod the planner may evict (the face decided it may move), with the demand its
    recreated copy asks for."""

    key: str
    demand: Demand
    priority: int = 0


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """max_evictions: pods evicted over the whole plan; min_fall_milli: the least fall of the
    fragmentation measure (milli-GPU) a phase 2 move must bring; max_pending: pending pods
    considered (highest priority first); search_limit: fit questions per node and pending pod
    (see :mod:`scheduler.core.preempt`); fragmentation_moves: whether phase 2 runs;
    fragmentation_candidates: pods tried for a landing in each phase 2 step."""

    max_evictions: int = 8
    min_fall_milli: float = 500.0
    max_pending: int = 64
    search_limit: int = 500
    fragmentation_moves: bool = True
    fragmentation_candidates: int = 64

    def __post_init__(self) -> None:
        for name in ("max_evictions", "max_pending", "search_limit", "fragmentation_candidates"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be 0 or more, got {getattr(self, name)}")
        if self.min_fall_milli < 0:
            raise ConfigError(f"min_fall_milli must be 0 or more, got {self.min_fall_milli}")


@dataclass(frozen=True, slots=True)
class Landing:
    """Where an evicted pod is expected to land (the policy's placement) and what it gets."""

    pod: str
    node: str
    allocation: Allocation


@dataclass(frozen=True, slots=True)
class Move:
    """Evict ``evict`` from ``node``: that frees ``frees`` (in words) and lets ``admits`` in
    (None for a phase 2 move) on ``allocation``; the evicted pods land as ``lands``; the
    cluster's fragmentation measure falls by ``frag_fall_milli``. ``evict`` is in the order of
    ``lands`` (largest first), the order the prediction places them in: evicted in that order,
    their controllers recreate them in it."""

    node: str
    evict: tuple[str, ...]
    frees: str
    admits: str | None
    allocation: Allocation | None
    lands: tuple[Landing, ...]
    frag_fall_milli: float


@dataclass(frozen=True, slots=True)
class Plan:
    """The moves in order; the pending pods that fit without a move, and where; those no move
    lets in, with why; and the pods evicted in all."""

    moves: tuple[Move, ...]
    fits_now: tuple[tuple[str, str], ...]
    stranded: tuple[tuple[str, str], ...]

    @property
    def evictions(self) -> int:
        return sum(len(m.evict) for m in self.moves)


def describe_share(share: DeviceShare) -> str:
    if share.mig is not None:
        return f"GPU {share.index}: {share.mig.profile} at slot {share.mig.start}"
    return f"GPU {share.index}: {share.memory_mib} MiB, {percent(share.compute_milli)} compute"


def describe_freed(allocations: Sequence[Allocation]) -> str:
    """What evicting pods with ``allocations`` frees, in words."""
    parts = [describe_share(s) for a in allocations for s in a.shares]
    cpu = sum(a.cpu_milli for a in allocations)
    if cpu:
        parts.append(f"{cpu}m CPU")
    return "; ".join(parts) or "nothing gpuslice counts"


class _Planner:
    def __init__(
        self,
        states: Sequence[NodeState],
        movers: Sequence[Mover],
        policy: Policy,
        measure: Fragmentation,
        options: PlanOptions,
        order: Mapping[str, int] | None,
    ) -> None:
        self.order = dict(order) if order is not None else {s.node.name: i for i, s in enumerate(states)}
        self.board = Board(states, self.order)
        self.movers = {m.key: m for m in movers}
        self.policy, self.measure, self.options = policy, measure, options
        self.budget = options.max_evictions
        self.moves: list[Move] = []
        self._never: dict[tuple[int, Demand], str | None] = {}

    def frag(self, state: NodeState) -> float:
        return self.measure.node_frag(state)

    def never_fits(self, demand: Demand) -> str | None:
        """Why ``demand`` fits no node even empty (None if one could take it)."""
        reasons = []
        for state in self.board.states:
            key = (state.node.kind, demand)
            if key not in self._never:
                found = fit(demand, NodeState.empty(state.node))
                self._never[key] = None if found else found.reason
            reason = self._never[key]
            if reason is None:
                return None
            reasons.append(reason)
        return reasons[0] if reasons else "no nodes"

    # ------------------------------------------------------------ phase 1

    def admit(self, pod: Waiting) -> str | None:
        """Let ``pod`` in with the best move (applied to the board); None on success, else why not."""
        options = self.options
        best: tuple[tuple[int, int, int, int, int], Move, list[NodeState]] | None = None
        for state in self.board.states:
            if self._never.get((state.node.kind, pod.demand)) is not None:
                continue  # the node could not take the pod even empty
            candidates = [Candidate(k, self.movers[k].priority) for k, _ in state.pods if k in self.movers]
            if not candidates:
                continue
            choice = choose_victims(pod.demand, state, candidates, options.search_limit)
            if isinstance(choice, str) or not choice.victims or len(choice.victims) > self.budget:
                continue
            priorities = [self.movers[k].priority for k in choice.victims]
            rank = (
                len(choice.victims),
                max(priorities),
                sum(priorities),
                choice.evicted_milli,
                self.order.get(state.node.name, 0),
            )
            if best is not None and rank >= best[0]:
                continue
            tried = self._try(pod, state, choice.victims)
            if tried is not None:
                best = (rank, *tried)
        if best is None:
            return f"no move of at most {self.budget} movable pods lets it in"
        _, move, after = best
        self._commit(move, after)
        return None

    def _commit(self, move: Move, after: Sequence[NodeState]) -> None:
        """Apply ``move``: the board takes the states it leaves; its pods move no more in this
        plan (each is recreated as a new pod, which the plan cannot name)."""
        for state in after:
            self.board.put(state)
        self.moves.append(move)
        self.budget -= len(move.evict)
        for key in move.evict:
            self.movers.pop(key, None)

    def _try(self, pod: Waiting, state: NodeState, victims: tuple[str, ...]) -> tuple[Move, list[NodeState]] | None:
        """The move evicting ``victims`` from ``state``'s node for ``pod``, and the node states it
        leaves, if every victim lands somewhere; the board is left as it was."""
        board = self.board
        before = {s.node.name: s for s in board.states}
        freed = state
        for key in victims:
            freed = freed.release(key)
        placed = evaluate(self.policy, pod.demand, freed)
        if isinstance(placed, str):  # the victims free a share by fit; the policy sees it too
            return None
        touched = {state.node.name: None}  # in order: the sums below repeat exactly
        board.put(freed.apply(pod.key, placed.allocation))
        lands: list[Landing] = []
        ok = True
        for key in sorted(victims, key=lambda k: (-self._size(state, k), k)):
            landing = board.best(self.policy, self.movers[key].demand)
            if landing is None:
                ok = False
                break
            target = board.get(landing.node)
            assert target is not None
            board.put(target.apply(key, landing.allocation))
            touched[landing.node] = None
            lands.append(Landing(key, landing.node, landing.allocation))
        after = [s for name in touched if (s := board.get(name)) is not None]
        for name in touched:
            board.put(before[name])
        if not ok:
            return None
        fall = sum(self.frag(before[n]) for n in touched) - sum(self.frag(s) for s in after)
        allocations = [a for k, a in state.pods if k in victims]
        move = Move(
            state.node.name,
            tuple(landing.pod for landing in lands),  # the order they are predicted to land in
            describe_freed(allocations),
            pod.key,
            placed.allocation,
            tuple(lands),
            fall,
        )
        return move, after

    @staticmethod
    def _size(state: NodeState, key: str) -> int:
        alloc = state.allocation_of(key)
        return allocated_milli(alloc) if alloc is not None else 0

    # ------------------------------------------------------------ phase 2

    def defragment(self) -> None:
        """Single-pod moves by the largest fall of the fragmentation measure, while they are worth it."""
        options = self.options
        while self.budget > 0:
            removals: list[tuple[float, str, NodeState, NodeState]] = []
            for state in self.board.states:
                now = self.frag(state)
                for key, _ in state.pods:
                    if key in self.movers:
                        without = state.release(key)
                        removals.append((now - self.frag(without), key, state, without))
            removals.sort(key=lambda r: (-r[0], r[1]))
            best: tuple[float, Move, list[NodeState]] | None = None
            for _, key, state, without in removals[: options.fragmentation_candidates]:
                found = self._relocate(key, state, without)
                if found is not None and (best is None or found[0] > best[0]):
                    best = found
            if best is None or best[0] < options.min_fall_milli:
                return
            _, move, after = best
            self._commit(move, after)

    def _relocate(self, key: str, state: NodeState, without: NodeState) -> tuple[float, Move, list[NodeState]] | None:
        board = self.board
        name = state.node.name
        board.put(without)
        landing = board.best(self.policy, self.movers[key].demand)
        board.put(state)
        if landing is None:
            return None
        old = state.allocation_of(key)
        if landing.node == name and old is not None and landing.allocation.shares == old.shares:
            return None  # it would land where it is
        if landing.node == name:
            after = [without.apply(key, landing.allocation)]
            fall = self.frag(state) - self.frag(after[0])
        else:
            target = board.get(landing.node)
            assert target is not None
            moved = target.apply(key, landing.allocation)
            after = [without, moved]
            fall = self.frag(state) + self.frag(target) - self.frag(without) - self.frag(moved)
        freed = describe_freed([old] if old is not None else [])
        move = Move(name, (key,), freed, None, None, (Landing(key, landing.node, landing.allocation),), fall)
        return fall, move, after


def plan(
    states: Sequence[NodeState],
    pending: Sequence[Waiting],
    movers: Sequence[Mover],
    policy: Policy,
    measure: Fragmentation,
    options: PlanOptions = PlanOptions(),
    order: Mapping[str, int] | None = None,
) -> Plan:
    """The moves for the cluster ``states`` (see the module). Pure: ``states`` are not changed."""
    planner = _Planner(states, movers, policy, measure, options, order)
    fits_now: list[tuple[str, str]] = []
    stranded: list[tuple[str, str]] = []
    queue = sorted(range(len(pending)), key=lambda i: (-pending[i].priority, i))
    hopeless: dict[Demand, str] = {}  # demands no move let in since the last move
    for n, i in enumerate(queue):
        pod = pending[i]
        if n >= options.max_pending:
            stranded.append((pod.key, f"not considered: more than {options.max_pending} pending pods"))
            continue
        placement = planner.board.best(policy, pod.demand)
        if placement is not None:
            target = planner.board.get(placement.node)
            assert target is not None
            planner.board.put(target.apply(pod.key, placement.allocation))
            fits_now.append((pod.key, placement.node))
            hopeless.clear()
            continue
        why = planner.never_fits(pod.demand)
        if why is not None:
            stranded.append((pod.key, f"fits no node even empty: {why}"))
            continue
        if planner.budget <= 0:
            stranded.append((pod.key, f"the budget of {options.max_evictions} evictions is spent"))
            continue
        why = hopeless.get(pod.demand)
        if why is None:
            moves = len(planner.moves)
            why = planner.admit(pod)
            if why is None:
                hopeless.clear()
                continue
            assert len(planner.moves) == moves
            hopeless[pod.demand] = why
        stranded.append((pod.key, why))
    if not planner.moves and options.fragmentation_moves:
        planner.defragment()
    return Plan(tuple(planner.moves), tuple(fits_now), tuple(stranded))
