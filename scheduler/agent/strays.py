"""Stray GPU use reported on the Node: a Warning Event, rate-limited.

A stray process (see :mod:`scheduler.agent.sampling`) is reported once it has been seen for
``measure.strayGraceSeconds`` without a break (a process outliving its pod by a moment is not
news), and then again for the same GPU and owner at most every ``measure.strayEventSeconds``;
at most :data:`MAX_PER_ROUND` Events go out per round. Its memory reaches the extender at
once, whatever the Events do: through the inventory's ``strayMemoryMiB``.
"""

from __future__ import annotations

import logging

from .cluster import NodeCluster, ObjectRef
from .config import MeasureSettings
from .sampling import Sample

log = logging.getLogger("gpuslice.agent.stray")

MAX_PER_ROUND = 5
REASON = "GpusliceStrayProcess"


class StrayReports:
    def __init__(self, settings: MeasureSettings, cluster: NodeCluster, node: str) -> None:
        self._settings = settings
        self._cluster = cluster
        self._node = node
        self._since: dict[tuple[str, int], float] = {}  # (GPU UUID, PID) -> first seen, without a break
        self._last: dict[tuple[str, str], float] = {}  # (GPU UUID, owner) -> last Event
        self.reported = 0  # Events sent since start

    def observe(self, sample: Sample, now: float) -> None:
        seen = set()
        sent = 0
        for stray in sorted(sample.strays, key=lambda s: (-s.memory_mib, s.gpu_index, s.pid)):
            key = (stray.gpu_uuid, stray.pid)
            seen.add(key)
            since = self._since.setdefault(key, now)
            if now - since < self._settings.stray_grace_s:
                continue
            owner = (stray.gpu_uuid, stray.who)
            last = self._last.get(owner)
            if (last is not None and now - last < self._settings.stray_event_s) or sent >= MAX_PER_ROUND:
                continue
            self._last[owner] = now
            sent += 1
            self.reported += 1
            where = f" in MIG instance {stray.instance_uuid}" if stray.instance_uuid else ""
            message = (
                f"GPU {stray.gpu_index} ({stray.gpu_uuid}){where}: PID {stray.pid} holds {stray.memory_mib} MiB "
                f"that no gpuslice allocation record on this GPU accounts for: {stray.why}"
            )
            log.warning("stray GPU use: %s", message)
            self._cluster.event(ObjectRef("Node", self._node), "Warning", REASON, message)
        for key in set(self._since) - seen:
            del self._since[key]
        horizon = now - self._settings.stray_event_s
        for owner in [o for o, at in self._last.items() if at < horizon]:
            del self._last[owner]  # bounded: owners not reported within the interval are forgotten
