"""The guard against overruns: a share whose measured memory stays above what its record gives.

GPU memory has no cgroup limit: on a time-sliced GPU a pod can take all of it, and on MPS a
client that ignores its pinned-memory limit can too; the record is then the only guard. So
every sample, each share's used memory is compared with its allocation (plus
``overrun.toleranceMiB``). The rule, over the grace period as a whole: an **episode** starts at
the first sample above; it is an **overrun** once it has lasted ``overrun.graceSeconds`` and at
least half of the samples of the last grace period were above (a dip under the share for a
sample or two does not reset it); it ends only when a whole grace period holds no sample above.
So a short spike does nothing, and a pod that dips under its share once per grace period is
still reported. A sample whose GPU could not be read is unknown: it counts neither above nor
under (it neither starts, nor feeds, nor ends an episode). Once an episode is an overrun:

* exactly one Warning Event ``GpusliceShareOverrun`` on the pod, with the figures, and a log
  line; the share's ``gpuslice_share_overrun`` gauge is 1 until the episode ends, and
  ``gpuslice_agent_overruns_total{action}`` counts it;
* where ``overrun.action`` (or the pod's namespace's entry in ``overrun.namespaces``) says
  ``evict``, one call to the Eviction API (``policy/v1``: PodDisruptionBudgets hold). If the API
  refuses (a budget allows no disruption now, HTTP 429), it is asked again once per grace
  period while the episode lasts; once accepted, never again.

Only pods gpuslice placed are evicted: the share must come from a counting record (live,
``bind-phase: bound`` by gpuslice's Binding, naming this node; pods of other schedulers have
no share, their processes are stray). MIG and exclusive shares are only reported: MIG memory is
confined by the hardware, and an exclusive share has the GPU to itself.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

from scheduler.core import modes
from scheduler.core.errors import GpusliceError

from .cluster import NodeCluster, ObjectRef
from .config import OverrunSettings
from .sampling import Sample, ShareUse

log = logging.getLogger("gpuslice.agent.guard")

REPORTED, EVICTED, EVICTION_FAILED = "reported", "evicted", "eviction_failed"


@dataclass(slots=True)
class _Episode:
    since: float
    reported: bool = False
    evicted: bool = False
    next_try: float = 0.0
    samples: list[tuple[float, bool]] = field(default_factory=list)  # (time, above) within the grace period

    def keep(self, now: float, grace: float, above: bool) -> None:
        self.samples.append((now, above))
        self.samples = [(t, a) for t, a in self.samples if now - t <= grace]

    def mostly_above(self) -> bool:
        return 2 * sum(1 for _, a in self.samples if a) >= len(self.samples)

    def any_above(self) -> bool:
        return any(a for _, a in self.samples)


class Guard:
    def __init__(self, settings: OverrunSettings, cluster: NodeCluster) -> None:
        self._settings = settings
        self._cluster = cluster
        self._episodes: dict[tuple[str, int], _Episode] = {}
        self.actions: Counter[str] = Counter()  # REPORTED / EVICTED / EVICTION_FAILED, since start
        self.evictions: list[str] = []  # pods whose eviction the API accepted (namespace/name)

    def overrunning(self) -> set[tuple[str, int]]:
        """(pod UID, GPU index) of the shares above their memory for longer than the grace period."""
        return {key for key, episode in self._episodes.items() if episode.reported}

    def observe(self, sample: Sample, now: float) -> None:
        """Compare every share of ``sample`` with its allocation at ``now`` (monotonic seconds).
        A share in the sample comes from a counting record (see :mod:`scheduler.agent.sampling`):
        the pod was bound by gpuslice; the Eviction names its UID, so a pod replaced since is safe."""
        seen = set()
        grace = self._settings.grace_s
        for share in sample.shares:
            seen.add(share.key)
            if not share.measured:
                continue  # unknown: neither above nor under
            above = share.used_memory_mib > share.allocated_memory_mib + self._settings.tolerance_mib
            episode = self._episodes.get(share.key)
            if episode is None:
                if not above:
                    continue
                episode = self._episodes[share.key] = _Episode(now)
            episode.keep(now, grace, above)
            if not episode.any_above():
                del self._episodes[share.key]  # a whole grace period within its share: the episode is over
                continue
            if now - episode.since < grace or not episode.mostly_above():
                continue
            if not episode.reported:
                episode.reported = True
                self._report(share, now - episode.since)
            if self._wants_eviction(share) and not episode.evicted and now >= episode.next_try:
                episode.evicted = self._evict(share, now - episode.since)
                episode.next_try = now + grace
        for key in set(self._episodes) - seen:
            del self._episodes[key]  # the share is gone

    def _action(self, share: ShareUse) -> str:
        if modes.of(share.mode).isolated:
            return f"report only ({share.mode} shares are isolated)"
        action = self._settings.action_for(share.namespace)
        return "evict" if action == "evict" else "report only"

    def _wants_eviction(self, share: ShareUse) -> bool:
        return not modes.of(share.mode).isolated and self._settings.action_for(share.namespace) == "evict"

    def _figures(self, share: ShareUse, seconds: float) -> str:
        pids = ", ".join(
            f"{p.pid}{'/' + p.container if p.container else ''} {p.memory_mib} MiB" for p in share.processes
        )
        return (
            f"pod {share.pod} uses {share.used_memory_mib} MiB on GPU {share.gpu_index} ({share.gpu_uuid}, "
            f"{share.mode}), above its share of {share.allocated_memory_mib} MiB, for {seconds:.0f}s "
            f"(grace {self._settings.grace_s:g}s, tolerance {self._settings.tolerance_mib} MiB; processes: {pids})"
        )

    def _report(self, share: ShareUse, seconds: float) -> None:
        message = f"{self._figures(share, seconds)}; action: {self._action(share)}"
        log.warning("overrun: %s", message)
        self.actions[REPORTED] += 1
        self._cluster.event(
            ObjectRef("Pod", share.name, share.namespace, share.uid), "Warning", "GpusliceShareOverrun", message
        )

    def _evict(self, share: ShareUse, seconds: float) -> bool:
        try:
            self._cluster.evict(ObjectRef("Pod", share.name, share.namespace, share.uid))
        except GpusliceError as exc:
            self.actions[EVICTION_FAILED] += 1
            log.warning(
                "eviction of %s refused (%s); asking again in %gs: %s",
                share.pod,
                exc,
                self._settings.grace_s,
                self._figures(share, seconds),
            )
            return False
        self.actions[EVICTED] += 1
        self.evictions.append(share.pod)
        log.warning("evicted %s through the Eviction API: %s", share.pod, self._figures(share, seconds))
        return True
