"""A read-only look at a node's real GPUs through the agent's NVML seam (``scripts/nvml-check.py``).

It prints the inventory the agent would publish, each GPU's MIG mode, instances, NVLink peers
and running processes with their memory; then it allocates a little CUDA memory of its own
(through the driver API in ``libcuda``, with ctypes) and checks that NVML lists this process
on that GPU with that memory, and that the agent's sampling (:mod:`scheduler.agent.sampling`:
NVML, then ``/proc/<pid>/cgroup``) finds it under its PID with that memory: outside any pod
it is stray use, as a host process is. It calls only the seam's reading methods: MIG mode,
instances and every other setting stay as they are. Each thing it cannot do (no NVML, no
libcuda) is one line saying so.
"""

from __future__ import annotations

import ctypes
import json
import os
import time
from collections.abc import Callable
from typing import Protocol, TextIO

from scheduler.core.errors import GpusliceError

from .config import load_config
from .gpus import Gpus
from .inventory import model_of
from .procs import ProcFs, ProcReader
from .sampling import take

CHECK_MIB = 256


class CudaProbe(Protocol):
    def allocate(self, mib: int) -> str:
        """Allocate ``mib`` MiB on CUDA device 0 and keep it; the device's UUID (``GPU-...``)."""

    def release(self) -> None: ...


class CudaUnavailable(GpusliceError):
    """No CUDA driver library, or it refused."""


class DriverApiProbe:
    """CUDA device 0 through ``libcuda.so.1`` (the driver API): no toolkit, no Python package needed."""

    def __init__(self) -> None:
        try:
            self._cuda = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise CudaUnavailable(f"libcuda.so.1 cannot be loaded ({exc})") from exc
        self._context = ctypes.c_void_p()
        self._pointer = ctypes.c_uint64()

    def _call(self, name: str, *args: object) -> None:
        status = getattr(self._cuda, name)(*args)
        if status != 0:
            raise CudaUnavailable(f"{name} returned CUDA error {status}")

    def allocate(self, mib: int) -> str:
        self._call("cuInit", 0)
        device = ctypes.c_int()
        self._call("cuDeviceGet", ctypes.byref(device), 0)
        raw = (ctypes.c_ubyte * 16)()
        self._call("cuDeviceGetUuid", raw, device)
        self._call("cuCtxCreate_v2", ctypes.byref(self._context), 0, device)
        self._call("cuMemAlloc_v2", ctypes.byref(self._pointer), ctypes.c_size_t(mib * 1024 * 1024))
        h = bytes(raw).hex()
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    def release(self) -> None:
        if self._pointer.value:
            self._cuda.cuMemFree_v2(self._pointer)
        if self._context.value:
            self._cuda.cuCtxDestroy_v2(self._context)


def _cgroup(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8") as handle:
            return handle.readline().strip()
    except OSError:
        return "(no /proc entry in this PID namespace)"


def _sampled(gpus: Gpus, procs: ProcReader, device: str, out: TextIO) -> int:
    """The agent's sampling of the node, with no pods known: this process must be in it, on the
    GPU CUDA named, with at least the memory allocated. The number of problems."""
    me = os.getpid()
    sample = take(gpus, [], procs)
    for line in sample.problems:
        print(f"sampling: {line}", file=out)
    print(
        f"sampling: {len(sample.strays)} process(es) on {len(sample.gpus)} GPU(s), none of them a pod's here", file=out
    )
    mine = [s for s in sample.strays if s.pid == me]
    if not mine:
        print(f"NOT SAMPLED: the agent's sampling does not find PID {me} (is /proc this PID namespace's?)", file=out)
        return 1
    problems = 0
    for stray in mine:
        ok = stray.gpu_uuid == device and stray.memory_mib >= CHECK_MIB
        problems += 0 if ok else 1
        sm = next((p.sm_percent for p in gpus.processes(stray.gpu_uuid) if p.pid == me), None)
        print(
            f"{'SAMPLED' if ok else 'SAMPLE MISMATCH'}: PID {me} on GPU {stray.gpu_index} ({stray.gpu_uuid}) "
            f"holds {stray.memory_mib} MiB, SM {'n/a' if sm is None else f'{sm}%'}, as stray use: {stray.why}",
            file=out,
        )
    return problems


def run(
    gpus: Gpus, probe: Callable[[], CudaProbe], out: TextIO, settle_s: float = 1.0, procs: ProcReader | None = None
) -> int:
    """Print the check to ``out``; 0 when everything it could check was as expected."""
    from .main import hardware_inventory

    config = load_config(None, "device-check", {})
    problems = 0
    print("== inventory the agent would publish", file=out)
    print(json.dumps(json.loads(hardware_inventory(config, gpus)), indent=2), file=out)
    devices = gpus.devices()
    print(f"== {len(devices)} GPU(s)", file=out)
    for gpu in devices:
        print(
            f"GPU {gpu.index} {gpu.uuid} {gpu.name} ({model_of(gpu).name}): {gpu.memory_mib} MiB, "
            f"{gpu.sm_count or '?'} SMs, MIG mode {'on' if gpu.mig_enabled else 'off'}",
            file=out,
        )
        for inst in gpus.mig_instances(gpu.uuid) if gpu.mig_enabled else ():
            print(f"  MIG {inst.uuid}: {inst.compute_slices} slices, slots {inst.start}+{inst.memory_slots}", file=out)
        peers = gpus.nvlink_peers(gpu.uuid)
        print(f"  NVLink peers: {', '.join(peers) or 'none'}", file=out)
        for proc in gpus.processes(gpu.uuid):
            where = f" in {proc.instance_uuid}" if proc.instance_uuid else ""
            print(f"  process {proc.pid}{where}: {proc.used_memory_mib} MiB", file=out)
    print(f"== own CUDA allocation of {CHECK_MIB} MiB", file=out)
    try:
        cuda = probe()
        device = cuda.allocate(CHECK_MIB)
    except CudaUnavailable as exc:
        print(f"CUDA: {exc}; the allocation check is skipped", file=out)
        return problems
    try:
        time.sleep(settle_s)
        me = os.getpid()
        listed = [(g, p) for g in devices for p in gpus.processes(g.uuid)]
        mine = [(g, p) for g, p in listed if p.pid == me]
        print(f"CUDA device 0 is {device}; this process is PID {me} ({_cgroup(me)})", file=out)
        if not mine:
            problems += 1
            near = [f"{p.pid} on GPU {g.index} ({p.used_memory_mib} MiB)" for g, p in listed]
            print(
                "NOT FOUND: NVML does not list this PID (NVML reports host PIDs: is this process in another "
                f"PID namespace?); listed: {', '.join(near) or 'none'}",
                file=out,
            )
        for gpu, proc in mine:
            ok = gpu.uuid == device and proc.used_memory_mib >= CHECK_MIB
            problems += 0 if ok else 1
            print(
                f"{'FOUND' if ok else 'MISMATCH'}: PID {proc.pid} on GPU {gpu.index} ({gpu.uuid}"
                f"{', ' + proc.instance_uuid if proc.instance_uuid else ''}) using {proc.used_memory_mib} MiB"
                f" (allocated {CHECK_MIB} MiB on {device})",
                file=out,
            )
        problems += _sampled(gpus, procs or ProcFs("/proc"), device, out)
    finally:
        cuda.release()
    return problems
