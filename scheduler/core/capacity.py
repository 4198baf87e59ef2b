"""The capacity model: what a GPU holds, what is free on it, and why a share does not fit.
Every other module asks here; here asks the GPU's mode (:mod:`scheduler.core.modes`, one module
per mode, where each rule is written). In short, for one device and its usage:

* exclusive: whole GPUs only; free is all of it or nothing
* MPS: the sum of memory <= the GPU's, the sum of compute <= 100% (times the node's
  oversubscription), clients <= the MPS client limit
* time-slicing: replicas <= the replica count, the sum of memory <= the GPU's (times the
  node's oversubscription); compute is interleaved, not divided
* MIG: instances at legal starts that do not overlap (see :mod:`mig`); a static geometry
  serves only its pre-created instances

:func:`refusal` says why a share does not fit (None if it does); :func:`free` what is left.

Memory that processes no record accounts for hold (``Device.stray_memory_mib``, measured by
the node agent) is not a capacity rule either: the records on a GPU hold what they hold
whatever else runs there. It is a placement rule, :func:`stray_refusal`, asked with the
capacity rules for every new share; and :func:`free` leaves it out of what is free. On MIG
GPUs the hardware confines every process to an instance, so a stray process takes memory from
an instance's holder, not from the free slots: it is reported, never counted here.
The free share in milli-GPU (:attr:`Free.milli`) is the one measure policies share. A
refusal's text never holds ``%``: it reaches kube-scheduler, which formats some of its
messages with Go's ``fmt``. The rules of MPS and time-slicing GPUs are written once over
arrays (:mod:`scheduler.core.modes.shared`, the ``rows_*`` functions): the question of one
share is the same rules over one row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from . import modes
from .allocation import Allocation, DeviceShare
from .inventory import Device, Node
from .modes.base import EMPTY as EMPTY
from .modes.base import DeviceUsage as DeviceUsage
from .modes.base import Refusal as Refusal
from .modes.base import compute_short_text as compute_short_text
from .modes.base import is_whole as is_whole
from .modes.base import percent as percent
from .modes.shared import rows_fit
from .request import MILLI

GAP_LEVELS = 100  # gap histograms count a GPU's free share in hundredths


@dataclass(frozen=True, slots=True)
class Free:
    """What is left on one GPU, by its mode's rules."""

    memory_mib: int
    compute_milli: int
    milli: int  # the free share in milli-GPU: the measure policies share
    detail: str  # MIG slots in use, MPS clients, time-slicing replicas


def device_kind(device: Device) -> int:
    """What makes two GPUs interchangeable for the capacity model, apart from their usage."""
    return device.kind


def device_key(node: Node, device: Device, usage: DeviceUsage) -> tuple[int, int, int, DeviceUsage]:
    """Everything the capacity model reads of one GPU (its kind, its usage, the node's
    oversubscription): GPUs with equal keys answer every fit question alike."""
    return (device.kind, node.mps_compute_oversub_pct, node.ts_memory_oversub_pct, usage)


def unhealthy(device: Device) -> Refusal | None:
    """Why ``device`` takes no new share (None while it is healthy)."""
    if device.healthy:
        return None
    reason = device.unhealthy_reason or "reported by the node agent"
    return Refusal(f"GPU {device.index} is unhealthy: {reason}", 0, gpu=device.index)


def stray_refusal(node: Node, device: Device, usage: DeviceUsage, share: DeviceShare) -> Refusal | None:
    """Why the memory that stray processes hold on ``device`` keeps ``share`` off it (None if
    it does not): an exclusive GPU with any is not free; on MPS and time-slicing GPUs the share
    must fit in what the records and the strays leave."""
    return modes.of(device.mode).stray_refusal(node, device, usage, share)


