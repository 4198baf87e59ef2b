"""One sample of what runs on the node's GPUs, per share and per stray process.

Each compute process NVML lists (host PID, used memory, SM utilisation where NVML samples it)
is mapped to its pod through its cgroup (:mod:`scheduler.agent.procs`) and then to a share: the
share of that pod's counting record (live, ``bind-phase: bound``, naming this node) on that GPU,
and on a MIG GPU in the instance at the record's placement. A process that maps to no share
is **stray**: a host process, a pod without a gpuslice record (another scheduler's, or one
that set ``NVIDIA_VISIBLE_DEVICES=all``), a pod on a GPU or MIG instance its record does not
name. Every process is attributed by its cgroup, never by its name: an MPS control daemon or
server counts as neither share nor stray only when it is the node's (outside every pod, or in
the agent's own pod, whose child it is: :meth:`~scheduler.agent.procs.Owner.plumbing`); a PID
that is gone by the time its cgroup is read is left out of this sample. A GPU whose processes
could not be read gives its shares ``measured=False``: unknown, not idle.

Every share of every counting record is in the sample, with no process too (allocated but
idle is what an operator wants to see). Compute used is the sum of the processes' SM
utilisation, in milli-GPU (1 percent = 10 milli): 0 with no process; None on MIG shares and
where NVML gave none for the processes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scheduler.core.allocation import DeviceShare
from scheduler.core.inventory import SharingMode

from .gpus import GpuError, GpuInfo, Gpus, MigInfo, ProcessInfo
from .inventory import model_of
from .pods import PodInfo
from .procs import Owner, ProcReader


@dataclass(frozen=True, slots=True)
class ProcessUse:
    pid: int
    memory_mib: int
    sm_percent: int | None
    container: str  # the container's name ("" when its status does not list it yet)


@dataclass(frozen=True, slots=True)
class ShareUse:
    """One pod's share of one GPU: what its record gives, and what its processes use."""

    pod: str  # namespace/name
    uid: str
    gpu_index: int
    gpu_uuid: str
    model: str
    mode: SharingMode
    mig_profile: str  # "" unless a MIG share
    allocated_memory_mib: int
    allocated_compute_milli: int
    used_memory_mib: int
    used_compute_milli: int | None
    processes: tuple[ProcessUse, ...]
    measured: bool = True  # False: its GPU's processes could not be read (unknown, not "under")

    @property
    def namespace(self) -> str:
        return self.pod.split("/", 1)[0]

    @property
    def name(self) -> str:
        return self.pod.split("/", 1)[1]

    @property
    def key(self) -> tuple[str, int]:
        """(pod UID, GPU index): one share, for as long as that pod lives."""
        return self.uid, self.gpu_index


@dataclass(frozen=True, slots=True)
class Stray:
    """A process on a GPU that no counting record on that GPU accounts for."""

    gpu_index: int
    gpu_uuid: str
    instance_uuid: str
    pid: int
    memory_mib: int
    pod: str  # the pod it runs in (namespace/name), "" for a host process or a pod not known here
    why: str  # one line: whose it is and why no share accounts for it

    @property
    def who(self) -> str:
        """Its owner, for rate-limiting reports: the pod, else the reason."""
        return self.pod or self.why


@dataclass(frozen=True, slots=True)
class Sample:
    gpus: tuple[GpuInfo, ...] = ()
    shares: tuple[ShareUse, ...] = ()
    strays: tuple[Stray, ...] = ()
    used_mib: Mapping[str, int] | None = None  # GPU UUID -> memory of every process on it
    problems: tuple[str, ...] = ()  # GPUs whose processes could not be read this time

    def stray_memory_mib(self) -> dict[str, int]:
        """GPU UUID -> memory stray processes hold, for GPUs not in MIG mode (on a MIG GPU a
        stray process sits in some instance and takes no free slot)."""
        mig = {g.uuid for g in self.gpus if g.mig_enabled}
        out: dict[str, int] = {}
        for stray in self.strays:
            if stray.gpu_uuid not in mig:
                out[stray.gpu_uuid] = out.get(stray.gpu_uuid, 0) + stray.memory_mib
        return out


