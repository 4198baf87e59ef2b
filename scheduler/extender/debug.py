"""What ``/debug/nodes`` shows and ``gpuslice inspect`` prints: each device's shares and free capacity."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from scheduler.core.state import NodeState


@dataclass(frozen=True, slots=True)
class DeviceRow:
    index: int
    uuid: str
    model: str
    mode: str
    memory_mib: int
    memory_allocated_mib: int
    memory_free_mib: int
    compute_allocated_milli: int
    compute_free_milli: int
    free_milli: int  # the core's free share (what policies see)
    shares: int
    detail: str  # MIG slots in use, MPS clients, time-slicing replicas, or why the GPU is unhealthy
    healthy: bool
    unhealthy_reason: str = ""


def device_rows(state: NodeState) -> list[DeviceRow]:
    node = state.node
    rows = []
    for device, usage, left in zip(node.devices, state.usage, state.free(), strict=True):
        rows.append(
            DeviceRow(
                device.index,
                device.uuid,
                device.model.name,
                device.mode.value,
                device.memory_mib,
                usage.memory_mib,
                left.memory_mib,
                usage.compute_milli,
                left.compute_milli,
                left.milli,
                usage.shares,
                left.detail if device.healthy else f"unhealthy: {device.unhealthy_reason}",
                device.healthy,
                device.unhealthy_reason,
            )
        )
    return rows


def describe(
    name: str,
    state: NodeState | None,
    problem: str = "",
    errors: Mapping[str, str] | None = None,
    inflight: Iterable[str] = (),
) -> dict[str, Any]:
    """One node as JSON: capacity, pods with their shares, devices, rejected records."""
    out: dict[str, Any] = {"name": name, "usable": state is not None and not problem, "problem": problem or None}
    if state is not None:
        node = state.node
        out["cpuMilli"] = {"allocatable": node.cpu_milli, "allocated": state.cpu_milli}
        out["memoryMiB"] = {"allocatable": node.memory_mib, "allocated": state.memory_mib}
        out["oversubscriptionPct"] = {
            "mpsCompute": node.mps_compute_oversub_pct,
            "timeSlicingMemory": node.ts_memory_oversub_pct,
        }
        pending = set(inflight)
        out["pods"] = [
            {
                "pod": pod,
                "inFlight": pod in pending,
                "cpuMilli": alloc.cpu_milli,
                "memoryMiB": alloc.memory_mib,
                "shares": [
                    {
                        "index": s.index,
                        "uuid": s.uuid,
                        "mode": s.mode.value,
                        "memoryMiB": s.memory_mib,
                        "computeMilli": s.compute_milli,
                        "mig": None if s.mig is None else f"{s.mig.profile}@{s.mig.start}",
                    }
                    for s in alloc.shares
                ],
            }
            for pod, alloc in state.pods
        ]
        out["devices"] = [_camel(asdict(row)) for row in device_rows(state)]
    out["recordErrors"] = dict(errors or {})
    return out


def _camel(row: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in row.items():
        head, *rest = key.split("_")
        name = head + "".join(p.capitalize() for p in rest)
        out[name.replace("Mib", "MiB")] = value
    return out
