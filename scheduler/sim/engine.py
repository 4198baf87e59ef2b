"""One simulation run: a trace, a policy, a seed -> a record of every event.

The loop tells the policy of each pod once, on arrival (``observe``), hands it to the core
(``Board.best``: fit, place, score, tie-break by node rank) and applies the winning
allocation (``NodeState.apply``); it knows no policy by name: a policy gets the run's
:class:`~scheduler.core.policies.base.Context` (seed, the trace's typical workload) and
uses what it needs. After every event it records the GPU requested so far (dropped pods included),
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
from scheduler.core.policies import Context, Policy, make_policy
from scheduler.core.request import Demand, GpuKind
from scheduler.core.state import NodeState

from .model import ARRIVALS, REPLAY_MODES, TIMED, Trace, request_milli
from .protocol import events as make_events
from .protocol import node_ranks

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
    gpu_hours: float = 0.0  # timed replays: allocated GPU integrated over time (0 when all events are at time 0)


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
    compress: float = 1.0,
) -> RunResult:
    """Run ``policy_name`` over ``trace`` with ``seed``; ``ranks`` overrides the seeded node ranks.

    A timed replay inflates only when ``inflate`` is given (the input's own inflation is the
    arrivals protocol's) and divides creation times by ``compress`` (durations kept).
    """
    replay = replay or trace.replay
    if replay not in REPLAY_MODES:
        raise ValueError(f"unknown replay mode {replay!r}; accepted: {', '.join(REPLAY_MODES)}")
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
    board = Board(initial_states(trace), ranks if ranks is not None else seeded_ranks)
    reference = trace.reference_memory_mib()

    node_frag = {s.node.name: measure.node_frag(s) for s in board.states}
    node_idle = {s.node.name: s.free_milli() for s in board.states}
    frag_total = sum(node_frag.values())
    idle_total = sum(node_idle.values())
    allocated_total = sum(allocated_milli(a) for s in board.states for _, a in s.pods)
    arrived_total = 0
    where: dict[str, tuple[str, int]] = {}

    n = len(sequence) + 1
    arrived = np.zeros(n, dtype=np.int64)
    allocated = np.zeros(n, dtype=np.int64)
    frag = np.zeros(n, dtype=np.float64)
    idle = np.zeros(n, dtype=np.int64)
    arrived[0], allocated[0], frag[0], idle[0] = 0, allocated_total, frag_total, idle_total
    placements: list[tuple[str, str | None]] = []
    failed_by_kind: dict[str, int] = {}
    failed = placed = 0
    gpu_milli_seconds = 0.0
    clock = sequence[0].time if sequence else 0.0
    step = max(1, len(sequence) // 200)

    def refresh(state: NodeState) -> None:
        nonlocal frag_total, idle_total
        name = state.node.name
        value, free = measure.node_frag(state), state.free_milli()
        frag_total += value - node_frag[name]
        idle_total += free - node_idle[name]
        node_frag[name], node_idle[name] = value, free

    for k, event in enumerate(sequence, start=1):
        pod = event.pod
        gpu_milli_seconds += allocated_total * (event.time - clock)
        clock = event.time
        if event.leave:
            held = where.pop(pod.name, None)
            if held is not None:
                state = board.get(held[0])
                assert state is not None
                after = state.release(pod.name)
                board.put(after)
                allocated_total -= held[1]
                refresh(after)
        else:
            demand = pod.demand
            arrived_total += request_milli(demand, reference)
            observe = getattr(policy, "observe", None)
            if observe is not None:
                observe(demand)
            choice = board.best(policy, demand)
            if choice is None:
                failed += 1
                if replay == ARRIVALS:
                    placements.append((pod.name, None))
                kind = pod_kind(demand)
                failed_by_kind[kind] = failed_by_kind.get(kind, 0) + 1
            else:
                state = board.get(choice.node)
                assert state is not None
                after = state.apply(pod.name, choice.allocation)
                board.put(after)
                took = allocated_milli(choice.allocation)
                allocated_total += took
                where[pod.name] = (choice.node, took)
                placed += 1
                refresh(after)
                if replay == ARRIVALS:
                    placements.append((pod.name, choice.node))
        arrived[k], allocated[k], frag[k], idle[k] = arrived_total, allocated_total, frag_total, idle_total
        if progress is not None and (k % step == 0 or k == len(sequence)):
            progress(k, len(sequence))

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
        sum(1 for s in board.states for u in s.usage if u.shares),
        gpu_milli_seconds / 1000 / 3600,
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
