"""Does a pod fit on a node, and on which concrete shares?

``fit`` returns every candidate allocation (one per GPU for single-GPU requests, with
MIG starts already chosen by the slot rule), or a short stable reason why none exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations, islice
from math import comb

import networkx as nx

from . import mig
from .allocation import Allocation, DeviceShare
from .catalog import MigProfile
from .inventory import Device, Node, SharingMode
from .memo import intern
from .request import MILLI, Demand, GpuKind, GpuRequest
from .state import DeviceUsage, NodeState, why_not

_MAX_COMBINATIONS = 4096


@dataclass(frozen=True, slots=True)
class Fit:
    allocations: tuple[Allocation, ...] = ()
    reason: str = ""

    def __bool__(self) -> bool:
        return bool(self.allocations)


def _mig_share(gpu: GpuRequest, device: Device, usage: DeviceUsage, profiles: list[MigProfile]) -> DeviceShare | str:
    layout = device.model.mig
    assert layout is not None
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
                return DeviceShare(
                    inst.uuid or device.uuid,
                    device.index,
                    SharingMode.MIG,
                    profile.memory_mib,
                    profile.compute_slices * 1000 // layout.compute_slices,
                    mig.slot_of(profile, inst.start),
                )
            continue
        start = mig.best_start(layout, usage.mig, profile)
        if start is not None:
            return DeviceShare(
                device.uuid,
                device.index,
                SharingMode.MIG,
                profile.memory_mib,
                profile.compute_slices * 1000 // layout.compute_slices,
                mig.slot_of(profile, start),
            )
    names = "|".join(p.name for p in profiles) or (gpu.profile.text if gpu.profile else "the request")
    return f"no free MIG slot for {names}"


def device_share(gpu: GpuRequest, node: Node, device: Device, usage: DeviceUsage) -> DeviceShare | str:
    """The share ``gpu`` would get on one device, or why it cannot."""
    if device.mode is SharingMode.MIG:
        layout = device.model.mig
        allowed = device.allowed_profiles()
        if layout is None or not allowed:
            return f"GPU {device.index} has no MIG profiles"
        if gpu.kind is GpuKind.MIG:
            assert gpu.profile is not None
            wanted = layout.match(gpu.profile)
            if wanted is None or wanted not in allowed:
                return f"no MIG profile {gpu.profile.text} on {device.model.name}"
            return _mig_share(gpu, device, usage, [wanted])
        if gpu.kind is not GpuKind.SHARE:
            return f"GPU {device.index} is partitioned by MIG; whole GPUs need another mode"
        memory, compute = gpu.share_on(device)
        covering = sorted(
            (
                p
                for p in allowed
                if p.memory_mib >= memory and p.compute_slices * 1000 >= compute * layout.compute_slices
            ),
            key=lambda p: (p.memory_slots, p.compute_slices),
        )
        if not covering:
            return (
                f"needs {memory} MiB and {compute / 10:g}% compute, larger than any MIG profile of GPU {device.index}"
            )
        return _mig_share(gpu, device, usage, covering)
    if gpu.kind is GpuKind.MIG:
        return f"GPU {device.index} is not in MIG mode"
    memory, compute = gpu.share_on(device)
    if device.mode is SharingMode.EXCLUSIVE and memory <= device.memory_mib and compute <= MILLI:
        if (memory, compute) != (device.memory_mib, MILLI) and SharingMode.EXCLUSIVE not in gpu.sharing:
            # Given whole, an exclusive GPU would waste the rest of itself on part of a request:
            # part of a GPU goes to a shared one, unless the pod accepts a whole GPU instead.
            return f"GPU {device.index} is exclusive: part of a GPU needs a shared GPU, or sharing listing exclusive"
        memory, compute = device.memory_mib, MILLI  # an exclusive GPU is given whole, whatever was asked
    share = DeviceShare(device.uuid, device.index, device.mode, memory, compute)
    problem = why_not(node, device, usage, share)
    return share if problem is None else problem


def _best_connected(node: Node, indices: list[int], count: int) -> list[int]:
    """The ``count`` GPUs with the most NVLink edges among them; lowest indices on ties."""
    if not node.nvlink or comb(len(indices), count) > _MAX_COMBINATIONS:
        return indices[:count]
    return list(_best_set(node.nvlink, tuple(indices), count))


@lru_cache(maxsize=4096)
def _best_set(links: frozenset[tuple[int, int]], indices: tuple[int, ...], count: int) -> tuple[int, ...]:
    # Many nodes share a topology and a set of free GPUs: the answer is cached by them.
    graph = nx.Graph()
    graph.add_nodes_from(indices)
    graph.add_edges_from(e for e in links if e[0] in graph and e[1] in graph)
    return max(
        islice(combinations(indices, count), _MAX_COMBINATIONS),
        key=lambda c: (graph.subgraph(c).number_of_edges(), [-i for i in c]),
    )


def _gpu_reason(gpu: GpuRequest, node: Node, reasons: list[tuple[int, str]]) -> str:
    models = {d.model.name for d in node.devices}
    if not node.devices:
        return "node has no GPUs"
    if gpu.models and not any(gpu.allows_model(m) for m in models):
        return f"model {'|'.join(sorted(models))} not in {'|'.join(gpu.models)}"
    modes = {d.mode for d in node.devices if gpu.allows_model(d.model.name)}
    if gpu.sharing and not any(gpu.allows_mode(m) for m in modes):
        return f"no GPU in sharing mode {'|'.join(sorted(gpu.sharing))}"
    if gpu.kind is GpuKind.MIG and SharingMode.MIG not in modes:
        return "no GPU in MIG mode"
    # The device closest to fitting (most free memory) explains best why nothing fits.
    _, reason = max(reasons, key=lambda r: r[0]) if reasons else (0, "no GPU matches")
    if "MiB on one GPU" in reason:
        largest = max(r[0] for r in reasons)
        reason = reason.split(", free")[0] + f", largest free {largest} MiB"
    return reason


def gpu_options(gpu: GpuRequest, state: NodeState) -> tuple[list[DeviceShare], list[tuple[int, str]]]:
    """One candidate share per GPU that can host ``gpu`` (memoised on the state), and the
    others' reasons with their free memory."""
    key = intern(("gpu-options", gpu))
    hit: tuple[list[DeviceShare], list[tuple[int, str]]] | None = state.memo.get(key)
    if hit is not None:
        return hit
    node = state.node
    options: list[DeviceShare] = []
    reasons: list[tuple[int, str]] = []
    for device, usage in zip(node.devices, state.usage, strict=True):
        if not gpu.allows_model(device.model.name) or not gpu.allows_mode(device.mode):
            continue
        result = device_share(gpu, node, device, usage)
        if isinstance(result, str):
            reasons.append((device.memory_mib - usage.memory_mib, result))
        else:
            options.append(result)
    state.memo[key] = (options, reasons)
    return options, reasons


