"""What a sharing mode's module provides, and the types its rules speak.

A mode is one :class:`Mode` instance, registered under its name (:mod:`scheduler.core.modes`).
The capacity model (:mod:`scheduler.core.capacity`) asks the mode of a GPU for the rules of
that GPU; the node agent and the admission webhook read its facts (:attr:`Mode.isolated`,
:attr:`Mode.control_daemon`, :attr:`Mode.counts_stray`) instead of naming modes.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import NamedTuple

from ..allocation import DeviceShare, MigSlot
from ..inventory import Device, Node, SharingMode
from ..request import MILLI, GpuKind, GpuRequest


class DeviceUsage(NamedTuple):
    """What a GPU holds. A named tuple, not a dataclass: it is hashed and compared in every
    fit question, and a tuple does both in C."""

    memory_mib: int = 0
    compute_milli: int = 0
    shares: int = 0
    whole: bool = False
    mig: tuple[MigSlot, ...] = ()


EMPTY = DeviceUsage()


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a share does not fit on one GPU. ``need_mib`` is set when memory is what is short:
    a node's reason then names only the memory asked, not one GPU's free memory.
    ``gpu``: the index of the GPU the text names (-1: none). Answers are kept per GPU state,
    which GPUs at other indices share: :meth:`on` reads one for the GPU at hand."""

    text: str
    free_mib: int
    need_mib: int | None = None
    gpu: int = -1

    def on(self, index: int) -> Refusal:
        """This refusal as GPU ``index`` in the same state gives it (its text names that GPU)."""
        if self.gpu < 0 or self.gpu == index:
            return self
        return Refusal(self.text.replace(f"GPU {self.gpu}", f"GPU {index}", 1), self.free_mib, self.need_mib, index)


@dataclass(frozen=True, slots=True)
class Offer:
    """The share one GPU offers one share of a request, without the GPU's identity (what
    :meth:`Mode.offer` works out; :func:`~scheduler.core.fit.device_share` names the GPU)."""

    memory_mib: int
    compute_milli: int
    mig: MigSlot | None = None
    instance_start: int | None = None  # a static MIG instance: the one at this start


def percent(milli: int) -> str:
    """Compute in milli-GPU as a percentage, written out in words (no ``%``: a refusal's text
    reaches kube-scheduler, which formats some of its messages with Go's ``fmt``)."""
    return f"{milli / 10:g} percent"


def is_whole(device: Device, share: DeviceShare) -> bool:
    return share.mig is None and share.memory_mib >= device.memory_mib and share.compute_milli >= MILLI


def free_mib(device: Device, usage: DeviceUsage) -> int:
    """The GPU's memory its records leave, as a refusal reports it."""
    return max(0, device.memory_mib - usage.memory_mib)


def refused(device: Device, usage: DeviceUsage, text: str, free: int | None = None) -> Refusal:
    """A refusal whose text names ``device`` (``free``: the free memory it reports, the
    GPU's free memory unless given)."""
    return Refusal(text, free_mib(device, usage) if free is None else free, gpu=device.index)


def no_such_share(device: Device, usage: DeviceUsage, memory_mib: int, compute_milli: int) -> Refusal:
    """Why a share of ``memory_mib`` and ``compute_milli`` is no share of ``device`` at all:
    negative, or more than the GPU has."""
    if memory_mib < 0 or compute_milli < 0:
        return refused(device, usage, "negative share")
    return refused(
        device,
        usage,
        f"needs {memory_mib} MiB and {percent(compute_milli)} compute on one GPU, "
        f"GPU {device.index} has {device.memory_mib} MiB",
    )


def is_share_of(device: Device, share: DeviceShare) -> bool:
    """Whether ``share`` is a share of ``device`` at all (neither negative nor more than it has)."""
    m, c = share.memory_mib, share.compute_milli
    return m >= 0 and c >= 0 and m <= device.memory_mib and c <= MILLI


def not_mig(device: Device, usage: DeviceUsage) -> Refusal:
    return refused(device, usage, f"GPU {device.index} is not in MIG mode")


def not_free(device: Device) -> Refusal:
    return Refusal(f"GPU {device.index} is not free", 0, gpu=device.index)


def held(stray: int) -> str:
    return f"{stray} MiB held by processes no allocation record accounts for"


def compute_short_text(need: int) -> str:
    """Why a share asking ``need`` milli-GPU of compute does not fit: what is asked, not what
    is left (see :mod:`scheduler.core.fit`, "Reasons")."""
    return f"needs {percent(need)} compute on one GPU, more than is free"


