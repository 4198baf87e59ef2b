"""What a container is given for its share: the kubelet's ``ContainerAllocateResponse``, as plain data.

* ``cdi_devices``: ``<cdiKind>=<UUID>`` per GPU, or the MIG instance's UUID; the NVIDIA
  Container Toolkit's CDI specification resolves them. The same names go into the
  ``cdi.k8s.io/`` annotation, which containerd reads where the kubelet predates the field.
* MPS: ``CUDA_MPS_PIPE_DIRECTORY`` with the daemon's pipe directory mounted there, the
  thread percentage (the record's compute) and the pinned memory limit per device. Inside
  the container its GPUs are numbered from 0 in host index order, so the limit is
  ``0=<MiB>M`` for a one-GPU share (the record's own index is the host's).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from scheduler.core import modes
from scheduler.core.allocation import Allocation

from .config import AgentConfig

ANNOTATION_PREFIX = "cdi.k8s.io/"


@dataclass(frozen=True, slots=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class Answer:
    """The answer to one container's Allocate, and the pod it was taken from."""

    pod: str
    cdi_devices: tuple[str, ...]
    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)


def answer(
    config: AgentConfig, pod: str, alloc: Allocation, names: Mapping[int, str], pipes: Mapping[int, str], share_id: str
) -> Answer:
    """The answer for ``pod``'s record: ``names`` is the UUID to hand over per GPU index,
    ``pipes`` the MPS pipe directory (host) per MPS GPU index."""
    shares = sorted(alloc.shares, key=lambda s: s.index)
    cdi = tuple(f"{config.cdi_kind}={names[s.index]}" for s in shares)
    envs: dict[str, str] = {"GPUSLICE_POD": pod}
    mounts: list[Mount] = []
    mps = [(ordinal, s) for ordinal, s in enumerate(shares) if modes.of(s.mode).control_daemon]
    if mps:
        directory = config.mps.container_pipe_directory
        host = {pipes[s.index] for _, s in mps}
        (only,) = host  # the caller refuses an MPS share whose GPUs have different daemons
        mounts.append(Mount(directory, only))
        envs["CUDA_MPS_PIPE_DIRECTORY"] = directory
        threads = alloc.mps_thread_percentage()
        if threads is not None:
            envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(threads)
        envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(f"{k}={s.memory_mib}M" for k, s in mps)
    key = ANNOTATION_PREFIX + "gpuslice_" + share_id
    return Answer(pod, cdi, envs, tuple(mounts), {key: ",".join(cdi)})