def host_reason(demand: Demand, state: NodeState) -> str | None:
    """Why the node's pod room, CPU or memory cannot take ``demand`` (None if they can)."""
    node = state.node
    if len(state.pods) >= node.max_pods:
        return f"node already holds its maximum of {node.max_pods} pods"
    if demand.cpu_milli > state.cpu_free:
        return f"insufficient cpu: needs {demand.cpu_milli}m, {state.cpu_free}m free"
    if demand.memory_mib > state.memory_free:
        return f"insufficient memory: needs {demand.memory_mib} MiB, {state.memory_free} MiB free"
    return None


def gpu_fit(demand: Demand, state: NodeState) -> Fit:
    """The GPU half of :func:`fit`: every allocation of ``demand``'s GPU request, host
    resources not checked (the allocations still carry the pod's CPU and memory)."""
    node = state.node
    gpu = demand.gpu
    if gpu.kind is GpuKind.NONE:
        return Fit((Allocation(node.name, (), demand.cpu_milli, demand.memory_mib),))
    options, reasons = gpu_options(gpu, state)
    if gpu.count <= 1:
        if not options:
            return Fit(reason=_gpu_reason(gpu, node, reasons))
        return Fit(tuple(Allocation(node.name, (s,), demand.cpu_milli, demand.memory_mib) for s in options))
    if len(options) < gpu.count:
        why = f"needs {gpu.count} GPUs for {gpu.describe()}, {len(options)} available"
        if reasons:
            why += f" ({_gpu_reason(gpu, node, reasons)})"
        return Fit(reason=why)
    chosen = _best_connected(node, [s.index for s in options], gpu.count)
    by_index = {s.index: s for s in options}
    shares = tuple(by_index[i] for i in sorted(chosen))
    return Fit((Allocation(node.name, shares, demand.cpu_milli, demand.memory_mib),))


def fit(demand: Demand, state: NodeState) -> Fit:
    """Every allocation of ``demand`` on ``state``'s node, or the reason there is none."""
    reason = host_reason(demand, state)
    return Fit(reason=reason) if reason is not None else gpu_fit(demand, state)
