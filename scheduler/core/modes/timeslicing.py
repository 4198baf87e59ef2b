"""Time-slicing: processes take turns on the whole GPU; compute is interleaved, not divided.

Replicas are at most the GPU's replica count, and the sum of memory at most the GPU's (times
the node's ``ts_memory_oversub_pct``). Nothing on the GPU enforces a share's memory: the node
agent's overrun guard may evict a pod above its share. The rules themselves are
:mod:`.shared`'s.
"""

from __future__ import annotations

from ..inventory import Device, Node, SharingMode
from .base import DeviceUsage
from .shared import NO_CAP, SharedMode


class TimeSlicing(SharedMode):
    name = SharingMode.TIME_SLICING
    summary = "replicas taking turns on the GPU, memory divided, compute interleaved"

    def caps(self, node: Node, device: Device) -> tuple[int, int, int]:
        return device.memory_mib * node.ts_memory_oversub_pct // 100, NO_CAP, device.replicas

    def no_client(self, device: Device) -> str:
        return f"GPU {device.index} has no free time-slicing replica (of {device.replicas})"

    def detail(self, device: Device, usage: DeviceUsage) -> str:
        return f"{usage.shares}/{device.replicas} replicas{self.note(device)}"
