"""The one seam between the node agent and the GPUs: what it reads of them and what it does to them.

Two implementations: :mod:`scheduler.agent.nvml` (the real one, on nvidia-ml-py) and
:mod:`scheduler.agent.fake` (in memory, from a small YAML file), so the whole agent runs and
is tested with no GPU. Nothing else in the agent touches a GPU.

The seam never changes MIG mode and has no call that could: the agent must not (MIG mode changes
only with the GPU idle, and often needs a reset; docs/node-agent.md).
Processes carry host PIDs, used memory and, where NVML samples it, SM utilisation, per GPU
and MIG instance: what measuring each share's use rests on (:mod:`scheduler.agent.sampling`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from scheduler.core.errors import GpusliceError

# XIDs that are the application's fault, not the GPU's (the NVIDIA device plugin skips the
# same ones): a graphics engine exception, an MMU fault, a reset channel, a preemptive
# cleanup, a video processor exception, an FBHUB interrupt. Every other XID is fatal here.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})

XID_TEXT = {
    48: "double-bit ECC error",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}


class GpuError(GpusliceError):
    """A GPU call failed (NVML error, no such device, a MIG slot that is not free)."""


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One physical GPU as the driver reports it."""

    uuid: str
    index: int
    name: str  # the product name, such as "NVIDIA H100 80GB HBM3"
    memory_mib: int
    sm_count: int
    mig_enabled: bool  # the current MIG mode


@dataclass(frozen=True, slots=True)
class MigInfo:
    """A GPU instance with its compute instance: its placement and the UUID that names it."""

    gpu_uuid: str
    uuid: str  # MIG-...
    compute_slices: int
    memory_slots: int
    start: int  # first memory slot of its placement


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """A compute process on a GPU (``instance_uuid`` set when it runs in a MIG instance).

    ``sm_percent`` is the share of the GPU's SMs the process kept busy over NVML's last
    sampling window, 0..100; None where NVML gives no per-process utilisation (MIG
    instances, GPUs or drivers that do not support it)."""

    pid: int  # host PID: the agent runs in the host PID namespace
    used_memory_mib: int
    gpu_uuid: str
    instance_uuid: str = ""
    sm_percent: int | None = None


@dataclass(frozen=True, slots=True)
class HealthEvent:
    """A fatal XID, or a GPU that no longer answers (``xid`` 0)."""

    gpu_uuid: str
    xid: int
    description: str

    @property
    def reason(self) -> str:
        if self.xid == 0:
            return self.description
        text = self.description or XID_TEXT.get(self.xid, "fatal error")
        return f"XID {self.xid}: {text}"


def fatal(xid: int) -> bool:
    """Whether an XID means the GPU itself is broken (not an application fault)."""
    return xid not in APPLICATION_XIDS


class Gpus(Protocol):
    def devices(self) -> tuple[GpuInfo, ...]:
        """Every GPU of the node, by index."""

    def mig_instances(self, gpu_uuid: str) -> tuple[MigInfo, ...]:
        """The GPU's MIG instances (none when MIG mode is off)."""

    def create_mig(self, gpu_uuid: str, compute_slices: int, memory_slots: int, start: int) -> MigInfo:
        """A GPU instance of that shape at exactly ``start``, with one compute instance over all
        its slices; GpuError if the slot is not free or MIG mode is off."""

    def destroy_mig(self, gpu_uuid: str, uuid: str) -> None:
        """Destroy the instance (its compute instances first); GpuError if it is busy or gone."""

    def processes(self, gpu_uuid: str) -> tuple[ProcessInfo, ...]:
        """Compute processes on the GPU and its MIG instances, with host PIDs, used memory and
        SM utilisation where NVML samples it."""

    def nvlink_peers(self, gpu_uuid: str) -> tuple[str, ...]:
        """UUIDs of the GPUs linked to this one by an active NVLink."""

    def health_events(self) -> tuple[HealthEvent, ...]:
        """Fatal events since the last call (never blocks)."""

    def close(self) -> None: ...
