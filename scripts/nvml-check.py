#!/usr/bin/env python3
"""Read-only check of the node agent's NVML path on a machine with a real NVIDIA GPU.

usage: python scripts/nvml-check.py        (with gpuslice installed, e.g. .venv/bin/python)

Prints the inventory the agent would publish, each GPU's MIG mode, instances, NVLink peers and
processes with their memory, then allocates 256 MiB with CUDA and checks that NVML lists this
process on that GPU with that memory, and that the node agent's sampling (NVML, then
/proc/<pid>/cgroup) finds it under its PID with that memory. It changes nothing on the GPU (no
MIG mode change, no instance creation). Exit status: 0 all as expected, 1 a check failed, 2 NVML is not available.
"""

from __future__ import annotations

import sys

from scheduler.agent.check import DriverApiProbe, run
from scheduler.agent.gpus import GpuError


def main() -> int:
    try:
        from scheduler.agent.nvml import NvmlGpus

        gpus = NvmlGpus()
    except GpuError as exc:
        print(f"nvml-check: {exc}", file=sys.stderr)
        return 2
    try:
        return 1 if run(gpus, DriverApiProbe, sys.stdout) else 0
    except GpuError as exc:
        print(f"nvml-check: {exc}", file=sys.stderr)
        return 1
    finally:
        gpus.close()


if __name__ == "__main__":
    sys.exit(main())
