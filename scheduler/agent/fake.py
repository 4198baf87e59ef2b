"""In-memory GPUs for the agent, loaded from a small YAML file: any catalogue model, MIG mode,
MIG instances at placements, processes with host PIDs and used memory, NVLink and XID events.

    gpus:
      - model: A100-80GB          # a catalogue name (memoryMiB / smCount to override)
        uuid: GPU-a100-0          # default GPU-fake-<index>
        mig: true                 # MIG mode (never changed by the agent)
        instances:                # MIG instances already there (made by hand)
          - {profile: 3g.40gb, start: 4, uuid: MIG-hand-0}
        processes:
          - {pid: 4242, usedMemoryMiB: 2048, instance: MIG-hand-0}
          - {pid: 4243, usedMemoryMiB: 512, smPercent: 35}   # SM utilisation (not on MIG)
        nvlink: [1]               # peer indices
        xids: [79]                # XID events waiting to be read

The MIG slot rules are the core's (scheduler.core.mig), so a placement the hardware would
refuse is refused here too. Tests drive it further through its methods (``xid``,
``fail_next_create``, ``add_process``, ``set_process``, ``remove_process``).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from scheduler.core import mig
from scheduler.core.allocation import MigSlot
from scheduler.core.catalog import CATALOG, GpuModel, MigProfile
from scheduler.core.errors import ConfigError

from .gpus import GpuError, GpuInfo, HealthEvent, MigInfo, ProcessInfo, fatal

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "fake-gpus.yaml"
GPU_KEYS = ("model", "uuid", "memoryMiB", "smCount", "mig", "instances", "processes", "nvlink", "xids")
PROCESS_KEYS = ("pid", "usedMemoryMiB", "instance", "smPercent")


@dataclass
class _Gpu:
    info: GpuInfo
    model: GpuModel
    instances: list[MigInfo] = field(default_factory=list)
    processes: list[ProcessInfo] = field(default_factory=list)
    peers: tuple[int, ...] = ()


def _profile_of(model: GpuModel, slices: int, slots: int) -> MigProfile | None:
    layout = model.mig
    if layout is None:
        return None
    return next((p for p in layout.profiles if (p.compute_slices, p.memory_slots) == (slices, slots)), None)


class FakeGpus:
    """The :class:`~scheduler.agent.gpus.Gpus` seam in memory; thread-safe."""

    def __init__(self, gpus: list[_Gpu], events: list[HealthEvent] | None = None) -> None:
        self._gpus = gpus
        self._events = list(events or [])
        self._fail: str | None = None
        self._unreadable: dict[str, str] = {}  # GPU UUID -> why its processes cannot be read
        self._lock = threading.Lock()
        self._made = 0
        self.calls: list[str] = []  # every change made: "create ...", "destroy ..."

    # ------------------------------------------------------------ loading

    @classmethod
    def load(cls, path: str | Path) -> FakeGpus:
        """From a YAML file, or the packaged example for ``"example"``; ConfigError names the field."""
        where = EXAMPLE if str(path) == "example" else Path(path)
        try:
            body = yaml.safe_load(where.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"fake GPUs {where}: cannot read: {exc}") from exc
        return cls.from_mapping(body, str(where))

    @classmethod
    def from_mapping(cls, body: object, where: str = "fake GPUs") -> FakeGpus:
        if not isinstance(body, Mapping) or not isinstance(body.get("gpus"), list):
            raise ConfigError(f"{where}: expected a mapping with a 'gpus' list")
        gpus: list[_Gpu] = []
        events: list[HealthEvent] = []
        for index, raw in enumerate(body["gpus"]):
            path = f"{where}: gpus[{index}]"
            gpu, xids = _gpu(path, index, raw)
            gpus.append(gpu)
            events.extend(HealthEvent(gpu.info.uuid, x, "") for x in xids if fatal(x))
        return cls(gpus, events)

    # ------------------------------------------------------------ the seam

    def _find(self, uuid: str) -> _Gpu:
        for gpu in self._gpus:
            if gpu.info.uuid == uuid:
                return gpu
        raise GpuError(f"no GPU {uuid}")

    def devices(self) -> tuple[GpuInfo, ...]:
        with self._lock:
            return tuple(g.info for g in self._gpus)

    def mig_instances(self, gpu_uuid: str) -> tuple[MigInfo, ...]:
        with self._lock:
            return tuple(sorted(self._find(gpu_uuid).instances, key=lambda i: i.start))

    def create_mig(self, gpu_uuid: str, compute_slices: int, memory_slots: int, start: int) -> MigInfo:
        with self._lock:
            gpu = self._find(gpu_uuid)
            if not gpu.info.mig_enabled:
                raise GpuError(f"GPU {gpu.info.index}: MIG mode is off")
            if self._fail is not None:
                failure, self._fail = self._fail, None
                raise GpuError(failure)
            profile = _profile_of(gpu.model, compute_slices, memory_slots)
            layout = gpu.model.mig
            if profile is None or layout is None:
                raise GpuError(f"GPU {gpu.info.index}: no MIG profile of {compute_slices} slices, {memory_slots} slots")
            used = tuple(MigSlot(i.start, i.memory_slots, i.compute_slices, self._name(gpu, i)) for i in gpu.instances)
            problem = mig.why_not(layout, used, profile, start)
            if problem is not None:
                raise GpuError(f"GPU {gpu.info.index}: insufficient resources for {profile.name} at {start}: {problem}")
            self._made += 1
            made = MigInfo(gpu_uuid, f"MIG-fake-{gpu.info.index}-{self._made}", compute_slices, memory_slots, start)
            gpu.instances.append(made)
            self.calls.append(f"create {gpu.info.index} {profile.name}@{start}")
            return made

    def destroy_mig(self, gpu_uuid: str, uuid: str) -> None:
        with self._lock:
            gpu = self._find(gpu_uuid)
            found = next((i for i in gpu.instances if i.uuid == uuid), None)
            if found is None:
                raise GpuError(f"GPU {gpu.info.index}: no MIG instance {uuid}")
            if any(p.instance_uuid == uuid for p in gpu.processes):
                raise GpuError(f"GPU {gpu.info.index}: MIG instance {uuid} is in use")
            gpu.instances.remove(found)
            self.calls.append(f"destroy {gpu.info.index} {self._name(gpu, found)}@{found.start}")

    def processes(self, gpu_uuid: str) -> tuple[ProcessInfo, ...]:
        with self._lock:
            if gpu_uuid in self._unreadable:
                raise GpuError(self._unreadable[gpu_uuid])
            return tuple(self._find(gpu_uuid).processes)

    def nvlink_peers(self, gpu_uuid: str) -> tuple[str, ...]:
        with self._lock:
            gpu = self._find(gpu_uuid)
            return tuple(self._gpus[p].info.uuid for p in gpu.peers if 0 <= p < len(self._gpus))

    def health_events(self) -> tuple[HealthEvent, ...]:
        with self._lock:
            out, self._events = tuple(self._events), []
            return out

    def close(self) -> None:
        pass

    # ------------------------------------------------------------ test hooks

    def xid(self, index: int, xid: int, description: str = "") -> None:
        """The GPU reports an XID (only fatal ones become health events, as in NVML's reading)."""
        with self._lock:
            if fatal(xid):
                self._events.append(HealthEvent(self._gpus[index].info.uuid, xid, description))

    def fail_process_reads(self, index: int, problem: str | None) -> None:
        """NVML cannot list the GPU's processes (``problem``) until called again with None."""
        with self._lock:
            uuid = self._gpus[index].info.uuid
            if problem is None:
                self._unreadable.pop(uuid, None)
            else:
                self._unreadable[uuid] = problem

    def fail_next_create(self, problem: str) -> None:
        with self._lock:
            self._fail = problem

    def make_by_hand(self, index: int, profile: str, start: int) -> MigInfo:
        """An instance created outside the agent (as ``nvidia-smi mig -cgi ... -C`` would)."""
        gpu = self._gpus[index]
        assert gpu.model.mig is not None
        found = gpu.model.mig.profile(profile)
        assert found is not None, profile
        return self.create_mig(gpu.info.uuid, found.compute_slices, found.memory_slots, start)

    def add_process(
        self, index: int, pid: int, used_memory_mib: int, instance_uuid: str = "", sm_percent: int | None = None
    ) -> None:
        with self._lock:
            gpu = self._gpus[index]
            gpu.processes.append(ProcessInfo(pid, used_memory_mib, gpu.info.uuid, instance_uuid, sm_percent))

    def set_process(self, index: int, pid: int, used_memory_mib: int, sm_percent: int | None = None) -> None:
        """The process's memory (and SM utilisation) changes, as a running job's does."""
        with self._lock:
            gpu = self._gpus[index]
            gpu.processes = [
                replace(p, used_memory_mib=used_memory_mib, sm_percent=sm_percent) if p.pid == pid else p
                for p in gpu.processes
            ]

    def remove_process(self, index: int, pid: int) -> None:
        with self._lock:
            gpu = self._gpus[index]
            gpu.processes = [p for p in gpu.processes if p.pid != pid]

    def remove_processes(self, index: int) -> None:
        with self._lock:
            self._gpus[index].processes.clear()

    def reboot(self) -> None:
        """A node reboot: every MIG instance and process is gone (MIG mode stays)."""
        with self._lock:
            for gpu in self._gpus:
                gpu.instances.clear()
                gpu.processes.clear()

    def instance_names(self, index: int) -> list[str]:
        """``profile@start`` of each instance of one GPU, by start (for tests)."""
        with self._lock:
            gpu = self._gpus[index]
            return [f"{self._name(gpu, i)}@{i.start}" for i in sorted(gpu.instances, key=lambda i: i.start)]

    @staticmethod
    def _name(gpu: _Gpu, inst: MigInfo) -> str:
        profile = _profile_of(gpu.model, inst.compute_slices, inst.memory_slots)
        return profile.name if profile is not None else f"{inst.compute_slices}g?"


def _int(path: str, raw: Mapping[str, Any], key: str, default: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{path}.{key}: must be a whole number >= 0, got {value!r}")
    return value


def _gpu(path: str, index: int, raw: object) -> tuple[_Gpu, list[int]]:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path}: must be a mapping with a 'model'")
    unknown = sorted(set(raw) - set(GPU_KEYS))
    if unknown:
        raise ConfigError(f"{path}.{unknown[0]}: unknown key; accepted: {', '.join(GPU_KEYS)}")
    name = raw.get("model")
    if name not in CATALOG:
        raise ConfigError(f"{path}.model: {name!r} is not a catalogue model; accepted: {', '.join(sorted(CATALOG))}")
    base = CATALOG[name]
    model = replace(base, memory_mib=_int(path, raw, "memoryMiB", base.memory_mib))
    uuid = raw.get("uuid", f"GPU-fake-{index}")
    if not isinstance(uuid, str) or not uuid:
        raise ConfigError(f"{path}.uuid: must be a non-empty string")
    enabled = raw.get("mig", False)
    if not isinstance(enabled, bool) or (enabled and model.mig is None):
        raise ConfigError(f"{path}.mig: must be true or false (true only for a MIG-capable model)")
    info = GpuInfo(
        uuid, index, f"NVIDIA {model.name}", model.memory_mib, _int(path, raw, "smCount", base.sm_count), enabled
    )
    gpu = _Gpu(info, model)
    used: tuple[MigSlot, ...] = ()
    for k, inst in enumerate(raw.get("instances") or []):
        where = f"{path}.instances[{k}]"
        if not enabled or model.mig is None or not isinstance(inst, Mapping):
            raise ConfigError(f"{where}: instances need mig: true, each a mapping {{profile, start, uuid}}")
        profile = model.mig.profile(str(inst.get("profile")))
        start = _int(where, inst, "start", -1) if "start" in inst else -1
        problem = "no such profile" if profile is None else mig.why_not(model.mig, used, profile, start)
        if profile is None or problem is not None:
            raise ConfigError(f"{where}: {inst.get('profile')!r} at {start}: {problem}")
        used = (*used, mig.slot_of(profile, start))
        gpu.instances.append(
            MigInfo(
                uuid, str(inst.get("uuid") or f"MIG-{uuid}-{k}"), profile.compute_slices, profile.memory_slots, start
            )
        )
    for k, proc in enumerate(raw.get("processes") or []):
        where = f"{path}.processes[{k}]"
        if not isinstance(proc, Mapping):
            raise ConfigError(f"{where}: must be a mapping {{pid, usedMemoryMiB, instance, smPercent}}")
        unknown = sorted(set(proc) - set(PROCESS_KEYS))
        if unknown:
            raise ConfigError(f"{where}.{unknown[0]}: unknown key; accepted: {', '.join(PROCESS_KEYS)}")
        sm = _int(where, proc, "smPercent", 0) if "smPercent" in proc else None
        if sm is not None and (sm > 100 or proc.get("instance")):
            raise ConfigError(f"{where}.smPercent: 0..100, and NVML gives none in a MIG instance")
        gpu.processes.append(
            ProcessInfo(
                _int(where, proc, "pid", 0),
                _int(where, proc, "usedMemoryMiB", 0),
                uuid,
                str(proc.get("instance") or ""),
                sm,
            )
        )
    peers = raw.get("nvlink") or []
    xids = raw.get("xids") or []
    for key, values in (("nvlink", peers), ("xids", xids)):
        if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise ConfigError(f"{path}.{key}: must be a list of whole numbers")
    gpu.peers = tuple(peers)
    return gpu, list(xids)
