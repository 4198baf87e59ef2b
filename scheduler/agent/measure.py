"""Measured use, every round: sample, guard, report strays, publish, and serve ``/metrics``.

What leaves the agent, and how often:

* the inventory's ``strayMemoryMiB`` per GPU (not in MIG mode), rounded up to
  ``measure.strayRoundMiB``: the agent's inventory write picks it up in the same round, only
  when the rounded figure changed. It is what placement reads (a larger figure is written at
  once: a share that would not fit must stop being placed);
* the Node's ``<prefix>usage`` annotation (:mod:`scheduler.core.measured`), for ``gpuslice
  inspect``: written when a figure changed, at most every ``measure.publishSeconds``. Used
  memory goes in rounded up to :data:`MEMORY_STEP_MIB` and compute to the nearest
  :data:`COMPUTE_STEP_MILLI`, so jitter is no change;
* Events (:mod:`scheduler.agent.guard`, :mod:`scheduler.agent.strays`) and the metrics of the
  last sample (:mod:`scheduler.agent.metrics`).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import replace

from prometheus_client import CollectorRegistry

from scheduler.core.errors import GpusliceError
from scheduler.core.measured import Measured, MeasuredShare, StrayUse, usage_annotation

from .cluster import NodeCluster
from .config import AgentConfig
from .gpus import Gpus
from .guard import Guard
from .metrics import View, registry
from .pods import PodInfo
from .procs import ProcReader
from .sampling import Sample, take
from .strays import StrayReports

log = logging.getLogger("gpuslice.agent.measure")

MEMORY_STEP_MIB = 64
COMPUTE_STEP_MILLI = 100


def round_up(value: int, step: int) -> int:
    return -(-value // step) * step


def rfc3339(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def measured(sample: Sample, overrunning: set[tuple[str, int]], at: str) -> Measured:
    """The sample as the usage annotation has it (figures rounded: see the module)."""
    pods: dict[str, list[MeasuredShare]] = {}
    for share in sample.shares:
        if not share.measured:
            continue  # unknown this round (its GPU could not be read): no figure, not a 0
        compute = share.used_compute_milli
        pods.setdefault(share.pod, []).append(
            MeasuredShare(
                share.gpu_index,
                round_up(share.used_memory_mib, MEMORY_STEP_MIB),
                None
                if compute is None
                else (compute + COMPUTE_STEP_MILLI // 2) // COMPUTE_STEP_MILLI * COMPUTE_STEP_MILLI,
                share.key in overrunning,
            )
        )
    strays = tuple(StrayUse(s.gpu_index, s.pid, s.memory_mib, s.why) for s in sample.strays)
    return Measured(at, {k: tuple(v) for k, v in pods.items()}, strays)


class Measure:
    def __init__(
        self,
        config: AgentConfig,
        gpus: Gpus,
        cluster: NodeCluster,
        procs: ProcReader,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._gpus = gpus
        self._cluster = cluster
        self._procs = procs
        self._wall = wall
        self.guard = Guard(config.overrun, cluster)
        self.strays = StrayReports(config.measure, cluster, config.node)
        self._view = View(config.node)
        self._stray_mib: dict[str, int] = {}
        self._published = ""  # the usage annotation last written, without its timestamp
        self._published_at: float | None = None
        self.registry: CollectorRegistry = registry(self.view)
        self.writes = 0  # usage annotation writes since start
        self.refusals: Counter[str] = Counter()  # Allocate refused, by reason (the agent counts them)

    def view(self) -> View:
        return replace(
            self._view, refusals=tuple(sorted(self.refusals.items())), pod_names=self._config.metrics.pod_names
        )

    def stray_mib(self) -> dict[str, int]:
        """GPU UUID -> stray memory as published for the extender (rounded up)."""
        return dict(self._stray_mib)

    def round(self, pods: Iterable[PodInfo], now: float) -> list[str]:
        """One sample and all that follows from it at ``now`` (monotonic seconds); the problems."""
        known = list(pods)
        sample = take(self._gpus, known, self._procs)
        self.guard.observe(sample, now)
        self.strays.observe(sample, now)
        step = self._config.measure.stray_round_mib
        self._stray_mib = {uuid: round_up(mib, step) for uuid, mib in sample.stray_memory_mib().items() if mib > 0}
        overrunning = self.guard.overrunning()
        self._view = View(
            self._config.node,
            sample,
            frozenset(overrunning),
            tuple(sorted(self.guard.actions.items())),
            self.strays.reported,
        )
        problems = list(sample.problems)
        try:
            self._publish(measured(sample, overrunning, rfc3339(self._wall())), now)
        except GpusliceError as exc:
            problems.append(f"publish usage: {exc}")
        return problems

    def _publish(self, figures: Measured, now: float) -> None:
        text = usage_annotation(figures)
        unstamped = usage_annotation(Measured("", figures.pods, figures.stray))
        if unstamped == self._published:
            return
        due = self._published_at is None or now - self._published_at >= self._config.measure.publish_s
        if not due:
            return
        self._cluster.set_node_annotations({self._config.prefix + "usage": text})
        self._published, self._published_at = unstamped, now
        self.writes += 1
