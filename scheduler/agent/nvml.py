"""The :class:`~scheduler.agent.gpus.Gpus` seam on the real NVML, through nvidia-ml-py (``pynvml``).

``pynvml`` is imported when :class:`NvmlGpus` is built, so everything else imports on a
machine with no driver. Every NVML error becomes a :class:`GpuError` naming the call.
Nothing here can change MIG mode; ``create_mig`` / ``destroy_mig`` are the only writes.

MIG shapes: NVML's GPU instance profile has ``sliceCount`` (compute slices) and its
placement ``size`` (memory slots) and ``start``, the core's slot units exactly. A MIG
instance's UUID is that of the MIG device over its compute instance; a GPU instance
without one (half made by hand) is named ``GI-<gpu uuid>-<id>``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .gpus import GpuError, GpuInfo, HealthEvent, MigInfo, ProcessInfo, fatal

MIB = 1024 * 1024


class NvmlGpus:
    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:  # a dependency of gpuslice: only a broken install lacks it
            raise GpuError(f"nvidia-ml-py is not installed: {exc}") from exc
        self._nvml: Any = pynvml
        self._lock = threading.Lock()
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise GpuError(f"NVML is not available (no NVIDIA driver here?): {exc}") from exc
        self._events: Any = None
        self._lost: set[str] = set()
        self._known: dict[int, GpuInfo] = {}
        self._util_seen: dict[str, int] = {}  # GPU UUID -> newest utilisation sample read (NVML's microseconds)
        try:
            self._events = pynvml.nvmlEventSetCreate()
            for handle in self._handles():
                # a GPU that reports no XIDs (NVML_ERROR_NOT_SUPPORTED): its health comes from polling only
                with contextlib.suppress(pynvml.NVMLError):
                    pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, self._events)
        except pynvml.NVMLError:
            self._events = None

    # ------------------------------------------------------------ helpers

    @contextmanager
    def _call(self, what: str) -> Iterator[None]:
        try:
            yield
        except self._nvml.NVMLError as exc:
            raise GpuError(f"NVML {what}: {exc}") from exc

    def _try(self, fn: Callable[..., Any] | None, default: Any, *args: Any) -> Any:
        """``fn(*args)``, or ``default`` if NVML refuses (not supported, not found) or the
        binding lacks the call (``fn`` None)."""
        if fn is None:
            return default
        try:
            return fn(*args)
        except self._nvml.NVMLError:
            return default

    def _handles(self) -> list[Any]:
        nvml = self._nvml
        return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]

    def _handle(self, uuid: str) -> Any:
        with self._call(f"device {uuid}"):
            return self._nvml.nvmlDeviceGetHandleByUUID(uuid)

    @staticmethod
    def _text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    def _mig_devices(self, handle: Any) -> Iterator[Any]:
        nvml = self._nvml
        for i in range(self._try(nvml.nvmlDeviceGetMaxMigDeviceCount, 0, handle)):
            try:
                yield nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
            except nvml.NVMLError:
                continue

    def _gpu_instances(self, handle: Any) -> Iterator[tuple[Any, Any, Any]]:
        """(GPU instance, its profile info, its GPU instance info) for every instance."""
        nvml = self._nvml
        for profile_id in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                profile = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile_id)
            except nvml.NVMLError:
                continue
            for gi in self._try(nvml.nvmlDeviceGetGpuInstances, [], handle, profile.id):
                yield gi, profile, nvml.nvmlGpuInstanceGetInfo(gi)

    # ------------------------------------------------------------ reading

    def _read(self, index: int) -> GpuInfo:
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        current, _pending = self._try(nvml.nvmlDeviceGetMigMode, (0, 0), handle)
        sms = getattr(self._try(nvml.nvmlDeviceGetAttributes, None, handle), "multiprocessorCount", 0)
        return GpuInfo(
            self._text(nvml.nvmlDeviceGetUUID(handle)),
            index,
            self._text(nvml.nvmlDeviceGetName(handle)),
            int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // MIB,
            int(sms),
            current == nvml.NVML_DEVICE_MIG_ENABLE,
        )

    def devices(self) -> tuple[GpuInfo, ...]:
        """Every GPU; one that stops answering keeps its last description (health_events says why)."""
        nvml = self._nvml
        with self._lock:
            with self._call("device count"):
                count = nvml.nvmlDeviceGetCount()
            for index in range(count):
                try:
                    self._known[index] = self._read(index)
                except nvml.NVMLError as exc:
                    if index not in self._known:
                        raise GpuError(f"NVML GPU {index}: {exc}") from exc
            return tuple(self._known[i] for i in sorted(self._known) if i < count)

    def _instances(self, gpu_uuid: str, handle: Any) -> list[tuple[MigInfo, Any]]:
        nvml = self._nvml
        uuids = {}
        for mig in self._mig_devices(handle):
            uuids[nvml.nvmlDeviceGetGpuInstanceId(mig)] = self._text(nvml.nvmlDeviceGetUUID(mig))
        out = []
        for gi, profile, info in self._gpu_instances(handle):
            uuid = uuids.get(info.id, f"GI-{gpu_uuid}-{info.id}")
            made = MigInfo(gpu_uuid, uuid, int(profile.sliceCount), int(info.placement.size), int(info.placement.start))
            out.append((made, gi))
        return sorted(out, key=lambda pair: pair[0].start)

    def mig_instances(self, gpu_uuid: str) -> tuple[MigInfo, ...]:
        with self._lock, self._call(f"MIG instances of {gpu_uuid}"):
            handle = self._handle(gpu_uuid)
            return tuple(inst for inst, _ in self._instances(gpu_uuid, handle))

    def processes(self, gpu_uuid: str) -> tuple[ProcessInfo, ...]:
        """Compute processes (MPS clients too) per GPU or MIG instance; on a whole GPU, each one's
        SM utilisation over the window since the last call (NVML keeps none per MIG instance)."""
        nvml = self._nvml
        out: list[ProcessInfo] = []
        with self._lock, self._call(f"processes of {gpu_uuid}"):
            handle = self._handle(gpu_uuid)
            migs = list(self._mig_devices(handle))
            sources = [(m, self._text(nvml.nvmlDeviceGetUUID(m))) for m in migs] or [(handle, "")]
            sm = self._sm_percent(gpu_uuid, handle) if not migs else None
            for source, instance in sources:
                seen: set[int] = set()
                listed = [
                    *self._try(nvml.nvmlDeviceGetComputeRunningProcesses, [], source),
                    *self._try(getattr(nvml, "nvmlDeviceGetMPSComputeRunningProcesses", None), [], source),
                ]
                for proc in listed:
                    pid = int(proc.pid)
                    if pid in seen:
                        continue
                    seen.add(pid)
                    used = proc.usedGpuMemory
                    memory = int(used) // MIB if isinstance(used, int) and used >= 0 else 0
                    out.append(ProcessInfo(pid, memory, gpu_uuid, instance, None if sm is None else sm.get(pid, 0)))
        return tuple(out)

    def _sm_percent(self, gpu_uuid: str, handle: Any) -> dict[int, int] | None:
        """PID -> the highest SM utilisation NVML sampled for it since the last call; None where
        NVML keeps no per-process samples. No sample since then means the processes were idle."""
        nvml = self._nvml
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(handle, self._util_seen.get(gpu_uuid, 0))
        except nvml.NVMLError as exc:
            # no sample since the timestamp (NVML answers NOT_FOUND, or SUCCESS with none)
            idle = getattr(exc, "value", None) in (nvml.NVML_ERROR_NOT_FOUND, nvml.NVML_SUCCESS)
            return {} if idle else None
        out: dict[int, int] = {}
        for sample in samples:
            pid = int(sample.pid)
            out[pid] = max(out.get(pid, 0), min(100, int(sample.smUtil)))
            self._util_seen[gpu_uuid] = max(self._util_seen.get(gpu_uuid, 0), int(sample.timeStamp))
        return out

    def nvlink_peers(self, gpu_uuid: str) -> tuple[str, ...]:
        nvml = self._nvml
        with self._lock, self._call(f"NVLink of {gpu_uuid}"):
            bus_of = {}
            switched = set()
            remote_of: dict[str, set[str]] = {}
            for handle in self._handles():
                uuid = self._text(nvml.nvmlDeviceGetUUID(handle))
                bus_of[self._text(nvml.nvmlDeviceGetPciInfo(handle).busId).lower()] = uuid
                for link in range(nvml.NVML_NVLINK_MAX_LINKS):
                    if self._try(nvml.nvmlDeviceGetNvLinkState, 0, handle, link) != 1:
                        continue
                    kind = self._try(nvml.nvmlDeviceGetNvLinkRemoteDeviceType, 0, handle, link)
                    if kind == getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2):
                        switched.add(uuid)
                        continue
                    remote = getattr(self._try(nvml.nvmlDeviceGetNvLinkRemotePciInfo, None, handle, link), "busId", "")
                    remote_of.setdefault(uuid, set()).add(self._text(remote).lower())
            peers = {bus_of[b] for b in remote_of.get(gpu_uuid, set()) if b in bus_of}
            if gpu_uuid in switched:
                peers |= switched  # every GPU on the NVSwitch fabric reaches every other
            peers.discard(gpu_uuid)
            return tuple(sorted(peers))

    def health_events(self) -> tuple[HealthEvent, ...]:
        nvml = self._nvml
        out = []
        with self._lock:
            while self._events is not None:
                try:
                    data = nvml.nvmlEventSetWait_v2(self._events, 0)
                except nvml.NVMLError:
                    break  # NVML_ERROR_TIMEOUT: nothing waiting
                xid = int(data.eventData)
                if fatal(xid):
                    out.append(HealthEvent(self._text(nvml.nvmlDeviceGetUUID(data.device)), xid, ""))
            for index, known in sorted(self._known.items()):
                try:
                    self._read(index)
                except nvml.NVMLError as exc:
                    if known.uuid not in self._lost:
                        self._lost.add(known.uuid)
                        out.append(HealthEvent(known.uuid, 0, f"GPU does not answer NVML: {exc}"))
        return tuple(out)

    # ------------------------------------------------------------ the two writes

    def create_mig(self, gpu_uuid: str, compute_slices: int, memory_slots: int, start: int) -> MigInfo:
        nvml = self._nvml
        with self._lock, self._call(f"create MIG {compute_slices}g/{memory_slots} slots at {start} on {gpu_uuid}"):
            handle = self._handle(gpu_uuid)
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
            if current != nvml.NVML_DEVICE_MIG_ENABLE:
                raise GpuError(f"GPU {gpu_uuid}: MIG mode is off")
            profile = self._gi_profile(handle, compute_slices, memory_slots)
            placement = nvml.c_nvmlGpuInstancePlacement_t()
            placement.start = start
            placement.size = memory_slots
            gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, profile.id, placement)
            try:
                ci_profile = self._ci_profile(gi, compute_slices)
                nvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile.id)
            except nvml.NVMLError:
                nvml.nvmlGpuInstanceDestroy(gi)
                raise
            info = nvml.nvmlGpuInstanceGetInfo(gi)
            for made, _ in self._instances(gpu_uuid, handle):
                if made.start == int(info.placement.start) and made.memory_slots == memory_slots:
                    return made
            raise GpuError(f"GPU {gpu_uuid}: the new MIG instance at {start} has no MIG device")

    def _gi_profile(self, handle: Any, slices: int, slots: int) -> Any:
        nvml = self._nvml
        for profile_id in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                profile = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile_id)
                placements = nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile.id)
            except nvml.NVMLError:
                continue
            if int(profile.sliceCount) == slices and any(int(p.size) == slots for p in placements):
                return profile
        raise GpuError(f"no GPU instance profile of {slices} slices and {slots} memory slots")

    def _ci_profile(self, gi: Any, slices: int) -> Any:
        nvml = self._nvml
        for profile_id in range(nvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                profile = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, profile_id, nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                )
            except nvml.NVMLError:
                continue
            if int(profile.sliceCount) == slices:
                return profile
        raise GpuError(f"no compute instance profile of {slices} slices")

    def destroy_mig(self, gpu_uuid: str, uuid: str) -> None:
        nvml = self._nvml
        with self._lock, self._call(f"destroy MIG {uuid} on {gpu_uuid}"):
            handle = self._handle(gpu_uuid)
            for made, gi in self._instances(gpu_uuid, handle):
                if made.uuid != uuid:
                    continue
                for profile_id in range(nvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
                    try:
                        info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                            gi, profile_id, nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                        )
                    except nvml.NVMLError:
                        continue
                    for ci in self._try(nvml.nvmlGpuInstanceGetComputeInstances, [], gi, info.id):
                        nvml.nvmlComputeInstanceDestroy(ci)
                nvml.nvmlGpuInstanceDestroy(gi)
                return
            raise GpuError(f"GPU {gpu_uuid}: no MIG instance {uuid}")

    def close(self) -> None:
        nvml = self._nvml
        with self._lock:
            if self._events is not None:
                self._try(nvml.nvmlEventSetFree, None, self._events)
                self._events = None
            self._try(nvml.nvmlShutdown, None)
