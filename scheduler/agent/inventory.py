"""The node's inventory from the hardware: the core's :class:`Node`, written with the core's codec.

Per GPU: UUID, model (from NVML's product name, memory and SM count), MIG mode and the
instances there with their placements and UUIDs, NVLink peers, health, the sharing mode
from the configuration, and the memory stray processes hold (measured each round). MIG mode
on the hardware decides: a GPU in MIG mode is a MIG GPU whatever the configuration says, and a
GPU with MIG off is never offered as one.
On a dynamic-MIG GPU the instances are split by who made them: ``mig_managed`` (the agent,
for records) and ``mig_taken`` (anyone else: never touched, their slots never offered).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from scheduler.core import modes
from scheduler.core.catalog import GpuModel, MigProfile, lookup_model
from scheduler.core.inventory import Device, MigInstance, Node, SharingMode

from .config import AgentConfig
from .gpus import GpuInfo, MigInfo


def model_of(info: GpuInfo) -> GpuModel:
    """The catalogue model for NVML's product name, with the memory and SMs the GPU reports."""
    return lookup_model(info.name, info.memory_mib, info.sm_count or None)


def profile_of(model: GpuModel, inst: MigInfo) -> MigProfile | None:
    layout = model.mig
    if layout is None:
        return None
    shape = (inst.compute_slices, inst.memory_slots)
    return next((p for p in layout.profiles if (p.compute_slices, p.memory_slots) == shape), None)


def build_node(
    config: AgentConfig,
    gpus: tuple[GpuInfo, ...],
    instances: Mapping[str, tuple[MigInfo, ...]],
    managed: Collection[str],
    unhealthy: Mapping[str, str],
    peers: Mapping[str, tuple[str, ...]],
    stray: Mapping[str, int] | None = None,
) -> tuple[Node, list[str]]:
    """The node as the extender will read it, and a line for each GPU that could not be
    described as configured (it is then kept off with a reason, never guessed). ``stray``:
    GPU UUID -> memory held by processes no record accounts for (GPUs not in MIG mode)."""
    devices: list[Device] = []
    warnings: list[str] = []
    index_of = {g.uuid: g.index for g in gpus}
    links: set[tuple[int, int]] = set()
    for info in sorted(gpus, key=lambda g: g.index):
        model = model_of(info)
        sharing = config.sharing_of(info.index)
        reason = unhealthy.get(info.uuid, "")
        mode = sharing.mode
        static: tuple[MigInstance, ...] = ()
        taken: list[MigInstance] = []
        ours: list[MigInstance] = []
        allowed: tuple[str, ...] = ()
        if info.mig_enabled:
            mode = SharingMode.MIG
            if model.mig is None:
                reason = reason or f"MIG mode is on, but gpuslice knows no MIG layout for {model.name}"
                mode = SharingMode.EXCLUSIVE
            else:
                for inst in instances.get(info.uuid, ()):
                    profile = profile_of(model, inst)
                    if profile is None:
                        warnings.append(f"GPU {info.index}: MIG instance {inst.uuid} has no profile of {model.name}")
                        reason = reason or f"MIG instance {inst.uuid} of an unknown profile"
                        continue
                    one = MigInstance(profile, inst.start, inst.uuid)
                    (ours if inst.uuid in managed else taken).append(one)
                if sharing.mig_strategy == "static":
                    static = tuple(sorted(taken + ours, key=lambda i: i.start))
                    taken, ours = [], []
                    if not static:
                        reason = reason or "static MIG, but the GPU has no MIG instances"
                else:
                    names = {p.name for p in model.mig.profiles}
                    allowed = tuple(p for p in sharing.mig_profiles if p in names)
                    unknown = sorted(set(sharing.mig_profiles) - names)
                    if unknown:
                        warnings.append(f"GPU {info.index}: {model.name} has no MIG profile {', '.join(unknown)}")
        elif mode is SharingMode.MIG:
            warnings.append(
                f"GPU {info.index}: configured for MIG, but its MIG mode is off (the agent never changes it)"
            )
            reason = reason or "configured for MIG, but MIG mode is off"
            mode = SharingMode.EXCLUSIVE
        devices.append(
            Device(
                info.uuid,
                info.index,
                model,
                mode,
                sharing.mps_client_limit,
                sharing.replicas if mode is SharingMode.TIME_SLICING else 1,
                static,
                allowed,
                healthy=not reason,
                unhealthy_reason=reason,
                mig_taken=tuple(sorted(taken, key=lambda i: i.start)),
                mig_managed=tuple(sorted(ours, key=lambda i: i.start)),
                stray_memory_mib=(stray or {}).get(info.uuid, 0) if modes.of(mode).counts_stray else 0,
            )
        )
        for peer in peers.get(info.uuid, ()):
            if peer in index_of:
                a, b = sorted((info.index, index_of[peer]))
                links.add((a, b))
    node = Node(
        config.node,
        0,
        0,
        tuple(devices),
        nvlink=frozenset(links),
        mps_compute_oversub_pct=config.mps_compute_oversub_pct,
        ts_memory_oversub_pct=config.ts_memory_oversub_pct,
    )
    return node, warnings
