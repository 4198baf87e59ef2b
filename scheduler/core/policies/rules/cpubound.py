"""CPU-bound stranding: fgd-cpu's stranding weight stands down when CPU will run out anyway.

kappa = (CPU per GPU requested by the pods seen, CPU-only ones included) x (the cluster's GPUs)
/ (the cluster's CPU): the share of the cluster's CPU the workload asks for by the time its
GPU request reaches the cluster's capacity. The weight is lambda times a factor: 1 up to
``low``, 0 from ``high``, linear between, in eighths (so that small moves of kappa do not
change the weight, and with it every cached score, at each estimate).
"""

from __future__ import annotations

import numpy as np

STEPS = 8  # the factor moves in eighths


def kappa(cpu_seen: int, gpu_seen: int, gpus: int, cpu_milli: int) -> float:
    """The share of the cluster's CPU (``cpu_milli``, over ``gpus`` GPUs) the pods seen (asking
    ``cpu_seen`` milli-CPU for ``gpu_seen`` milli-GPU) ask for once their GPU fills it (0
    while nothing is known)."""
    if not (gpus and cpu_milli and gpu_seen):
        return 0.0
    return cpu_seen / gpu_seen * gpus * 1000 / cpu_milli


def factor(kappa: float, low: float, high: float) -> float:
    """The share of the stranding weight in use at ``kappa``."""
    return round(float(np.clip((high - kappa) / (high - low), 0.0, 1.0)) * STEPS) / STEPS
