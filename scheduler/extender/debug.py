"""What ``/debug/nodes`` shows and ``gpuslice inspect`` prints: each device's shares and free capacity."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from scheduler.core.capacity import free_milli
from scheduler.core.inventory import Device, Node, SharingMode
from scheduler.core.request import MILLI
from scheduler.core.state import DeviceUsage, NodeState


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
    detail: str  # MIG slots in use, MPS clients, time-slicing replicas; UNHEALTHY first if so
    unhealthy: str = ""  # why the node agent marked the GPU unhealthy ("" if healthy)


def _free(node: Node, device: Device, usage: DeviceUsage) -> tuple[int, int, str]:
    """(free memory MiB, free compute milli, detail) of one device, by its mode's rules."""
    mode = device.mode
    if mode is SharingMode.EXCLUSIVE:
        busy = usage.shares > 0
        return (0, 0, "in use") if busy else (device.memory_mib, MILLI, "free")
    if mode is SharingMode.MIG:
        layout = device.model.mig
        if layout is None:
            return 0, 0, "no MIG layout"
        used = ", ".join(f"{s.profile}@{s.start}" for s in usage.mig) or "none"
        if device.mig_static:
            taken = {(s.profile, s.start) for s in usage.mig}
            free = [i for i in device.mig_instances if (i.profile.name, i.start) not in taken]
            mem = sum(i.profile.memory_mib for i in free)
            slices = sum(i.profile.compute_slices for i in free)
            return mem, slices * MILLI // layout.compute_slices, f"static; used {used}"
        slots = layout.memory_slots - sum(s.size for s in usage.mig)
        slices = layout.compute_slices - sum(s.slices for s in usage.mig)
        return (
            slots * device.memory_mib // layout.memory_slots,
            slices * MILLI // layout.compute_slices,
            f"dynamic; used {used}",
        )
    if mode is SharingMode.MPS:
        cap = MILLI * node.mps_compute_oversub_pct // 100
        full = usage.shares >= device.mps_client_limit
        return (
            0 if full else max(0, device.memory_mib - usage.memory_mib),
            0 if full else max(0, cap - usage.compute_milli),
            f"{usage.shares}/{device.mps_client_limit} clients",
        )
    cap = device.memory_mib * node.ts_memory_oversub_pct // 100
    full = usage.shares >= device.replicas
    return (
        0 if full else max(0, cap - usage.memory_mib),
        0 if full else max(0, MILLI - usage.compute_milli),
        f"{usage.shares}/{device.replicas} replicas",
    )


def device_rows(state: NodeState) -> list[DeviceRow]:
    node = state.node
    rows = []
    for device, usage in zip(node.devices, state.usage, strict=True):
        mem_free, compute_free, detail = _free(node, device, usage)
        if device.unhealthy:
            detail = f"UNHEALTHY ({device.unhealthy}); {detail}"
        rows.append(
            DeviceRow(
                device.index,
                device.uuid,
                device.model.name,
                device.mode.value,
                device.memory_mib,
                usage.memory_mib,
                mem_free,
                usage.compute_milli,
                compute_free,
                free_milli(device, usage),
                usage.shares,
                detail,
                device.unhealthy,
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
