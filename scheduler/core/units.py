"""GPU units: a necessary condition of GPU fit that kube-scheduler's own NodeResourcesFit can check.

kube-scheduler cannot see GPU shares, so its default preemption proposes no node whose only
shortage is GPU. A node-level extended resource (``gpuslice.io/gpu-units``) that the node
advertises and every gpuslice pod requests lets it see one: a node short of units is short of
GPU, and becomes a preemption candidate. For that the units must never refuse a placement
gpuslice would make: on every GPU, the units of the shares it holds never exceed what the GPU
advertises, for any placement the capacity rules (:mod:`.capacity`) allow. So a pod's units
are a LOWER bound of its footprint, in a dimension each mode sums per GPU:

* a whole GPU: 100 (it is alone on its GPU); with ``sharing`` listing ``mig`` it may be served
  by the largest free instance of a static MIG GPU, perhaps one compute slice: the fewest
  compute slices of any catalogue layout, as hundredths of its slices (1 of 7: 14);
* a MIG profile: its compute slices as hundredths of the layout's (the sum of slices on a MIG
  GPU never exceeds the layout's), the least over the catalogue's layouts that offer it;
* a share: MPS and time-slicing sum the memory of shares per GPU, MIG the compute slices of
  the covering instances (at least the share's compute), an exclusive GPU holds one share. A
  proportional share (a fraction, or compute alone: memory ``p x M // 1000`` of a GPU of ``M``
  MiB) gets ``(p - 1) // 10``, under ``100 x memory / M`` on any GPU of at least 1000 MiB
  (the floor costs less than 0.1 of a unit there); a share that names its memory ``m`` gets
  ``100 x m // REFERENCE_MEMORY_MIB`` (the catalogue's largest GPU), and no more than a tenth
  of its compute where it names that too (on a MIG GPU only the compute is sure);
* no GPU: 0. Units are per GPU and a pod on ``count`` GPUs asks ``count`` times as many.

What a GPU advertises, :func:`gpu_units`: 100, scaled up by its memory over the reference
where it has more (an unknown model larger than the catalogue's: memory-named shares are
counted against the reference), and by the memory cap its mode sets over its memory (the
node's time-slicing memory oversubscription: shares' memory may sum to that much of the GPU). MPS compute
oversubscription does not matter: MPS is counted by memory, which it never oversubscribes.
An unhealthy GPU advertises its units too: it still holds its shares.
"""

from __future__ import annotations

from . import modes
from .catalog import CATALOG
from .inventory import Device, Node, SharingMode
from .request import GpuKind, GpuRequest

UNITS_PER_GPU = 100
REFERENCE_MEMORY_MIB = max(model.memory_mib for model in CATALOG.values())
_LAYOUTS = tuple(model.mig for model in CATALOG.values() if model.mig is not None)
# The least share of a GPU any MIG instance of the catalogue is, in units (1 of 7 slices: 14).
_SMALLEST_INSTANCE = min(
    UNITS_PER_GPU * profile.compute_slices // layout.compute_slices
    for layout in _LAYOUTS
    for profile in layout.profiles
)


def per_gpu_units(gpu: GpuRequest) -> int:
    """The units a pod with this request asks on each GPU it gets (see the module)."""
    if gpu.kind is GpuKind.NONE:
        return 0
    if gpu.kind is GpuKind.WHOLE:
        return _SMALLEST_INSTANCE if SharingMode.MIG in gpu.sharing else UNITS_PER_GPU
    if gpu.kind is GpuKind.MIG:
        assert gpu.profile is not None
        shares = [
            UNITS_PER_GPU * gpu.profile.compute_slices // layout.compute_slices
            for layout in _LAYOUTS
            if layout.match(gpu.profile) is not None
        ]
        return min(shares, default=0)  # a profile no model offers fits nowhere: no units
    proportional = gpu.fraction_milli or (gpu.compute_milli if not gpu.memory_mib else 0)
    if proportional:
        return max(0, (proportional - 1) // 10)
    units = UNITS_PER_GPU * gpu.memory_mib // REFERENCE_MEMORY_MIB
    if gpu.compute_milli:
        units = min(units, gpu.compute_milli // 10)
    return min(UNITS_PER_GPU, units)


def pod_units(gpu: GpuRequest) -> int:
    """The units a pod with this request asks of its node: :func:`per_gpu_units` per GPU."""
    return per_gpu_units(gpu) * max(1, gpu.count)


def gpu_units(node: Node, device: Device) -> int:
    """The units one GPU of ``node`` advertises (see the module): scaled by the memory its mode
    lets shares sum to (its memory cap: time-slicing's oversubscription) over its memory."""
    scaled = -(-UNITS_PER_GPU * max(device.memory_mib, REFERENCE_MEMORY_MIB) // REFERENCE_MEMORY_MIB)
    memory_cap = modes.of(device.mode).caps(node, device)[0]
    if device.memory_mib > 0 and memory_cap > device.memory_mib:
        scaled = -(-scaled * -(-memory_cap * 100 // device.memory_mib) // 100)
    return scaled


def node_units(node: Node) -> int:
    """The units a node advertises: the sum over its GPUs."""
    return sum(gpu_units(node, device) for device in node.devices)
