"""One simulation run: a trace, a policy, a seed -> a record of every event.

The loop tells the policy of each pod once, on arrival (``observe``), hands it to the core
(``Board.best``: fit, place, score, tie-break by node rank) and applies the winning
allocation (``NodeState.apply``); it knows no policy by name: a policy gets the run's
:class:`~scheduler.core.policies.base.Context` (seed, the trace's typical workload) and
uses what it needs. With ``defrag`` (timed replay), pods that fit nowhere wait for the next run of
the defragmentation planner (:mod:`.defrag`) instead of being turned away at once. After every
event it records the GPU requested so far (dropped pods included),
the GPU allocated, the fragmentation against the trace's typical workload and the idle
GPU, all in milli-GPU.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scheduler.core.board import Board
from scheduler.core.capacity import allocated_milli
from scheduler.core.errors import RecordError
from scheduler.core.fit import fit
from scheduler.core.fragmentation import Fragmentation, TypicalWorkload
from scheduler.core.policies import Context, Policy, make_policy, tell
from scheduler.core.quota import NOTHING, Charge, Quota, charge, quotas_by_namespace, refusal
from scheduler.core.request import MILLI, Demand, GpuKind
from scheduler.core.state import NodeState

from .defrag import Defragmenter, DefragSpec
from .model import ARRIVALS, REPLAY_MODES, TIMED, SimPod, Trace, request_milli
from .protocol import events as make_events
from .protocol import node_ranks

HELD_BY_QUOTA = "\0held by quota"  # Replay.place's answer for a pod its quota holds back: no node's name

Progress = Callable[[int, int], None]


@dataclass
class RunResult:
    trace: str
    policy: str
    seed: int
    capacity_milli: int
    arrived: np.ndarray  # per event, cumulative requested milli-GPU (event 0: before any pod)
    allocated: np.ndarray  # per event, allocated milli-GPU
    frag: np.ndarray  # per event, fragmented milli-GPU
    idle: np.ndarray  # per event, idle milli-GPU
    failed: int
    placed: int
    wall_seconds: float
    placements: list[tuple[str, str | None]] = field(default_factory=list)  # (pod, node or None), arrivals only
    failed_by_kind: dict[str, int] = field(default_factory=dict)  # dropped pods per kind (share, 1-gpu, ...)
    gpus_used: int = 0  # GPUs holding at least one share at the end
    gpu_hours: float = 0.0  # GPU held over simulated time (timed replay; 0 with arrivals only)
    evictions: int = 0  # pods the defragmentation planner evicted
    moves: int = 0  # its moves
    evicted_lost: int = 0  # evicted pods that found no place again in time
    waited_in: int = 0  # pods that waited for a planner run and then got in
    defrag: DefragSpec | None = None


def build_policy(name: str, seed: int, workload: TypicalWorkload, options: dict[str, Any] | None = None) -> Policy:
    """A registered policy with ``options``, given the run's context (its seed, and the
    trace's typical workload, known in advance as the FGD paper's protocol has it)."""
    return make_policy(name, options, Context(seed, workload))


def initial_states(trace: Trace) -> list[NodeState]:
    """Empty nodes, with the snapshot's bound pods applied (RecordError if one does not fit)."""
    states = {n.name: NodeState.empty(n) for n in trace.nodes}
    for pod in trace.bound:
        state = states.get(pod.node)
        if state is None:
            raise RecordError(pod.name, f"is bound to node {pod.node!r}, which is not in the cluster")
        alloc = pod.allocation
        if alloc is None:
            found = fit(pod.demand, state)
            if not found:
                raise RecordError(pod.name, f"is bound to node {pod.node} but does not fit there: {found.reason}")
            alloc = found.allocations[0]
        states[pod.node] = state.apply(pod.name, alloc)
    return list(states.values())


