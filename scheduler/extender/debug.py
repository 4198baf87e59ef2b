"""What ``/debug/nodes`` shows and ``gpuslice inspect`` prints: each device's shares and free capacity,
and, where the node agent measures them, each share's used memory and compute and the stray
processes (from the Node's usage annotation: :mod:`scheduler.core.measured`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from scheduler.core.allocation import DeviceShare
from scheduler.core.errors import InventoryError
from scheduler.core.measured import Measured, parse_usage
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
    stray_memory_mib: int = 0  # held by processes no record accounts for (the node agent measures it)


def share_json(share: DeviceShare) -> dict[str, Any]:
    """One share of an allocation as /debug shows it."""
    return {
        "index": share.index,
        "uuid": share.uuid,
        "mode": share.mode.value,
        "memoryMiB": share.memory_mib,
        "computeMilli": share.compute_milli,
        "mig": None if share.mig is None else f"{share.mig.profile}@{share.mig.start}",
    }


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
                device.stray_memory_mib,
            )
        )
    return rows


def describe(
    name: str,
    state: NodeState | None,
    problem: str = "",
    errors: Mapping[str, str] | None = None,
    inflight: Iterable[str] = (),
    usage: str = "",
) -> dict[str, Any]:
    """One node as JSON: capacity, pods with their shares (with measured use, where the node
    agent publishes it), devices, stray processes, rejected records."""
    if state is None and not problem:
        problem = "no Node object of that name: only pods bound to it name it"
    out: dict[str, Any] = {"name": name, "usable": state is not None and not problem, "problem": problem or None}
    measured, out["measured"] = _measured(name, usage)
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
                "shares": [{**share_json(s), **_used(measured, pod, s.index)} for s in alloc.shares],
            }
            for pod, alloc in state.pods
        ]
        out["devices"] = [_camel(asdict(row)) for row in device_rows(state)]
    out["recordErrors"] = dict(errors or {})
    return out


def _measured(name: str, usage: str) -> tuple[Measured | None, dict[str, Any] | None]:
    """The usage annotation, and what ``/debug/nodes`` shows of it besides the shares: when it
    was measured and the stray processes (None without an agent; a bad annotation is shown, and
    changes nothing else)."""
    if not usage:
        return None, None
    try:
        measured = parse_usage(name, usage)
    except InventoryError as exc:
        return None, {"problem": str(exc)}
    stray = [{"index": s.index, "pid": s.pid, "memoryMiB": s.memory_mib, "why": s.why} for s in measured.stray]
    return measured, {"at": measured.at, "stray": stray, "strayOmitted": measured.stray_omitted}


def _used(measured: Measured | None, pod: str, index: int) -> dict[str, Any]:
    """A share's measured figures: ``usedMiB``, ``usedComputeMilli`` (None where not sampled),
    ``overrun``; nothing without an agent's figures for the pod."""
    found = next((m for m in measured.pods.get(pod, ()) if m.index == index), None) if measured else None
    if found is None:
        return {}
    return {"usedMiB": found.used_memory_mib, "usedComputeMilli": found.used_compute_milli, "overrun": found.overrun}


def _camel(row: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in row.items():
        head, *rest = key.split("_")
        name = head + "".join(p.capitalize() for p in rest)
        out[name.replace("Mib", "MiB")] = value
    return out
