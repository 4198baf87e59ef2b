"""Exclusive: whole GPUs only; a GPU is all free or not free at all.

A share of part of a GPU never takes one (``fit`` turns such a request away, or gives the
whole GPU where the pod accepts it); memory held by processes no record accounts for makes
the GPU not free. The pod owns the GPU, so an overrun of its memory harms no one else.
"""

from __future__ import annotations

from collections.abc import Hashable

from ..allocation import DeviceShare
from ..inventory import Device, Node, SharingMode
from ..request import MILLI, GpuKind, GpuRequest
from .base import (
    DeviceUsage,
    Mode,
    Offer,
    Refusal,
    held,
    is_whole,
    not_free,
    not_mig,
    refused,
)


def _taken_whole(gpu: GpuRequest, device: Device, memory: int, compute: int) -> bool:
    """Whether an exclusive GPU takes a share of ``memory`` MiB and ``compute`` milli-GPU of
    ``gpu`` (no more than it has) as the whole GPU: all of it asked, or sharing listing
    exclusive; else it refuses part of a GPU."""
    return (memory, compute) == (device.memory_mib, MILLI) or SharingMode.EXCLUSIVE in gpu.sharing


class Exclusive(Mode):
    """A GPU given whole to one share, or not at all."""

    name = SharingMode.EXCLUSIVE
    summary = "whole GPUs only, one pod each"
    takes_whole = True
    isolated = True

    def rules(self, node: Node, device: Device, usage: DeviceUsage, share: DeviceShare) -> Refusal | None:
        if share.mig is not None:
            return not_mig(device, usage)
        if usage.whole or usage.shares:
            return not_free(device)
        if is_whole(device, share):
            return None
        return refused(device, usage, f"GPU {device.index} is exclusive: whole GPU only")

    def offer(
        self, gpu: GpuRequest, node: Node, device: Device, usage: DeviceUsage, key: tuple[Hashable, ...]
    ) -> Offer | Refusal:
        if gpu.kind is GpuKind.MIG:
            return not_mig(device, usage)
        memory, compute = gpu.share_on(device)
        if memory <= device.memory_mib and compute <= MILLI:
            if not _taken_whole(gpu, device, memory, compute):
                # Given whole, an exclusive GPU would waste the rest of itself on part of a request:
                # part of a GPU goes to a shared one, unless the pod accepts a whole GPU instead.
                text = (
                    f"GPU {device.index} is exclusive: part of a GPU needs a shared GPU, or sharing listing exclusive"
                )
                return refused(device, usage, text)
            memory, compute = device.memory_mib, MILLI  # an exclusive GPU is given whole, whatever was asked
        return self.offer_of(node, device, usage, memory, compute)

    def question(self, gpu: GpuRequest, device: Device) -> tuple[Hashable, ...] | None:
        if gpu.kind is GpuKind.MIG:
            return ("not in MIG mode",)
        memory, compute = gpu.share_on(device)
        if memory <= device.memory_mib and compute <= MILLI:
            return ("whole",) if _taken_whole(gpu, device, memory, compute) else ("part of a GPU",)
        return ("asks", memory, compute)  # more than the GPU has: the refusal names the amounts

    def stray_refusal(self, node: Node, device: Device, usage: DeviceUsage, share: DeviceShare) -> Refusal | None:
        stray = device.stray_memory_mib
        if stray <= 0:
            return None
        return Refusal(f"GPU {device.index} is not free: {held(stray)}", 0, gpu=device.index)

    def amounts(self, node: Node, device: Device, usage: DeviceUsage) -> tuple[int, int, int]:
        if usage.shares or device.stray_memory_mib:
            return 0, 0, 0
        return device.memory_mib, MILLI, MILLI

    def detail(self, device: Device, usage: DeviceUsage) -> str:
        stray = device.stray_memory_mib
        if usage.shares:
            return f"in use; stray {stray} MiB" if stray else "in use"
        return f"not free: stray {stray} MiB" if stray else "free"
