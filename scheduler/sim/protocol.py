"""The order in which pods arrive (and leave), and the seeded node ranks.

Arrivals only (the FGD protocol, Weng et al. ATC'23, as the authors' simulator runs it):

1. the trace's pods in a seeded shuffle;
2. inflation to ``inflate`` x the cluster's GPU capacity: pods drawn uniformly with
   replacement from the original trace are appended; the first draw that would push the
   running total over the target stops it. The authors' stop test adds only the pod's
   share of *one* GPU (``gpu_milli``, not ``num_gpu x gpu_milli``); we copy that quirk.
   A target below the trace's own total removes random pods instead;
3. pods never leave; a pod that fits nowhere is dropped.

Timed replay: every pod arrives at its creation time and leaves at its deletion time
(pods without times arrive first, in trace order, and stay); at equal times departures
go first, so freed shares are reused at once.

Generators (scenarios) are expanded first, from the same seeded stream: each pod's shape
is drawn by weight, arrivals are a Poisson process at the generator's rate, durations
come from its distribution.

Node ranks: a seeded permutation, drawn after the pods; equal scores go to the lowest rank.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from scheduler.core.inventory import Node

from .model import TIMED, Duration, SimPod, Trace, request_milli


@dataclass(frozen=True, slots=True)
class Event:
    """A pod arriving (``leave`` False) or leaving at ``time``."""

    time: float
    pod: SimPod
    leave: bool = False


def _per_gpu_milli(pod: SimPod, reference_memory_mib: int) -> int:
    total = request_milli(pod.demand, reference_memory_mib)
    return total // max(1, pod.demand.gpu.count) if total else 0


def inflate_pods(
    pods: Sequence[SimPod],
    original: Sequence[SimPod],
    ratio: float,
    capacity_milli: int,
    rng: random.Random,
    reference_memory_mib: int = 0,
) -> list[SimPod]:
    """``pods`` grown (or shrunk) to ``ratio`` x ``capacity_milli`` of GPU requests, as the authors do."""
    out = list(pods)
    if ratio <= 0 or not any(_per_gpu_milli(p, reference_memory_mib) for p in original):
        return out  # nothing to grow from: a workload without GPU requests would be drawn from for ever
    total = sum(request_milli(p.demand, reference_memory_mib) for p in out)
    target = ratio * capacity_milli
    if total > target:
        while out and total > target:
            victim = out.pop(rng.randrange(len(out)))
            total -= request_milli(victim.demand, reference_memory_mib)
        return out
    i = 0
    while True:
        drawn = original[rng.randrange(len(original))]
        if total + _per_gpu_milli(drawn, reference_memory_mib) > target:
            return out
        total += request_milli(drawn.demand, reference_memory_mib)
        out.append(replace(drawn, name=f"{drawn.name}-tuned-{i}"))
        i += 1


def draw_duration(duration: Duration | None, rng: random.Random) -> float | None:
    if duration is None:
        return None
    if duration.distribution == "exponential":
        return rng.expovariate(1.0 / duration.mean) if duration.mean > 0 else 0.0
    if duration.distribution == "uniform":
        return rng.uniform(duration.low, duration.high)
    return duration.mean


def generated_pods(trace: Trace, rng: random.Random) -> list[SimPod]:
    """The trace's generators expanded with ``rng`` (shape, arrival time, departure time)."""
    out: list[SimPod] = []
    for gen in trace.generators:
        shapes = list(gen.shapes)
        weights = [s.weight for s in shapes]
        now = gen.start
        for i in range(gen.count):
            shape = rng.choices(shapes, weights)[0]
            if gen.rate > 0:
                now += rng.expovariate(gen.rate)
            length = draw_duration(gen.duration, rng)
            deleted = None if length is None else now + length
            out.append(SimPod(f"{gen.name}-{i}", shape.demand, now, deleted, gen.namespace))
    return out


def arrival_events(trace: Trace, rng: random.Random, inflate: float, shuffle: bool) -> list[Event]:
    original = list(trace.pods) + generated_pods(trace, rng)
    pods = list(original)
    if shuffle:
        rng.shuffle(pods)
    pods = inflate_pods(pods, original, inflate, trace.capacity_milli, rng, trace.reference_memory_mib())
    return [Event(0.0, p) for p in pods]


def timed_events(trace: Trace, rng: random.Random, inflate: float = 0.0, compress: float = 1.0) -> list[Event]:
    """Arrivals at creation times, departures at deletion times.

    ``inflate`` > 0 grows the pods as the arrivals protocol does (draws with replacement
    until ``inflate`` x capacity); a drawn copy keeps its source's duration and starts at
    the creation time of another pod drawn at random, so the copies follow the trace's
    arrival density instead of doubling its instants. ``compress`` divides every creation
    time and keeps each pod's duration, so more pods overlap (the load rises) while each
    still runs as long.
    """
    original = list(trace.pods) + generated_pods(trace, rng)
    pods = original
    if inflate > 0:
        pods = inflate_pods(original, original, inflate, trace.capacity_milli, rng, trace.reference_memory_mib())
        starts = [p.created for p in original if p.created is not None]
        if starts:
            pods = original + [_restarted(p, rng.choice(starts)) for p in pods[len(original) :]]
    events: list[tuple[float, int, int, Event]] = []
    for i, pod in enumerate(pods):
        if compress != 1.0 and pod.created is not None:
            pod = _restarted(pod, pod.created / compress)
        start = pod.created if pod.created is not None else -1.0
        events.append((start, 1, i, Event(max(start, 0.0), pod)))
        if pod.deleted is not None:
            events.append((pod.deleted, 0, i, Event(pod.deleted, pod, leave=True)))
    events.sort(key=lambda e: e[:3])
    return [e[3] for e in events]


def _restarted(pod: SimPod, created: float) -> SimPod:
    """``pod`` created at ``created``, running as long as before."""
    length = None if pod.deleted is None or pod.created is None else pod.deleted - pod.created
    return replace(pod, created=created, deleted=None if length is None else created + length)


def events(
    trace: Trace, rng: random.Random, replay: str, inflate: float, shuffle: bool, compress: float = 1.0
) -> list[Event]:
    """The run's event sequence, drawn from ``rng`` (``compress`` and ``inflate`` for timed
    replays: see :func:`timed_events`)."""
    if replay == TIMED:
        return timed_events(trace, rng, inflate, compress)
    return arrival_events(trace, rng, inflate, shuffle)


def node_ranks(nodes: Sequence[Node], rng: random.Random) -> dict[str, int]:
    """A seeded rank per node (0 wins ties); nodes are ranked from their names' sorted order."""
    names = sorted(n.name for n in nodes)
    perm = list(range(len(names)))
    rng.shuffle(perm)
    return {name: perm[i] for i, name in enumerate(names)}
