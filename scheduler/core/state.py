"""A node's state: inventory plus what is allocated, immutable; one capacity model per mode.

``apply`` returns a new state and ``release`` undoes it exactly. Both check the
capacity rules, so a record that would over-allocate is refused, whatever its source.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from . import mig
from .allocation import Allocation, DeviceShare, MigSlot, decode_record
from .errors import RecordError
from .inventory import Device, Node, SharingMode
from .request import MILLI


@dataclass(frozen=True, slots=True)
class DeviceUsage:
    memory_mib: int = 0
    compute_milli: int = 0
    shares: int = 0
    whole: bool = False
    mig: tuple[MigSlot, ...] = ()


EMPTY = DeviceUsage()


def taken_usage(device: Device) -> DeviceUsage:
    """What a GPU holds before any allocation: nothing, or its MIG instances made by hand."""
    if not device.mig_taken:
        return EMPTY
    return DeviceUsage(mig=tuple(sorted(mig.slot_of(i.profile, i.start) for i in device.mig_taken)))


def device_kind(device: Device) -> tuple[Any, ...]:
    """What makes two GPUs interchangeable for the capacity model, apart from their usage."""
    return (
        device.model.name,
        device.model.memory_mib,
        device.mode,
        device.mps_client_limit,
        device.replicas,
        device.mig_instances,
        device.mig_allowed,
        device.mig_taken,
        device.unhealthy,
    )


def device_key(node: Node, device: Device, usage: DeviceUsage) -> tuple[Any, ...]:
    """Everything the capacity model reads of one GPU (its kind, its usage, the node's
    oversubscription): GPUs with equal keys answer every fit question alike."""
    return (*device_kind(device), node.mps_compute_oversub_pct, node.ts_memory_oversub_pct, usage)


def is_whole(device: Device, share: DeviceShare) -> bool:
    return share.mig is None and share.memory_mib >= device.memory_mib and share.compute_milli >= MILLI


def why_not(node: Node, device: Device, usage: DeviceUsage, share: DeviceShare) -> str | None:
    """None if ``share`` fits on ``device`` beside ``usage``; else the rule it breaks.

    This is the one capacity model: fit builds candidate shares and asks it, apply
    and record rebuilding ask it again.
    """
    if share.mode is not device.mode:
        return f"GPU {device.index} is in mode {device.mode}, not {share.mode}"
    if share.memory_mib < 0 or share.compute_milli < 0:
        return "negative share"
    if share.memory_mib > device.memory_mib or share.compute_milli > MILLI:
        return (
            f"needs {share.memory_mib} MiB and {share.compute_milli / 10:g}% compute on one GPU, "
            f"GPU {device.index} has {device.memory_mib} MiB"
        )
    mode = device.mode
    if mode is SharingMode.MIG:
        layout = device.model.mig
        if share.mig is None or layout is None:
            return f"GPU {device.index} has no MIG layout"
        profile = next((p for p in device.allowed_profiles() if p.name == share.mig.profile), None)
        if profile is None or (profile.memory_slots, profile.compute_slices) != (share.mig.size, share.mig.slices):
            return f"profile {share.mig.profile} is not allowed on GPU {device.index}"
        if device.mig_static and not any(
            inst.profile.name == profile.name and inst.start == share.mig.start for inst in device.mig_instances
        ):
            return f"GPU {device.index} has no pre-created {profile.name} at slot {share.mig.start}"
        return mig.why_not(layout, usage.mig, profile, share.mig.start)
    if share.mig is not None:
        return f"GPU {device.index} is not in MIG mode"
    if usage.whole or (usage.shares and (mode is SharingMode.EXCLUSIVE or is_whole(device, share))):
        return f"GPU {device.index} is not free"
    if mode is SharingMode.EXCLUSIVE:
        return None if is_whole(device, share) else f"GPU {device.index} is exclusive: whole GPU only"
    if mode is SharingMode.MPS:
        if usage.shares >= device.mps_client_limit:
            return f"GPU {device.index} has reached its MPS client limit of {device.mps_client_limit}"
        cap = MILLI * node.mps_compute_oversub_pct // 100
        if usage.compute_milli + share.compute_milli > cap:
            return (
                f"needs {share.compute_milli / 10:g}% compute on one GPU, "
                f"free {max(0, cap - usage.compute_milli) / 10:g}%"
            )
        mem_cap = device.memory_mib
    else:
        if usage.shares >= device.replicas:
            return f"GPU {device.index} has no free time-slicing replica (of {device.replicas})"
        mem_cap = device.memory_mib * node.ts_memory_oversub_pct // 100
    if usage.memory_mib + share.memory_mib > mem_cap:
        return f"needs {share.memory_mib} MiB on one GPU, free {max(0, mem_cap - usage.memory_mib)} MiB"
    return None


def add_share(device: Device, usage: DeviceUsage, share: DeviceShare) -> DeviceUsage:
    return DeviceUsage(
        usage.memory_mib + share.memory_mib,
        usage.compute_milli + share.compute_milli,
        usage.shares + 1,
        usage.whole or device.mode is SharingMode.EXCLUSIVE or is_whole(device, share),
        usage.mig if share.mig is None else tuple(sorted((*usage.mig, share.mig))),
    )


def remove_share(usage: DeviceUsage, share: DeviceShare) -> DeviceUsage:
    migs = list(usage.mig)
    if share.mig is not None:
        migs.remove(share.mig)
    return DeviceUsage(
        usage.memory_mib - share.memory_mib,
        usage.compute_milli - share.compute_milli,
        usage.shares - 1,
        usage.whole and usage.shares > 1,  # a whole share is always alone on its GPU
        tuple(migs),
    )


@dataclass(frozen=True, slots=True)
class NodeState:
    node: Node
    usage: tuple[DeviceUsage, ...]
    cpu_milli: int = 0
    memory_mib: int = 0
    pods: tuple[tuple[str, Allocation], ...] = ()
    # Per-state cache for policies and fit; a new state starts with an empty one.
    memo: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False, hash=False)

    @staticmethod
    def empty(node: Node) -> NodeState:
        # A dynamic-MIG GPU's instances made by hand occupy their slots before any record does.
        return NodeState(node, tuple(taken_usage(d) for d in node.devices))

    @property
    def cpu_free(self) -> int:
        return self.node.cpu_milli - self.cpu_milli

    @property
    def memory_free(self) -> int:
        return self.node.memory_mib - self.memory_mib

    def allocation_of(self, pod: str) -> Allocation | None:
        return next((a for k, a in self.pods if k == pod), None)

    def apply(self, pod: str, alloc: Allocation) -> NodeState:
        """A new state with ``alloc`` given to ``pod``; :class:`RecordError` if it does not fit."""
        if alloc.node != self.node.name:
            raise RecordError(pod, f"record is for node {alloc.node!r}, not {self.node.name!r}")
        if any(k == pod for k, _ in self.pods):
            raise RecordError(pod, f"already has an allocation on node {self.node.name}")
        if len(self.pods) >= self.node.max_pods:
            raise RecordError(pod, f"node {self.node.name} already holds its maximum of {self.node.max_pods} pods")
        usage = list(self.usage)
        for share in alloc.shares:
            if not 0 <= share.index < len(self.node.devices):
                raise RecordError(pod, f"GPU index {share.index} does not exist on node {self.node.name}")
            device = self.node.devices[share.index]
            if device.uuid != share.uuid and not (share.mig and device.mig_static):
                raise RecordError(pod, f"GPU {share.index} of node {self.node.name} is {device.uuid}, not {share.uuid}")
            problem = why_not(self.node, device, usage[share.index], share)
            if problem is not None:
                raise RecordError(pod, f"conflicts on node {self.node.name}: {problem}")
            usage[share.index] = add_share(device, usage[share.index], share)
        if self.cpu_milli + alloc.cpu_milli > self.node.cpu_milli:
            raise RecordError(pod, f"needs {alloc.cpu_milli} milli-CPU, {self.cpu_free} free")
        if self.memory_mib + alloc.memory_mib > self.node.memory_mib:
            raise RecordError(pod, f"needs {alloc.memory_mib} MiB of memory, {self.memory_free} free")
        pods = tuple(sorted((*self.pods, (pod, alloc)), key=lambda kv: kv[0]))
        return replace(
            self,
            usage=tuple(usage),
            cpu_milli=self.cpu_milli + alloc.cpu_milli,
            memory_mib=self.memory_mib + alloc.memory_mib,
            pods=pods,
            memo={},
        )

    def release(self, pod: str) -> NodeState:
        """A new state without ``pod``'s allocation (unchanged if it has none)."""
        alloc = self.allocation_of(pod)
        if alloc is None:
            return self
        usage = list(self.usage)
        for share in alloc.shares:
            usage[share.index] = remove_share(usage[share.index], share)
        pods = tuple(kv for kv in self.pods if kv[0] != pod)
        return replace(
            self,
            usage=tuple(usage),
            cpu_milli=self.cpu_milli - alloc.cpu_milli,
            memory_mib=self.memory_mib - alloc.memory_mib,
            pods=pods,
            memo={},
        )


def rebuild(node: Node, records: Iterable[tuple[str, str]]) -> tuple[NodeState, list[RecordError]]:
    """A node's state from its inventory and its pods' ``(pod, record)`` annotations.

    Records are applied in pod-name order, so the result does not depend on listing
    order. A record that does not decode or conflicts is reported, never applied and
    never silently dropped: the caller decides what to do with the pod.
    """
    state = NodeState.empty(node)
    problems: list[RecordError] = []
    for pod, text in sorted(records):
        try:
            state = state.apply(pod, decode_record(text, pod))
        except RecordError as exc:
            problems.append(exc)
    return state, problems
