"""How much of a device is still free, in milli-GPU: the one measure policies share.

* exclusive: 1000 if unused, else 0
* MPS: the smaller of free compute and free memory, as shares of the GPU; 0 at the client limit
* time-slicing: free memory as a share of the GPU; 0 with no replica left
* MIG: the smaller of free memory slots and free compute slices, as shares of the layout
  (static geometry: the free pre-created instances)
"""

from __future__ import annotations

from .allocation import Allocation
from .inventory import Device, SharingMode
from .request import MILLI
from .state import DeviceUsage, NodeState, add_share


def free_milli(device: Device, usage: DeviceUsage) -> int:
    if usage.whole:
        return 0
    mode = device.mode
    if mode is SharingMode.EXCLUSIVE:
        return 0 if usage.shares else MILLI
    if mode is SharingMode.MIG:
        layout = device.model.mig
        if layout is None:
            return 0
        if device.mig_static:
            used = {(s.profile, s.start) for s in usage.mig}
            free_slots = sum(
                i.profile.memory_slots for i in device.mig_instances if (i.profile.name, i.start) not in used
            )
            return free_slots * MILLI // layout.memory_slots
        mem_free = layout.memory_slots - sum(s.size for s in usage.mig)
        slices_free = layout.compute_slices - sum(s.slices for s in usage.mig)
        return min(mem_free * MILLI // layout.memory_slots, slices_free * MILLI // layout.compute_slices)
    memory_share = max(0, device.memory_mib - usage.memory_mib) * MILLI // device.memory_mib
    if mode is SharingMode.MPS:
        if usage.shares >= device.mps_client_limit:
            return 0
        return max(0, min(MILLI - usage.compute_milli, memory_share))
    if usage.shares >= device.replicas:
        return 0
    return memory_share


GAP_LEVELS = 100  # gap histograms count a GPU's free share in hundredths


def gap_level(free: int) -> int:
    """A free share in milli-GPU as a gap level, 0..GAP_LEVELS."""
    return free * GAP_LEVELS // MILLI


def gap_levels(state: NodeState) -> list[int]:
    """Each GPU's free share as a gap level (0: full or unusable, GAP_LEVELS: idle)."""
    return [gap_level(free_milli(d, u)) for d, u in zip(state.node.devices, state.usage, strict=True)]


def node_free_milli(state: NodeState) -> int:
    return sum(free_milli(d, u) for d, u in zip(state.node.devices, state.usage, strict=True))


def node_capacity_milli(state: NodeState) -> int:
    return MILLI * len(state.node.devices)


def allocated_milli(alloc: Allocation) -> int:
    """GPU an allocation takes, in milli-GPU (its compute share on each GPU)."""
    return sum(min(MILLI, s.compute_milli) for s in alloc.shares)


def free_after(state: NodeState, alloc: Allocation) -> int:
    """Free milli-GPU left on the GPUs ``alloc`` touches, once it is placed (for tightest fit)."""
    total = 0
    for share in alloc.shares:
        device = state.node.devices[share.index]
        total += free_milli(device, add_share(device, state.usage[share.index], share))
    return total
