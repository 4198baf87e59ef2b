"""MIG: the GPU is cut into hardware instances at legal starts that do not overlap (the
geometry is :mod:`scheduler.core.mig`'s).

A dynamic GPU takes any allowed profile at a free start (the node agent creates the instance);
a static one (``Device.mig_static``) serves only its pre-created instances. The hardware
confines every process to its instance, so a process no record accounts for takes memory from
an instance's holder, never from the free slots: stray memory is not counted, and an overrun
is reported, never evicted.
"""

from __future__ import annotations

from collections.abc import Hashable

from .. import mig as layouts
from ..allocation import DeviceShare
from ..catalog import MigProfile
from ..inventory import Device, Node, SharingMode
from ..request import MILLI, GpuKind, GpuRequest
from .base import DeviceUsage, Mode, Offer, Refusal, free_mib, percent, refused

_TABLE_LIMIT = 200_000
# Per (device key, covering MIG profiles): a share of a MIG GPU, whatever size of request
# those profiles cover.
_COVERED: dict[tuple[tuple[Hashable, ...], str], Offer | Refusal] = {}


def _mig_share(device: Device, usage: DeviceUsage, profiles: list[MigProfile], wanted: str) -> Offer | Refusal:
    layout = device.model.mig
    assert layout is not None
    compute = {p.name: p.compute_slices * MILLI // layout.compute_slices for p in profiles}
    for profile in profiles:
        if device.mig_static:
            used = {(s.profile, s.start) for s in usage.mig}
            inst = next(
                (
                    i
                    for i in sorted(device.mig_instances, key=lambda i: i.start)
                    if i.profile.name == profile.name and (profile.name, i.start) not in used
                ),
                None,
            )
            if inst is not None:
                return Offer(
                    profile.memory_mib, compute[profile.name], layouts.slot_of(profile, inst.start), inst.start
                )
            continue
        start = layouts.best_start(layout, usage.mig, profile)
        if start is not None:
            return Offer(profile.memory_mib, compute[profile.name], layouts.slot_of(profile, start))
    return Refusal(f"no free MIG slot for {wanted}", free_mib(device, usage))


def profiles_for(gpu: GpuRequest, device: Device) -> tuple[list[MigProfile], str] | str:
    """The MIG profiles one share of ``gpu`` may take on ``device`` (in MIG mode), in the order
    they are tried, and their names joined; or why none (the text of the refusal). It depends
    on the request and the device's kind, not on what the GPU holds."""
    layout = device.model.mig
    allowed = device.allowed_profiles()
    if layout is None or not allowed:
        return f"GPU {device.index} has no MIG profiles"
    if gpu.kind is GpuKind.MIG:
        assert gpu.profile is not None
        wanted = layout.match(gpu.profile)
        if wanted is None or wanted not in allowed:
            return f"no MIG profile {gpu.profile.text} on {device.model.name}"
        return [wanted], wanted.name
    if gpu.kind is not GpuKind.SHARE:
        if SharingMode.MIG not in gpu.sharing:  # listed by the pod: the default (any) does not count
            return f"GPU {device.index} is partitioned by MIG; whole GPUs need another mode, or sharing listing mig"
        # whole GPUs taken as MIG instances: one instance per GPU, the largest it offers (on a
        # static GPU the largest free one; on a dynamic GPU the largest profile, the whole GPU)
        largest = sorted(allowed, key=lambda p: (-p.memory_slots, -p.compute_slices))
        if not device.mig_static:
            largest = largest[:1]
        return largest, "|".join(p.name for p in largest)
    memory, compute = gpu.share_on(device)
    covering = sorted(
        (p for p in allowed if p.memory_mib >= memory and p.compute_slices * MILLI >= compute * layout.compute_slices),
        key=lambda p: (p.memory_slots, p.compute_slices),
    )
    if not covering:
        return f"needs {memory} MiB and {percent(compute)} compute, larger than any MIG profile of GPU {device.index}"
    return covering, "|".join(p.name for p in covering)


class Mig(Mode):
    """A GPU cut into MIG instances, one share each; static or dynamic by its device's
    ``mig_instances``."""

    name = SharingMode.MIG
    summary = "hardware instances of a MIG layout, static (pre-created) or dynamic"
    isolated = True
    counts_stray = False

    def rules(self, node: Node, device: Device, usage: DeviceUsage, share: DeviceShare) -> Refusal | None:
        layout = device.model.mig
        if share.mig is None or layout is None:
            return refused(device, usage, f"GPU {device.index} has no MIG layout")
        profile = next((p for p in device.allowed_profiles() if p.name == share.mig.profile), None)
        if profile is None or (profile.memory_slots, profile.compute_slices) != (share.mig.size, share.mig.slices):
            return refused(device, usage, f"profile {share.mig.profile} is not allowed on GPU {device.index}")
        if device.mig_static and not any(
            inst.profile.name == profile.name and inst.start == share.mig.start for inst in device.mig_instances
        ):
            return refused(
                device, usage, f"GPU {device.index} has no pre-created {profile.name} at slot {share.mig.start}"
            )
        problem = layouts.why_not(layout, usage.mig, profile, share.mig.start)
        return None if problem is None else refused(device, usage, problem)

    def offer(
        self, gpu: GpuRequest, node: Node, device: Device, usage: DeviceUsage, key: tuple[Hashable, ...]
    ) -> Offer | Refusal:
        found = profiles_for(gpu, device)
        if isinstance(found, str):
            return refused(device, usage, found)
        profiles, names = found
        if gpu.kind is GpuKind.MIG:
            return _mig_share(device, usage, profiles, names)
        # what the covering profiles find on this GPU does not depend on the request beyond
        # them: requests of other sizes with the same covering profiles share the answer
        kept = _COVERED.get((key, names))
        if kept is None:
            if len(_COVERED) > _TABLE_LIMIT:
                _COVERED.clear()
            kept = _COVERED[key, names] = _mig_share(device, usage, profiles, names)
        return kept

    def question(self, gpu: GpuRequest, device: Device) -> tuple[Hashable, ...] | None:
        found = profiles_for(gpu, device)
        return ("refused", found) if isinstance(found, str) else ("profiles", found[1])

    def amounts(self, node: Node, device: Device, usage: DeviceUsage) -> tuple[int, int, int]:
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

    def detail(self, device: Device, usage: DeviceUsage) -> str:
        if device.model.mig is None:
            return "no MIG layout"
        used = ", ".join(f"{s.profile}@{s.start}" for s in usage.mig) or "none"
        return f"static; used {used}" if device.mig_static else f"dynamic; used {used}"