class Replay:
    """The changing side of one run: the board, what each running pod holds, and the totals the
    record reads (allocated, fragmented and idle milli-GPU, and allocated milli-GPU-seconds)."""

    def __init__(self, board: Board, measure: Fragmentation, policy: Policy) -> None:
        self.board, self.measure, self.policy = board, measure, policy
        self.node_frag = {s.node.name: measure.node_frag(s) for s in board.states}
        self.node_idle = {s.node.name: s.free_milli() for s in board.states}
        self.frag_total = sum(self.node_frag.values())
        self.idle_total = sum(self.node_idle.values())
        self.allocated_total = sum(allocated_milli(a) for s in board.states for _, a in s.pods)
        self.where: dict[str, tuple[str, int]] = {}  # pod -> (node, milli-GPU it holds)
        self.running: dict[str, SimPod] = {}
        self.quotas: dict[str, tuple[Quota, ...]] = {}  # namespace -> its GPU quotas (scenarios' quotas:)
        self.quota_use: dict[str, Charge] = {}
        self.charged: dict[str, tuple[str, Charge]] = {}  # pod -> (namespace, what it holds)
        self.now = 0.0
        self.milli_seconds = 0.0

    def advance(self, time: float) -> None:
        """Simulated time moves on to ``time``: the GPU held meanwhile is counted."""
        if time > self.now:
            self.milli_seconds += self.allocated_total * (time - self.now)
            self.now = time

    def _refresh(self, state: NodeState) -> None:
        name = state.node.name
        value, free = self.measure.node_frag(state), state.free_milli()
        self.frag_total += value - self.node_frag[name]
        self.idle_total += free - self.node_idle[name]
        self.node_frag[name], self.node_idle[name] = value, free

    def place(self, pod: SimPod) -> str | None:
        """Place ``pod`` where the policy puts it; its node, or None if it fits nowhere (or,
        with GPU quotas, :data:`HELD_BY_QUOTA` if its namespace's quota holds it back)."""
        choice = self.board.best(self.policy, pod.demand)
        if choice is None:
            return None
        state = self.board.get(choice.node)
        assert state is not None
        quotas = self.quotas.get(pod.namespace)
        if quotas:
            held = charge(choice.allocation, state.node)
            if refusal(quotas, self.quota_use.get(pod.namespace, NOTHING), held) is not None:
                return HELD_BY_QUOTA
            self.quota_use[pod.namespace] = self.quota_use.get(pod.namespace, NOTHING) + held
            self.charged[pod.name] = (pod.namespace, held)
        after = state.apply(pod.name, choice.allocation)
        self.board.put(after)
        took = allocated_milli(choice.allocation)
        self.allocated_total += took
        self.where[pod.name] = (choice.node, took)
        self.running[pod.name] = pod
        self._refresh(after)
        return choice.node

    def release(self, name: str) -> bool:
        """``name`` leaves (or is evicted); False if it held nothing."""
        held = self.where.pop(name, None)
        if held is None:
            return False
        self.running.pop(name, None)
        if self.charged:
            namespace, took = self.charged.pop(name, ("", NOTHING))
            if namespace:
                self.quota_use[namespace] = self.quota_use[namespace] - took
        state = self.board.get(held[0])
        assert state is not None
        after = state.release(name)
        self.board.put(after)
        self.allocated_total -= held[1]
        self._refresh(after)
        return True


