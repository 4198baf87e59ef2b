"""A node's state: inventory plus what is allocated, immutable.

``apply`` returns a new state and ``release`` undoes it exactly. ``apply`` checks the
capacity model (:mod:`capacity`), so a record that would over-allocate is refused,
whatever its source; a GPU that turned unhealthy keeps the records it already holds.
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import dataclass, field, replace

from . import mig
from .allocation import Allocation, decode_record
from .capacity import EMPTY, DeviceUsage, Free, add_share, free, gap_level, refusal, remove_share
from .errors import RecordError
from .inventory import Device, Node


def taken_usage(device: Device) -> DeviceUsage:
    """What a GPU holds before any allocation: nothing, or the MIG instances made by hand."""
    if not device.mig_taken:
        return EMPTY
    return DeviceUsage(mig=tuple(sorted(mig.slot_of(i.profile, i.start) for i in device.mig_taken)))


@dataclass(frozen=True, slots=True)
class NodeState:
    node: Node
    usage: tuple[DeviceUsage, ...]
    cpu_milli: int = 0
    memory_mib: int = 0
    pods: tuple[tuple[str, Allocation], ...] = ()
    # What is left on each GPU: derived from the fields above when the state is made (a
    # state never changes), because nearly every question about a node reads it. ``apply`` and
    # ``release`` hand over the GPUs they did not touch; any other maker leaves it empty.
    frees: tuple[Free, ...] = field(default=(), compare=False, hash=False, repr=False)
    # Their sum, in milli-GPU (see :meth:`free_milli`): every policy that weighs a node's free
    # GPU asks it of every candidate.
    free_total: int = field(default=0, init=False, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        node = self.node
        if len(self.frees) != len(node.devices):
            object.__setattr__(
                self, "frees", tuple(free(node, d, u) for d, u in zip(node.devices, self.usage, strict=True))
            )
        object.__setattr__(self, "free_total", sum(f.milli for f in self.frees))

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

    def _frees_after(self, usage: list[DeviceUsage], alloc: Allocation) -> tuple[Free, ...]:
        """The GPUs' free capacity once ``usage`` replaces this state's on the GPUs ``alloc`` takes."""
        frees = list(self.frees)
        node = self.node
        for share in alloc.shares:
            frees[share.index] = free(node, node.devices[share.index], usage[share.index])
        return tuple(frees)

    def free(self) -> tuple[Free, ...]:
        """What is left on each GPU (see :func:`~scheduler.core.capacity.free`)."""
        return self.frees

    def free_milli(self) -> int:
        """The node's free share summed over its GPUs, in milli-GPU."""
        return self.free_total

    def gap_levels(self) -> list[int]:
        """Each GPU's free share as a gap level (0: full or unusable, 100: idle)."""
        return [gap_level(f.milli) for f in self.frees]

    def free_after(self, alloc: Allocation) -> int:
        """Free milli-GPU left on the GPUs ``alloc`` takes once it is placed (for tightest fit)."""
        node = self.node
        total = 0
        for share in alloc.shares:
            device = node.devices[share.index]
            total += free(node, device, add_share(device, self.usage[share.index], share)).milli
        return total

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
            problem = refusal(self.node, device, usage[share.index], share)
            if problem is not None:
                raise RecordError(pod, f"conflicts on node {self.node.name}: {problem.text}")
            usage[share.index] = add_share(device, usage[share.index], share)
        if self.cpu_milli + alloc.cpu_milli > self.node.cpu_milli:
            raise RecordError(pod, f"needs {alloc.cpu_milli} milli-CPU, {self.cpu_free} free")
        if self.memory_mib + alloc.memory_mib > self.node.memory_mib:
            raise RecordError(pod, f"needs {alloc.memory_mib} MiB of memory, {self.memory_free} free")
        pods = tuple(sorted((*self.pods, (pod, alloc)), key=lambda kv: kv[0]))
        return replace(
            self,
            frees=self._frees_after(usage, alloc),
            usage=tuple(usage),
            cpu_milli=self.cpu_milli + alloc.cpu_milli,
            memory_mib=self.memory_mib + alloc.memory_mib,
            pods=pods,
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
            frees=self._frees_after(usage, alloc),
            usage=tuple(usage),
            cpu_milli=self.cpu_milli - alloc.cpu_milli,
            memory_mib=self.memory_mib - alloc.memory_mib,
            pods=pods,
        )


def rebuild(
    node: Node, records: Iterable[tuple[str, str]], vouched: Container[str] = frozenset()
) -> tuple[NodeState, list[RecordError]]:
    """A node's state from its inventory and its pods' ``(pod, record)`` annotations.

    The records of the pods in ``vouched`` (those gpuslice itself bound, as the caller knows
    them) are applied first, then every other; each group in pod-name order, so the result
    does not depend on listing order, and a record anyone could have written never displaces
    one gpuslice wrote. A record that does not decode or conflicts is reported, never applied
    and never silently dropped: the caller decides what to do with the pod.
    """
    state = NodeState.empty(node)
    problems: list[RecordError] = []
    for pod, text in sorted(records, key=lambda kv: (kv[0] not in vouched, kv)):
        try:
            state = state.apply(pod, decode_record(text, pod))
        except RecordError as exc:
            problems.append(exc)
    return state, problems