class Mode:
    """The rules and facts of one sharing mode; a module makes one and registers it.

    Class attributes are the facts the faces read; the methods are the capacity model's rules
    for one GPU of the mode (the GPU's mode and the share's are the same when they are asked).
    """

    name: SharingMode
    summary: str = ""  # one line for the list of modes
    arrayable = False  # healthy GPUs answer by the rules of arrays (see modes.shared)
    divides_compute = False  # shares hold parts of the GPU's compute (its free share counts free compute)
    takes_whole = False  # any share takes the whole GPU
    isolated = False  # the hardware or exclusivity confines a pod's memory: an overrun is reported, never evicted
    control_daemon = False  # the node agent runs a control daemon per GPU and hands its pipe to the pod
    counts_stray = True  # memory of processes no record accounts for is counted against the GPU

    def refusal(self, node: Node, device: Device, usage: DeviceUsage, share: DeviceShare) -> Refusal | None:
        """None if ``share`` fits beside ``usage`` by the mode's capacity rules; else the rule it
        breaks: first whether it is a share of the GPU at all, then :meth:`rules`."""
        if not is_share_of(device, share):
            return no_such_share(device, usage, share.memory_mib, share.compute_milli)
        return self.rules(node, device, usage, share)

    def rules(self, node: Node, device: Device, usage: DeviceUsage, share: DeviceShare) -> Refusal | None:
        """The mode's own rules for a share of the GPU (neither negative nor more than it has)."""
        raise NotImplementedError

    def offer(
        self, gpu: GpuRequest, node: Node, device: Device, usage: DeviceUsage, key: tuple[Hashable, ...]
    ) -> Offer | Refusal:
        """The share one share of ``gpu`` gets on a healthy ``device`` beside ``usage`` (``key``:
        the GPU's :func:`~scheduler.core.capacity.device_key`), or why it cannot: by default
        exactly what the pod asks, where the capacity rules let it."""
        if gpu.kind is GpuKind.MIG:
            return not_mig(device, usage)
        memory, compute = gpu.share_on(device)
        return self.offer_of(node, device, usage, memory, compute)

    def offer_of(self, node: Node, device: Device, usage: DeviceUsage, memory: int, compute: int) -> Offer | Refusal:
        """A share of ``memory`` MiB and ``compute`` milli-GPU, if the capacity rules let it."""
        share = DeviceShare(device.uuid, device.index, device.mode, memory, compute)
        problem = self.why_not(node, device, usage, share)
        return Offer(memory, compute) if problem is None else problem

    def why_not(self, node: Node, device: Device, usage: DeviceUsage, share: DeviceShare) -> Refusal | None:
        """:meth:`refusal`, else :meth:`stray_refusal`: why ``share`` cannot be placed beside ``usage``."""
        return self.refusal(node, device, usage, share) or self.stray_refusal(node, device, usage, share)

    def question(self, gpu: GpuRequest, device: Device) -> tuple[Hashable, ...] | None:
        """What decides :meth:`offer`'s answer for one share of ``gpu`` beyond the GPU's state,
        for a healthy GPU (see :func:`~scheduler.core.fit.state_question`); None where the
        answer is not kept by question (the rules of arrays answer, or the mode keeps none)."""
        return None

    def stray_refusal(self, node: Node, device: Device, usage: DeviceUsage, share: DeviceShare) -> Refusal | None:
        """Why the stray memory on ``device`` keeps ``share`` off it (None if it does not)."""
        return None

    def amounts(self, node: Node, device: Device, usage: DeviceUsage) -> tuple[int, int, int]:
        """Free memory (MiB), free compute and the free share (milli-GPU) of a healthy GPU."""
        raise NotImplementedError

    def detail(self, device: Device, usage: DeviceUsage) -> str:
        """How ``gpuslice inspect`` describes what a healthy GPU holds."""
        raise NotImplementedError

    def caps(self, node: Node, device: Device) -> tuple[int, int, int]:
        """The GPU's memory cap, compute cap and client or replica limit, the node's
        oversubscription applied (read by the rules of arrays: arrayable modes only)."""
        return device.memory_mib, MILLI, 1

    def row(self, node: Node, device: Device, usage: DeviceUsage) -> tuple[int, ...]:
        """What the rules of arrays (:mod:`.shared`) read of one GPU state, as integers:
        whether they answer for it (1 for a healthy GPU of an arrayable mode, 0 otherwise: ask
        :meth:`refusal`), the GPU's memory, its :meth:`caps`, the memory, compute and shares
        it holds, whether a whole share holds it, and the memory stray processes hold."""
        memory_cap, compute_cap, limit = self.caps(node, device)
        return (
            int(self.arrayable and device.healthy),
            device.memory_mib,
            memory_cap,
            compute_cap,
            limit,
            usage.memory_mib,
            usage.compute_milli,
            usage.shares,
            int(usage.whole),
            device.stray_memory_mib,
        )