def simulate(
    trace: Trace,
    policy_name: str,
    seed: int,
    *,
    replay: str | None = None,
    inflate: float | None = None,
    shuffle: bool | None = None,
    progress: Progress | None = None,
    policy_options: dict[str, Any] | None = None,
    ranks: dict[str, int] | None = None,
    defrag: DefragSpec | None = None,
    compress: float = 1.0,
) -> RunResult:
    """Run ``policy_name`` over ``trace`` with ``seed``; ``ranks`` overrides the seeded node ranks;
    ``defrag`` runs the defragmentation planner every so often (timed replay only, see :mod:`.defrag`).

    A timed replay inflates only when ``inflate`` is given (the input's own inflation is the
    arrivals protocol's) and divides creation times by ``compress`` (durations kept).
    """
    replay = replay or trace.replay
    if replay not in REPLAY_MODES:
        raise ValueError(f"unknown replay mode {replay!r}; accepted: {', '.join(REPLAY_MODES)}")
    if defrag is not None and replay != TIMED:
        raise ValueError(f"defragmentation needs simulated time: replay {TIMED}, not {replay}")
    if defrag is not None and trace.quotas:
        raise ValueError("GPU quotas and defragmentation are not simulated together in this version")
    if not compress > 0:
        raise ValueError(f"compress {compress}: accepted: a positive factor (1: times as recorded)")
    if replay == TIMED:
        inflate = inflate or 0.0
    inflate = trace.inflate if inflate is None else inflate
    shuffle = trace.shuffle if shuffle is None else shuffle
    started = time.perf_counter()
    rng = random.Random(seed)
    workload = TypicalWorkload.from_demands(trace.typical_demands())
    measure = Fragmentation(workload)
    policy = build_policy(policy_name, seed, workload, policy_options)
    sequence = make_events(trace, rng, replay, inflate, shuffle, compress)
    seeded_ranks = node_ranks(trace.nodes, rng)
    order = ranks if ranks is not None else seeded_ranks
    run = Replay(Board(initial_states(trace), order), measure, policy)
    run.quotas = quotas_by_namespace(trace.quotas)
    # with namespaces (quotas, or pods given one), failures are counted per kind and namespace
    namespaced = (
        bool(trace.quotas)
        or any(p.namespace != "default" for p in trace.pods)
        or any(g.namespace != "default" for g in trace.generators)
    )
    waiting = None
    if defrag is not None:  # the planner asks a copy of the run's policy (see Defragmenter)
        waiting = Defragmenter(defrag, run, order)
    reference = trace.reference_memory_mib()
    arrived_total = 0

    n = len(sequence) + 1
    arrived = np.zeros(n, dtype=np.int64)
    allocated = np.zeros(n, dtype=np.int64)
    frag = np.zeros(n, dtype=np.float64)
    idle = np.zeros(n, dtype=np.int64)
    arrived[0], allocated[0], frag[0], idle[0] = 0, run.allocated_total, run.frag_total, run.idle_total
    placements: list[tuple[str, str | None]] = []
    failed_by_kind: dict[str, int] = {}
    failed = placed = 0
    step = max(1, len(sequence) // 200)

    for k, event in enumerate(sequence, start=1):
        if waiting is not None:
            waiting.until(event.time)
        run.advance(event.time)
        pod = event.pod
        if event.leave:
            run.release(pod.name)
            if waiting is not None:
                waiting.left(pod.name)
        else:
            demand = pod.demand
            arrived_total += request_milli(demand, reference)
            tell(policy, demand)
            node = run.place(pod)
            if node == HELD_BY_QUOTA:  # apart from the pods that fit nowhere
                failed += 1
                if replay == ARRIVALS:
                    placements.append((pod.name, None))
                kind = f"held by quota ({pod.namespace})"
                failed_by_kind[kind] = failed_by_kind.get(kind, 0) + 1
            elif node is None and waiting is not None:
                waiting.hold(pod)
            elif node is None:
                failed += 1
                if replay == ARRIVALS:
                    placements.append((pod.name, None))
                kind = pod_kind(demand) + (f" ({pod.namespace})" if namespaced else "")
                failed_by_kind[kind] = failed_by_kind.get(kind, 0) + 1
            else:
                placed += 1
                if replay == ARRIVALS:
                    placements.append((pod.name, node))
        arrived[k], allocated[k], frag[k], idle[k] = arrived_total, run.allocated_total, run.frag_total, run.idle_total
        if progress is not None and (k % step == 0 or k == len(sequence)):
            progress(k, len(sequence))

    extra: dict[str, Any] = {}
    if waiting is not None:
        waiting.finish()
        failed += len(waiting.turned_away)
        placed += waiting.admitted
        for pod in waiting.turned_away:
            kind = pod_kind(pod.demand)
            failed_by_kind[kind] = failed_by_kind.get(kind, 0) + 1
        extra = {
            "evictions": waiting.evictions,
            "moves": waiting.moves,
            "evicted_lost": waiting.lost,
            "waited_in": waiting.admitted,
            "defrag": defrag,
        }
    return RunResult(
        trace.name,
        policy_name,
        seed,
        trace.capacity_milli,
        arrived,
        allocated,
        frag,
        idle,
        failed,
        placed,
        time.perf_counter() - started,
        placements,
        failed_by_kind,
        sum(1 for s in run.board.states for u in s.usage if u.shares),
        gpu_hours=run.milli_seconds / MILLI / 3600,
        **extra,
    )


def pod_kind(demand: Demand) -> str:
    """A pod's class for the failure breakdown: cpu-only, share, k-gpu or mig."""
    gpu = demand.gpu
    if gpu.kind is GpuKind.NONE:
        return "cpu-only"
    if gpu.kind is GpuKind.WHOLE:
        return f"{gpu.count}-gpu"
    if gpu.kind is GpuKind.MIG:
        return "mig"
    return "share" if gpu.count <= 1 else f"{gpu.count}-share"
