"""What a node has: its devices (each in one sharing mode), CPU, memory and NVLink topology."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .catalog import GpuModel, MigProfile


class SharingMode(StrEnum):
    EXCLUSIVE = "exclusive"
    MPS = "mps"
    TIME_SLICING = "time-slicing"
    MIG = "mig"


DEFAULT_MPS_CLIENTS = 48

_KINDS: dict[tuple[Any, ...], int] = {}


def kind_id(kind: tuple[Any, ...]) -> int:
    """A small int for a device or node kind: kinds are compared and hashed on every fit
    question, and an int hashes at once where a nested tuple is hashed anew each time. The
    kinds of a cluster are few (models x modes x settings), so the table stays small."""
    found = _KINDS.get(kind)
    if found is None:
        found = _KINDS[kind] = len(_KINDS)
    return found


@dataclass(frozen=True, slots=True)
class MigInstance:
    """A pre-created MIG instance of a static geometry."""

    profile: MigProfile
    start: int
    uuid: str = ""


@dataclass(frozen=True, slots=True)
class Device:
    """One GPU.

    ``mig_instances`` non-empty means a static MIG geometry; an empty tuple on a MIG
    device means dynamic MIG, restricted to ``mig_allowed`` (empty: every profile of
    the model's layout). An unhealthy GPU (a fatal XID, fallen off the bus: the node agent
    reports it) keeps its shares but takes nothing new; ``unhealthy_reason`` says why.
    On a dynamic-MIG GPU, ``mig_taken`` are instances the node agent found but did not
    create (made by hand): their slots are occupied for good; ``mig_managed`` are those it
    created for allocation records, listed for people and for the agent's own restart (the
    records count those slots, so the capacity model ignores this list).
    ``stray_memory_mib`` is GPU memory held by processes that no allocation record on the GPU
    accounts for (another scheduler's pod, an image with ``NVIDIA_VISIBLE_DEVICES=all``, a
    host process), as the node agent measured it: new shares must fit beside it (see
    :func:`~scheduler.core.capacity.stray_refusal`).
    """

    uuid: str
    index: int
    model: GpuModel
    mode: SharingMode = SharingMode.EXCLUSIVE
    mps_client_limit: int = DEFAULT_MPS_CLIENTS
    replicas: int = 1
    mig_instances: tuple[MigInstance, ...] = ()
    mig_allowed: tuple[str, ...] = ()
    healthy: bool = True
    unhealthy_reason: str = ""
    mig_taken: tuple[MigInstance, ...] = ()
    mig_managed: tuple[MigInstance, ...] = ()
    stray_memory_mib: int = 0
    # What makes two GPUs interchangeable for the capacity model, apart from their usage (not
    # their UUIDs), as a small int (see kind_id): worked out once, since every fit question reads it.
    kind: int = field(init=False, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        kind = (
            self.model.name,
            self.model.memory_mib,
            self.mode,
            self.mps_client_limit,
            self.replicas,
            tuple((i.profile.name, i.start) for i in self.mig_instances),
            self.mig_allowed,
            self.healthy,
            self.unhealthy_reason,  # what a refusal of the GPU says
            tuple((i.profile.name, i.start) for i in self.mig_taken),
            self.stray_memory_mib,
        )
        object.__setattr__(self, "kind", kind_id(kind))

    @property
    def memory_mib(self) -> int:
        return self.model.memory_mib

    @property
    def mig_static(self) -> bool:
        return bool(self.mig_instances)

    def allowed_profiles(self) -> tuple[MigProfile, ...]:
        layout = self.model.mig
        if self.mode is not SharingMode.MIG or layout is None:
            return ()
        if self.mig_static:
            seen: dict[str, MigProfile] = {}
            for inst in self.mig_instances:
                seen.setdefault(inst.profile.name, inst.profile)
            return tuple(seen.values())
        if not self.mig_allowed:
            return layout.profiles
        allowed = {a.lower() for a in self.mig_allowed}
        return tuple(p for p in layout.profiles if p.name in allowed)


@dataclass(frozen=True, slots=True)
class Node:
    """A node as the core sees it. Oversubscription is in percent (100 = none)."""

    name: str
    cpu_milli: int
    memory_mib: int
    devices: tuple[Device, ...] = ()
    max_pods: int = 110
    nvlink: frozenset[tuple[int, int]] = field(default_factory=frozenset)
    mps_compute_oversub_pct: int = 100
    ts_memory_oversub_pct: int = 100
    # What makes two nodes alike, apart from their names, GPU UUIDs and usage: worked out once.
    kind: int = field(init=False, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        kind = (
            self.cpu_milli,
            self.memory_mib,
            self.max_pods,
            self.nvlink,
            self.mps_compute_oversub_pct,
            self.ts_memory_oversub_pct,
            ("node", *(d.kind for d in self.devices)),
        )
        object.__setattr__(self, "kind", kind_id(kind))

    def linked(self, a: int, b: int) -> bool:
        return (a, b) in self.nvlink or (b, a) in self.nvlink