def refusal(node: Node, device: Device, usage: DeviceUsage, share: DeviceShare) -> Refusal | None:
    """None if ``share`` fits on ``device`` beside ``usage``; else the rule it breaks.

    Health is not a capacity rule: a GPU that turned unhealthy still holds what it held
    (see :func:`unhealthy`, which placement asks first).
    """
    if share.mode is not device.mode:
        text = f"GPU {device.index} is in mode {device.mode}, not {share.mode}"
        return Refusal(text, max(0, device.memory_mib - usage.memory_mib), gpu=device.index)
    return modes.of(device.mode).refusal(node, device, usage, share)


def usage_row(node: Node, device: Device, usage: DeviceUsage) -> tuple[int, ...]:
    """What :func:`rows_fit` reads of one GPU state, as integers (see
    :meth:`scheduler.core.modes.base.Mode.row`): its first column is 1 where the rules of arrays
    answer for the GPU (a healthy MPS or time-slicing GPU), 0 where :func:`refusal` must."""
    return modes.of(device.mode).row(node, device, usage)


def shares_fit(
    node: Node, device: Device, usage: DeviceUsage, memory_mib: np.ndarray, compute_milli: np.ndarray
) -> np.ndarray | None:
    """Per share (``memory_mib[i]``, ``compute_milli[i]``) of an MPS or time-slicing GPU:
    whether it fits beside ``usage`` (:func:`rows_fit` of its one state; a fragmentation
    measure asks this of every typical shape for each new device state). None for the other
    modes and for an unhealthy GPU: ask :func:`refusal` share by share there."""
    row = usage_row(node, device, usage)
    return rows_fit(row, memory_mib, compute_milli) if row[0] else None


def add_share(device: Device, usage: DeviceUsage, share: DeviceShare) -> DeviceUsage:
    return DeviceUsage(
        usage.memory_mib + share.memory_mib,
        usage.compute_milli + share.compute_milli,
        usage.shares + 1,
        usage.whole or modes.of(device.mode).takes_whole or is_whole(device, share),
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


def free(node: Node, device: Device, usage: DeviceUsage) -> Free:
    """What is left on ``device``: memory, compute and the free share, by its mode's rules.

    The free share: exclusive 1000 if unused, else 0; MPS the smaller of free compute and
    free memory, as shares of the GPU, 0 at the client limit; time-slicing free memory as a
    share of the GPU, 0 with no replica left; MIG the smaller of free memory slots and free
    compute slices, as shares of the layout (static geometry: the free pre-created instances).
    An unhealthy GPU has nothing free. Stray memory (see :func:`stray_refusal`) is not free:
    an exclusive GPU with any has nothing free, and on MPS and time-slicing GPUs it is taken
    from the free memory.
    """
    memory, compute, milli = _amounts(node, device, usage)
    return Free(memory, compute, milli, _detail(device, usage))


def free_milli(node: Node, device: Device, usage: DeviceUsage) -> int:
    """The free share of one GPU in milli-GPU (see :func:`free`), without its description."""
    return _amounts(node, device, usage)[2]


def _amounts(node: Node, device: Device, usage: DeviceUsage) -> tuple[int, int, int]:
    """Free memory (MiB), free compute and the free share (milli-GPU) of :func:`free`."""
    if not device.healthy:
        return 0, 0, 0
    return modes.of(device.mode).amounts(node, device, usage)


def _detail(device: Device, usage: DeviceUsage) -> str:
    """How :func:`free` describes a GPU: MIG slots in use, MPS clients, time-slicing replicas."""
    if not device.healthy:
        return "unhealthy"
    return modes.of(device.mode).detail(device, usage)


_Share = TypeVar("_Share", int, np.ndarray)


def gap_level(free_share: _Share) -> _Share:
    """A free share in milli-GPU as a gap level, 0..GAP_LEVELS (of each, for an array)."""
    return free_share * GAP_LEVELS // MILLI


def share_milli(share: DeviceShare) -> int:
    """GPU one share takes, in milli-GPU: its compute share of the GPU."""
    return min(MILLI, share.compute_milli)


def allocated_milli(alloc: Allocation) -> int:
    """GPU an allocation takes, in milli-GPU (:func:`share_milli` summed over its GPUs)."""
    return sum(map(share_milli, alloc.shares))
