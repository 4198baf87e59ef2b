"""The defragmentation planner in a timed replay: every ``every_s`` of simulated time it plans
(:func:`scheduler.core.defrag.plan`, with an eviction budget per run) and its moves are carried
out, so that its benefit can be measured against the same replay without it.

How pods wait. With the planner on, a pod that fits nowhere on arrival is not turned away at
once: it waits, as a pending pod does in a cluster. It is tried again whenever a pod leaves
(kube-scheduler retries unschedulable pods on such events: nothing else frees room), and after
each planner run a pod that was already waiting is turned away if it still fits nowhere: every
pod waits at most one interval. A budget of 0 gives the same waiting without moves: the baseline the
planner is measured against.

A move: its pods are evicted (their shares released); the pending pod it is for is placed
(where the policy puts it, as at arrival); the evicted pods are recreated at once, as their
controllers would, keeping their departure times, and placed where the policy puts them. One
that fits nowhere waits like a pending pod, and if it still fits nowhere at the next run it is
lost (``lost``, apart from the pods turned away). Every pod may move (the simulated workload
stands for Deployments); the planner plans with the run's node ranks and the run's policy over
a copy of what it has learned (:func:`~scheduler.core.policies.base.over_a_copy`), made at each
run: the clusters it asks about are not the replay's, and the replay's own learned object
never follows them. Its predicted landings are where the replay places the pods (seeds 1-4
of both timed scenarios, 4 evictions a run: no evicted pod was lost).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scheduler.core.defrag import Mover, PlanOptions, Waiting, plan
from scheduler.core.errors import ConfigError
from scheduler.core.policies import over_a_copy

from .model import SimPod

if TYPE_CHECKING:
    from .engine import Replay


@dataclass(frozen=True, slots=True)
class DefragSpec:
    """Run the planner every ``every_s`` simulated seconds, evicting at most ``budget`` pods a run;
    a move only lowering fragmentation must lower it by ``min_fall_milli``."""

    every_s: float
    budget: int
    min_fall_milli: float = 500.0

    def __post_init__(self) -> None:
        if not self.every_s > 0:
            raise ConfigError(f"the planner's interval must be positive, got {self.every_s}")
        if self.budget < 0:
            raise ConfigError(f"the eviction budget must be 0 or more, got {self.budget}")


@dataclass(slots=True)
class _Waiter:
    pod: SimPod
    since: float  # when it started waiting
    evicted: bool  # recreated after an eviction (else an arrival)


class Defragmenter:
    def __init__(self, spec: DefragSpec, run: Replay, order: Mapping[str, int]) -> None:
        self.spec, self.run, self.order = spec, run, dict(order)
        self.options = PlanOptions(max_evictions=spec.budget, min_fall_milli=spec.min_fall_milli)
        self.next_run = spec.every_s
        self.waiting: list[_Waiter] = []
        self.turned_away: list[SimPod] = []
        self.admitted = 0  # pods that waited and then got in
        self.lost = 0
        self.evictions = 0
        self.moves = 0

    def hold(self, pod: SimPod) -> None:
        """``pod`` arrived and fits nowhere: it waits."""
        self.waiting.append(_Waiter(pod, self.run.now, False))

    def left(self, name: str) -> None:
        """``name``'s departure time came: if it was still waiting it never ran (or never ran
        again); its leaving, or anyone's, may let waiting pods in."""
        for i, waiter in enumerate(self.waiting):
            if waiter.pod.name == name:
                del self.waiting[i]
                self._give_up(waiter)
                break
        self._retry()

    def until(self, time: float) -> None:
        """Every planner run due up to ``time``."""
        while self.next_run <= time:
            self._tick(self.next_run)
            self.next_run += self.spec.every_s

    def finish(self) -> None:
        """The replay ended: whoever still waits did not get in."""
        for waiter in self.waiting:
            self._give_up(waiter)
        self.waiting = []

    # ------------------------------------------------------------ a planner run

    def _give_up(self, waiter: _Waiter) -> None:
        if waiter.evicted:
            self.lost += 1
        else:
            self.turned_away.append(waiter.pod)

    def _retry(self) -> None:
        still = []
        for waiter in self.waiting:
            if self.run.place(waiter.pod) is None:
                still.append(waiter)
            elif not waiter.evicted:
                self.admitted += 1
        self.waiting = still

    def _tick(self, time: float) -> None:
        run = self.run
        run.advance(time)
        # No retry first: room only comes free when a pod leaves, and every departure retried them.
        if self.spec.budget > 0:
            pending = [Waiting(w.pod.name, w.pod.demand) for w in self.waiting]
            movers = [Mover(name, pod.demand) for name, pod in run.running.items()]
            asked = over_a_copy(run.policy)  # the replay's learned object never sees the plan's clusters
            found = plan(run.board.states, pending, movers, asked, run.measure, self.options, self.order)
            for move in found.moves:
                self._carry_out(move.evict, move.admits, time)
            self._retry()  # a move may have made room for another waiting pod too
        still = []
        for waiter in self.waiting:
            if waiter.since < time:  # an evicted pod that found no place at this run gets until the next
                self._give_up(waiter)
            else:
                still.append(waiter)
        self.waiting = still

    def _carry_out(self, evict: tuple[str, ...], admits: str | None, time: float) -> None:
        run = self.run
        evicted = []
        for name in evict:
            pod = run.running.get(name)
            if pod is not None and run.release(name):
                evicted.append(pod)
        self.evictions += len(evicted)
        self.moves += 1
        if admits is not None:
            for i, waiter in enumerate(self.waiting):
                if waiter.pod.name == admits and run.place(waiter.pod) is not None:
                    del self.waiting[i]
                    self.admitted += 0 if waiter.evicted else 1
                    break
        for pod in evicted:
            if run.place(pod) is None:
                self.waiting.append(_Waiter(pod, time, True))
