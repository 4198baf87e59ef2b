"""The capacity model, one rule set per sharing mode: what a GPU holds, what is free on it,
and why a share does not fit. Every other module asks here.

Per mode, for one device and its usage:

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
messages with Go's ``fmt``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import numpy as np

from . import mig
from .allocation import Allocation, DeviceShare, MigSlot
from .inventory import Device, Node, SharingMode
from .request import MILLI

GAP_LEVELS = 100  # gap histograms count a GPU's free share in hundredths


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


def is_whole(device: Device, share: DeviceShare) -> bool:
    return share.mig is None and share.memory_mib >= device.memory_mib and share.compute_milli >= MILLI


def percent(milli: int) -> str:
    """Compute in milli-GPU as a percentage, written out in words (no ``%``: see the module)."""
    return f"{milli / 10:g} percent"


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
    stray = device.stray_memory_mib
    if stray <= 0 or device.mode is SharingMode.MIG:
        return None
    if device.mode is SharingMode.EXCLUSIVE:
        return Refusal(f"GPU {device.index} is not free: {_held(stray)}", 0, gpu=device.index)
    cap = device.memory_mib if device.mode is SharingMode.MPS else device.memory_mib * node.ts_memory_oversub_pct // 100
    left = max(0, cap - usage.memory_mib - stray)
    if share.memory_mib <= left:
        return None
    return _stray_short(share.memory_mib, left, stray)


def _held(stray: int) -> str:
    return f"{stray} MiB held by processes no allocation record accounts for"


def _memory_short(need: int, left: int) -> Refusal:
    return Refusal(f"needs {need} MiB on one GPU, free {left} MiB", left, need)


def _stray_short(need: int, left: int, stray: int) -> Refusal:
    return Refusal(f"needs {need} MiB on one GPU, free {left} MiB ({_held(stray)})", left, need)


def compute_short_text(need: int) -> str:
    """Why a share asking ``need`` milli-GPU of compute does not fit: what is asked, not what
    is left (see :mod:`scheduler.core.fit`, "Reasons")."""
    return f"needs {percent(need)} compute on one GPU, more than is free"


def _compute_short(need: int, free_mib: int) -> Refusal:
    return Refusal(compute_short_text(need), free_mib)


def refusal(node: Node, device: Device, usage: DeviceUsage, share: DeviceShare) -> Refusal | None:
    """None if ``share`` fits on ``device`` beside ``usage``; else the rule it breaks.

    Health is not a capacity rule: a GPU that turned unhealthy still holds what it held
    (see :func:`unhealthy`, which placement asks first).
    """
    free_mib = max(0, device.memory_mib - usage.memory_mib)

    def no(text: str, free: int = free_mib) -> Refusal:
        return Refusal(text, free, gpu=device.index)

    if share.mode is not device.mode:
        return no(f"GPU {device.index} is in mode {device.mode}, not {share.mode}")
    if share.memory_mib < 0 or share.compute_milli < 0:
        return no("negative share")
    if share.memory_mib > device.memory_mib or share.compute_milli > MILLI:
        return no(
            f"needs {share.memory_mib} MiB and {percent(share.compute_milli)} compute on one GPU, "
            f"GPU {device.index} has {device.memory_mib} MiB"
        )
    mode = device.mode
    if mode is SharingMode.MIG:
        layout = device.model.mig
        if share.mig is None or layout is None:
            return no(f"GPU {device.index} has no MIG layout")
        profile = next((p for p in device.allowed_profiles() if p.name == share.mig.profile), None)
        if profile is None or (profile.memory_slots, profile.compute_slices) != (share.mig.size, share.mig.slices):
            return no(f"profile {share.mig.profile} is not allowed on GPU {device.index}")
        if device.mig_static and not any(
            inst.profile.name == profile.name and inst.start == share.mig.start for inst in device.mig_instances
        ):
            return no(f"GPU {device.index} has no pre-created {profile.name} at slot {share.mig.start}")
        problem = mig.why_not(layout, usage.mig, profile, share.mig.start)
        return None if problem is None else no(problem)
    if share.mig is not None:
        return no(f"GPU {device.index} is not in MIG mode")
    if usage.whole or (usage.shares and (mode is SharingMode.EXCLUSIVE or is_whole(device, share))):
        return no(f"GPU {device.index} is not free", free=0)
    if mode is SharingMode.EXCLUSIVE:
        return None if is_whole(device, share) else no(f"GPU {device.index} is exclusive: whole GPU only")
    if mode is SharingMode.MPS:
        if usage.shares >= device.mps_client_limit:
            return no(f"GPU {device.index} has reached its MPS client limit of {device.mps_client_limit}")
        cap = MILLI * node.mps_compute_oversub_pct // 100
        if usage.compute_milli + share.compute_milli > cap:
            return _compute_short(share.compute_milli, free_mib)
        mem_cap = device.memory_mib
    else:
        if usage.shares >= device.replicas:
            return no(f"GPU {device.index} has no free time-slicing replica (of {device.replicas})")
        mem_cap = device.memory_mib * node.ts_memory_oversub_pct // 100
    if usage.memory_mib + share.memory_mib > mem_cap:
        return _memory_short(share.memory_mib, max(0, mem_cap - usage.memory_mib))
    return None


_NO_CAP = 1 << 62  # no bound (time-slicing does not divide compute)


def usage_row(node: Node, device: Device, usage: DeviceUsage) -> tuple[int, ...]:
    """What :func:`rows_fit` reads of one GPU state, as integers: whether the rule of arrays
    applies (1 for a healthy MPS or time-slicing GPU, 0 otherwise: ask :func:`refusal`), the
    GPU's memory, its memory and compute caps and its client or replica limit by its mode's
    rules (the node's oversubscription applied), the memory, compute and shares it holds,
    whether a whole share holds it, and the memory stray processes hold."""
    mode = device.mode
    arrayable = device.healthy and mode in (SharingMode.MPS, SharingMode.TIME_SLICING)
    total = device.memory_mib
    if mode is SharingMode.MPS:
        memory_cap, compute_cap, limit = total, MILLI * node.mps_compute_oversub_pct // 100, device.mps_client_limit
    else:
        memory_cap, compute_cap, limit = total * node.ts_memory_oversub_pct // 100, _NO_CAP, device.replicas
    return (
        int(arrayable),
        total,
        memory_cap,
        compute_cap,
        limit,
        usage.memory_mib,
        usage.compute_milli,
        usage.shares,
        int(usage.whole),
        device.stray_memory_mib,
    )


def rows_fit(rows: np.ndarray | tuple[Any, ...], memory_mib: np.ndarray, compute_milli: np.ndarray) -> np.ndarray:
    """Per share (``memory_mib[i]``, ``compute_milli[i]``): whether it fits the GPU state of
    ``rows[i]`` (an array of :func:`usage_row` rows, one per share), or of ``rows`` (one row as
    a tuple, for every share; or a tuple of columns that broadcast against the shares, such as
    every state's column as ``(states, 1)`` for every state and share at once):
    :func:`refusal` and :func:`stray_refusal` both None, for many at once. Only for rows whose
    first column is 1. ``tests/core/test_capacity.py`` holds the two to the same answers."""
    columns = rows.T if isinstance(rows, np.ndarray) else rows
    _, total, memory_cap, compute_cap, limit, used_memory, used_compute, shares, whole, stray = columns
    m, c = memory_mib, compute_milli
    room = memory_cap - used_memory
    # memory: at most the GPU's, what the cap leaves, and what stray processes leave of that
    memory_bound = np.minimum(np.minimum(total, room), np.where(stray > 0, np.maximum(0, room - stray), room))
    compute_bound = np.minimum(MILLI, compute_cap - used_compute)
    fits: np.ndarray = (m >= 0) & (c >= 0) & (m <= memory_bound) & (c <= compute_bound)
    fits &= (whole == 0) & (shares < limit)
    fits &= (shares == 0) | (m < total) | (c < MILLI)  # a whole GPU only alone
    return fits


def rows_free_milli(rows: np.ndarray, mps: bool) -> np.ndarray:
    """:func:`free_milli` of healthy MPS (``mps``) or time-slicing GPU states, from their
    :func:`usage_row` rows (one per state), in the same integer arithmetic."""
    _, total, _, _, limit, used_memory, used_compute, shares, whole, stray = rows.T
    memory_share = np.maximum(0, total - (used_memory + stray)) * MILLI // total
    share = np.maximum(0, np.minimum(MILLI - used_compute, memory_share)) if mps else memory_share
    free: np.ndarray = np.where((shares >= limit) | (whole != 0), 0, share)
    return free


# The rules of arrays a share refused by an MPS or time-slicing GPU breaks first, in the order
# refusal then stray_refusal asks them (see rows_refused_rule).
NO_SUCH_SHARE, NOT_FREE, NO_CLIENT, COMPUTE_SHORT, MEMORY_SHORT, STRAY_SHORT = range(6)


def rows_add_share(rows: np.ndarray, memory_mib: np.ndarray, compute_milli: np.ndarray) -> np.ndarray:
    """:func:`usage_row` of :func:`add_share` over arrays: the rows (one per MPS or time-slicing
    GPU state, as :func:`usage_row` writes them) once one share of ``memory_mib[i]`` and
    ``compute_milli[i]`` (not a MIG instance) is added to each. A share of the whole GPU marks
    it whole, as :func:`is_whole` does."""
    after = rows.copy()
    after[:, 5] += memory_mib
    after[:, 6] += compute_milli
    after[:, 7] += 1
    after[:, 8] |= ((memory_mib >= rows[:, 1]) & (compute_milli >= MILLI)).astype(after.dtype)
    return after


def rows_refused_rule(rows: np.ndarray, memory_mib: np.ndarray, compute_milli: np.ndarray) -> np.ndarray:
    """Per share that does not fit the GPU state of ``rows[i]`` (see :func:`rows_fit`): the
    first rule it breaks, as :func:`refusal` then :func:`stray_refusal` ask them (no share of
    this GPU at all, the GPU not free, no client or replica left, compute, memory past the
    cap, memory past what stray processes leave). Meaningless where the share fits."""
    _, total, memory_cap, compute_cap, limit, used_memory, used_compute, shares, whole, _stray = rows.T
    m, c = memory_mib, compute_milli
    rule: np.ndarray = np.select(
        [
            (m < 0) | (c < 0) | (m > total) | (c > MILLI),
            (whole != 0) | ((shares != 0) & (m >= total) & (c >= MILLI)),
            shares >= limit,
            used_compute + c > compute_cap,
            used_memory + m > memory_cap,
        ],
        [NO_SUCH_SHARE, NOT_FREE, NO_CLIENT, COMPUTE_SHORT, MEMORY_SHORT],
        STRAY_SHORT,
    )
    return rule


def rows_refused_free(
    rows: np.ndarray, memory_mib: np.ndarray, compute_milli: np.ndarray, rule: np.ndarray | None = None
) -> np.ndarray:
    """Per share that does not fit the GPU state of ``rows[i]`` (see :func:`rows_fit`): the free
    memory (MiB) the :class:`Refusal` of :func:`refusal`, else of :func:`stray_refusal`, reports;
    the first rule the share breaks (:func:`rows_refused_rule`, or ``rule`` if given) decides
    which. Meaningless where the share fits. Held to the two refusals pair by pair in
    ``tests/core/test_capacity.py``."""
    _, total, memory_cap, _, _, used_memory, _, _, _, stray = rows.T
    device_free = np.maximum(0, total - used_memory)
    room = memory_cap - used_memory
    by_rule = [device_free, 0, device_free, device_free, np.maximum(0, room), np.maximum(0, room - stray)]
    broken = rows_refused_rule(rows, memory_mib, compute_milli) if rule is None else rule
    free: np.ndarray = np.choose(broken, by_rule)
    return free


SHORT_MEMORY, SHORT_COMPUTE = 1, 2  # what rows_shortages finds short (0: another rule broken)
_SHORT_OF_RULE = np.array([0, 0, 0, SHORT_COMPUTE, SHORT_MEMORY, SHORT_MEMORY])  # by rows_refused_rule


def rows_shortages(
    rows: np.ndarray, memory_mib: np.ndarray, compute_milli: np.ndarray, rule: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Per share that does not fit the GPU state of ``rows[i]`` (see :func:`rows_fit`): what
    its :class:`Refusal` (of :func:`refusal`, else :func:`stray_refusal`) says is short, as
    numbers, where the rule it breaks names no GPU: :data:`SHORT_MEMORY` (memory past the cap
    or past what stray processes leave) and the MiB asked; :data:`SHORT_COMPUTE` and the
    milli-GPU asked; 0 where it breaks another rule (ask :func:`refusal`). A node's reason is
    written from these (see :func:`~.fit.short_reason`), once per distinct pair. Held to the
    two refusals pair by pair in ``tests/core/test_capacity.py``. ``rule``:
    :func:`rows_refused_rule`'s answer, if known."""
    if rule is None:
        rule = rows_refused_rule(rows, memory_mib, compute_milli)
    what = _SHORT_OF_RULE[rule]
    need = np.where(what == SHORT_COMPUTE, compute_milli, memory_mib) * (what > 0)
    return what, need


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
    mode = device.mode
    if mode is SharingMode.EXCLUSIVE:
        if usage.shares or device.stray_memory_mib:
            return 0, 0, 0
        return device.memory_mib, MILLI, MILLI
    if mode is SharingMode.MIG:
        return _mig_amounts(device, usage)
    used_mib = usage.memory_mib + device.stray_memory_mib
    memory_share = max(0, device.memory_mib - used_mib) * MILLI // device.memory_mib
    if mode is SharingMode.MPS:
        if usage.shares >= device.mps_client_limit or usage.whole:
            return 0, 0, 0
        cap = MILLI * node.mps_compute_oversub_pct // 100
        share = max(0, min(MILLI - usage.compute_milli, memory_share))
        return max(0, device.memory_mib - used_mib), max(0, cap - usage.compute_milli), share
    if usage.shares >= device.replicas or usage.whole:
        return 0, 0, 0
    cap_mib = device.memory_mib * node.ts_memory_oversub_pct // 100
    return max(0, cap_mib - used_mib), max(0, MILLI - usage.compute_milli), memory_share


def _mig_amounts(device: Device, usage: DeviceUsage) -> tuple[int, int, int]:
    layout = device.model.mig
    if layout is None:
        return 0, 0, 0
    if device.mig_static:
        taken = {(s.profile, s.start) for s in usage.mig}
        left = [i for i in device.mig_instances if (i.profile.name, i.start) not in taken]
        return (
            sum(i.profile.memory_mib for i in left),
            sum(i.profile.compute_slices for i in left) * MILLI // layout.compute_slices,
            sum(i.profile.memory_slots for i in left) * MILLI // layout.memory_slots,
        )
    slots = layout.memory_slots - sum(s.size for s in usage.mig)
    slices = layout.compute_slices - sum(s.slices for s in usage.mig)
    return (
        slots * device.memory_mib // layout.memory_slots,
        slices * MILLI // layout.compute_slices,
        min(slots * MILLI // layout.memory_slots, slices * MILLI // layout.compute_slices),
    )


def _detail(device: Device, usage: DeviceUsage) -> str:
    """How :func:`free` describes a GPU: MIG slots in use, MPS clients, time-slicing replicas."""
    if not device.healthy:
        return "unhealthy"
    mode = device.mode
    stray = device.stray_memory_mib if mode is not SharingMode.MIG else 0
    note = f"; stray {stray} MiB" if stray else ""
    if mode is SharingMode.EXCLUSIVE:
        if usage.shares:
            return "in use" + note
        return f"not free: stray {stray} MiB" if stray else "free"
    if mode is SharingMode.MIG:
        if device.model.mig is None:
            return "no MIG layout"
        used = ", ".join(f"{s.profile}@{s.start}" for s in usage.mig) or "none"
        return f"static; used {used}" if device.mig_static else f"dynamic; used {used}"
    if mode is SharingMode.MPS:
        return f"{usage.shares}/{device.mps_client_limit} clients{note}"
    return f"{usage.shares}/{device.replicas} replicas{note}"


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
