"""Reservation prices of GPU groups for pods that could go elsewhere (pure functions).

A group is the GPUs of one model and sharing mode (:mod:`scheduler.core.groups`). Pods
pinned to some groups (a model list, a sharing mode, or a size only some nodes hold) can
only use those; the others may use any. Let vol(A) be the GPU requested so far by pods
whose allowed groups are A, V the total, R_g the free GPU of group g and R the cluster's.
The *pinned load* on g splits each constrained class over its groups by free capacity:

    L_g = sum over A != all groups, g in A, of vol(A) * R_g / R_A

and g's *pressure* is rho_g = (L_g / V) / (R_g / R): the share of the arriving GPU that
only a few groups, g among them, can take, per share of the cluster's free GPU that g
holds. If the mix of arrivals holds, pinned pods alone fill g before the cluster fills
when rho_g >= 1, and then every GPU a flexible pod takes there is one a pinned pod will
miss. The price of a GPU on g is ramp(rho_g) = clip((rho_g - start) / (1 - start), 0, 1):
nothing while the pinned demand leaves room, one GPU's worth per GPU taken once it does
not. A pod pays the price of the group it is placed on, scaled by the GPU it takes;
within its own allowed groups only differences of price matter, so a pod pinned to one
group pays the same everywhere it can go.
"""

from __future__ import annotations

import numpy as np

from ..capacity import GAP_LEVELS
from ..inventory import Device
from ..request import MILLI, GpuKind, GpuRequest

_LEVEL_MILLI = 1000 // GAP_LEVELS  # milli-GPU per gap level


def free_by_group(gaps: np.ndarray) -> np.ndarray:
    """Free milli-GPU per group from per-group gap histograms ``gaps[g, level]``."""
    levels = np.arange(gaps.shape[1], dtype=np.float64) * _LEVEL_MILLI
    result: np.ndarray = gaps @ levels
    return result


def pinned_load(masks: np.ndarray, volumes: np.ndarray, free: np.ndarray) -> np.ndarray:
    """L_g per group: each constrained class's volume split over its groups by free GPU.

    ``masks[k, g]``: whether class k may use group g; ``volumes[k]``: the GPU its pods
    requested. A class allowed on every group is flexible and carries no pinned load; a
    class whose groups are all full spreads evenly over them.
    """
    pinned = ~masks.all(axis=1)
    members = masks[pinned].astype(np.float64)
    volume = volumes[pinned]
    room = members @ free
    count = members.sum(axis=1)
    even = room <= 0
    weights = np.where(
        even[:, None], members / np.maximum(count, 1)[:, None], members * free / np.where(even, 1.0, room)[:, None]
    )
    result: np.ndarray = volume @ weights
    return result


def inside(masks: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Per class, whether it sits strictly inside the groups ``allowed``: every group it may
    use is allowed, and it may use fewer (the classes a pod of ``allowed`` is priced for)."""
    result: np.ndarray = (masks <= allowed[None, :]).all(axis=1) & (masks != allowed[None, :]).any(axis=1)
    return result


def pressure(masks: np.ndarray, volumes: np.ndarray, free: np.ndarray) -> np.ndarray:
    """rho_g per group (0 where nothing is pinned; infinite where a pinned group is full)."""
    total_volume = float(volumes.sum())
    total_free = float(free.sum())
    if total_volume <= 0 or total_free <= 0:
        return np.zeros(free.size)
    load = pinned_load(masks, volumes, free) / total_volume
    share = free / total_free
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = np.where(share > 0, load / np.maximum(share, 1e-12), np.where(load > 0, np.inf, 0.0))
    result: np.ndarray = rho
    return result


def price(rho: np.ndarray, start: float) -> np.ndarray:
    """ramp(rho) = clip((rho - start) / (1 - start), 0, 1): the share of a GPU taken on the
    group that pinned pods will miss."""
    result: np.ndarray = np.clip((rho - start) / (1.0 - start), 0.0, 1.0)
    return result


def milli_on(gpu: GpuRequest, device: Device) -> float:
    """The milli-GPU a request takes on ``device``: 1000 per whole GPU, a MIG profile's compute
    slices out of 7, a share the larger of its compute and its memory as parts of the GPU."""
    if gpu.kind is GpuKind.NONE:
        return 0.0
    count = max(1, gpu.count)
    if gpu.kind is GpuKind.WHOLE:
        return float(MILLI * count)
    if gpu.kind is GpuKind.MIG:
        assert gpu.profile is not None
        return MILLI * gpu.profile.compute_slices / 7
    memory, compute = gpu.share_on(device)
    per_gpu = max(compute, memory * MILLI / max(1, device.memory_mib))
    return float(min(MILLI, per_gpu) * count)


def squash(scores: np.ndarray) -> np.ndarray:
    """Scores kept in 0..100 without changing their order: below 1, v -> 1 / (2 - v); above 99,
    v -> 100 - 1 / (v - 98)."""
    low = scores < 1.0
    high = scores > 99.0
    out = scores.copy()
    out[low] = 1.0 / (2.0 - scores[low])
    out[high] = 100.0 - 1.0 / (scores[high] - 98.0)
    return out
