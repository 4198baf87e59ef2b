"""MPS: processes share the GPU side by side under NVIDIA's Multi-Process Service.

The sum of memory is at most the GPU's, the sum of compute at most 100 percent (times the
node's ``mps_compute_oversub_pct``), and the clients at most the GPU's MPS client limit. The
node agent runs one MPS control daemon per GPU and hands its pipe directory to the pod (the
daemon enforces the caps), and the admission webhook gives such pods the MPS environment.
The rules themselves are :mod:`.shared`'s.
"""

from __future__ import annotations

from ..inventory import Device, Node, SharingMode
from ..request import MILLI
from .base import DeviceUsage
from .shared import SharedMode


class Mps(SharedMode):
    name = SharingMode.MPS
    summary = "shares of memory and compute side by side, capped by an MPS control daemon"
    control_daemon = True
    divides_compute = True

    def caps(self, node: Node, device: Device) -> tuple[int, int, int]:
        return device.memory_mib, MILLI * node.mps_compute_oversub_pct // 100, device.mps_client_limit

    def no_client(self, device: Device) -> str:
        return f"GPU {device.index} has reached its MPS client limit of {device.mps_client_limit}"

    def detail(self, device: Device, usage: DeviceUsage) -> str:
        return f"{usage.shares}/{device.mps_client_limit} clients{self.note(device)}"