def _instance_of(share: DeviceShare, instances: tuple[MigInfo, ...]) -> str:
    """The UUID of the MIG instance at the share's placement ("" if there is none yet)."""
    if share.mig is None:
        return ""
    found = next((i for i in instances if i.start == share.mig.start and i.memory_slots == share.mig.size), None)
    return found.uuid if found is not None else ""


def _why(owner: Owner, pod: PodInfo | None, gpu: GpuInfo, proc: ProcessInfo, share: DeviceShare | None) -> str:
    if not owner.in_pod:
        return f"host process {owner.command or '?'}".rstrip()
    if pod is None:
        return f"pod UID {owner.pod_uid}, not a live pod on this node"
    if pod.allocation is None:
        return f"pod {pod.key} has no gpuslice record that counts ({pod.problem or 'placed by another scheduler'})"
    if share is None:
        named = ", ".join(str(s.index) for s in pod.allocation.shares) or "none"
        return f"pod {pod.key}'s record names GPU {named}, not GPU {gpu.index}"
    assert share.mig is not None
    return (
        f"pod {pod.key} runs in MIG instance {proc.instance_uuid}; its record names "
        f"{share.mig.profile} at slot {share.mig.start}"
    )


def take(gpus: Gpus, pods: Iterable[PodInfo], procs: ProcReader) -> Sample:
    """Read every GPU's processes once and map them to shares and strays."""
    devices = gpus.devices()
    by_uid = {p.uid: p for p in pods if p.uid}
    uses: dict[tuple[str, int], list[ProcessUse]] = {}
    strays: list[Stray] = []
    used_mib: dict[str, int] = {}
    problems: list[str] = []
    instances: dict[str, tuple[MigInfo, ...]] = {}
    unread: set[str] = set()
    own = procs.own_pod_uid()
    for gpu in devices:
        try:
            listed = gpus.processes(gpu.uuid)
            instances[gpu.uuid] = gpus.mig_instances(gpu.uuid) if gpu.mig_enabled else ()
        except GpuError as exc:
            problems.append(f"GPU {gpu.index}: processes not read: {exc}")
            unread.add(gpu.uuid)
            continue
        used_mib[gpu.uuid] = sum(p.used_memory_mib for p in listed)
        for proc in listed:
            owner = procs.owner(proc.pid)
            if owner is None or owner.plumbing(own):
                continue
            pod = by_uid.get(owner.pod_uid) if owner.in_pod else None
            share = None
            if pod is not None and pod.allocation is not None:
                share = next((s for s in pod.allocation.shares if s.index == gpu.index), None)
            inside = share is not None and (
                share.mig is None or _instance_of(share, instances[gpu.uuid]) == proc.instance_uuid
            )
            if pod is not None and share is not None and inside:
                container = pod.container_name(owner.container_id)
                uses.setdefault((pod.uid, gpu.index), []).append(
                    ProcessUse(proc.pid, proc.used_memory_mib, proc.sm_percent, container)
                )
                continue
            why = _why(owner, pod, gpu, proc, share)
            strays.append(
                Stray(
                    gpu.index, gpu.uuid, proc.instance_uuid, proc.pid, proc.used_memory_mib, pod.key if pod else "", why
                )
            )
    shares = []
    by_index = {g.index: g for g in devices}
    for pod in sorted(by_uid.values(), key=lambda p: p.key):
        for share in pod.allocation.shares if pod.allocation is not None else ():
            held = by_index.get(share.index)
            if held is None:
                continue  # the record names a GPU this node does not have (Allocate refuses it)
            procs_here = tuple(uses.get((pod.uid, share.index), ()))
            sm = [p.sm_percent for p in procs_here if p.sm_percent is not None]
            compute = None if share.mig is not None or (procs_here and not sm) else sum(sm) * 10
            shares.append(
                ShareUse(
                    pod.key,
                    pod.uid,
                    held.index,
                    held.uuid,
                    model_of(held).name,
                    share.mode,
                    share.mig.profile if share.mig is not None else "",
                    share.memory_mib,
                    share.compute_milli,
                    sum(p.memory_mib for p in procs_here),
                    None if held.uuid in unread else compute,
                    procs_here,
                    held.uuid not in unread,
                )
            )
    return Sample(devices, tuple(shares), tuple(strays), used_mib, tuple(problems))
