"""From a run's per-event record to curves by arrived % and one summary row.

Bucketing follows the authors' analysis scripts: after every event, arrived % =
round(arrived / capacity x 100) (half to even, as Python's and numpy's ``round``) and
allocated % = round(allocated / capacity x 100, 2); the curve at k is the mean over the
events in bucket k, or over buckets k-1..k+1 when k has none. Small clusters can jump
over several buckets in one event (an 8-GPU pod on 40 GPUs is 20%); a bucket with no
event within 1 then holds the last event before it (the state the cluster was in while
arrivals crossed k). The headline figure is unallocated GPU % = 100 - allocated % at
arrived = 100%.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .engine import RunResult

SUMMARY_COLUMNS = (
    "trace",
    "policy",
    "seed",
    "unallocated_gpu_pct_at_100",
    "allocated_gpu_pct_at_100",
    "allocated_gpu_pct_final",
    "failed_pods",
    "frag_rate_pct_at_100",
    "gpu_hours",
    "wall_seconds",
)
CURVE_COLUMNS = (
    "trace",
    "policy",
    "seed",
    "arrived_pct",
    "allocated_gpu_pct",
    "unallocated_gpu_pct",
    "frag_gpu_pct",
    "frag_rate_pct",
)
HEADLINE = 100


@dataclass(frozen=True)
class Curves:
    """Per integer arrived %: allocated GPU %, fragmented GPU % (of capacity), frag rate % (of idle)."""

    arrived_pct: np.ndarray
    allocated_pct: np.ndarray
    frag_pct: np.ndarray
    frag_rate_pct: np.ndarray

    def at(self, pct: int) -> tuple[float, float, float]:
        """(allocated %, frag %, frag rate %) at ``pct``, NaN if the run never got there."""
        hit = np.flatnonzero(self.arrived_pct == pct)
        if hit.size == 0:
            return math.nan, math.nan, math.nan
        i = int(hit[0])
        return float(self.allocated_pct[i]), float(self.frag_pct[i]), float(self.frag_rate_pct[i])


def curves(result: RunResult) -> Curves:
    capacity = max(1, result.capacity_milli)
    bucket = np.round(result.arrived / capacity * 100).astype(np.int64)
    allocated = np.round(result.allocated / capacity * 100, 2)
    frag = np.round(result.frag / capacity * 100, 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(result.idle > 0, np.round(100 * result.frag / np.maximum(result.idle, 1), 2), 0.0)
    top = int(bucket.max()) if bucket.size else 0
    ks, a, f, r = [], [], [], []
    for k in range(top + 1):
        sel = bucket == k
        if not sel.any():
            sel = (bucket >= k - 1) & (bucket <= k + 1)
            if not sel.any():
                before = np.flatnonzero(bucket < k)
                if before.size == 0:
                    continue
                sel = np.zeros(bucket.size, dtype=bool)
                sel[before[-1]] = True
        ks.append(k)
        a.append(round(float(allocated[sel].mean()), 2))
        f.append(round(float(frag[sel].mean()), 2))
        r.append(round(float(rate[sel].mean()), 2))
    return Curves(np.array(ks, dtype=np.int64), np.array(a), np.array(f), np.array(r))


@dataclass(frozen=True)
class RunRecord:
    """What is kept of a run once it is over: its identity, its counts and its curves.

    The per-event arrays of a :class:`RunResult` are dropped; every table, CSV and plot is made
    from records, whether they come straight from runs (``simulate``) or from a sweep's store
    (``report``), so both go through the same code.
    """

    trace: str
    policy: str
    seed: int
    capacity_milli: int
    allocated_final_milli: int
    failed: int
    placed: int
    wall_seconds: float
    curves: Curves
    failed_by_kind: dict[str, int] = field(default_factory=dict)
    cpu_seconds: float = math.nan  # the CPU time of the run's process during the run, when measured
    gpu_hours: float = math.nan  # timed replays: allocated GPU integrated over time

    @classmethod
    def of(cls, result: RunResult, curve: Curves | None = None) -> RunRecord:
        return cls(
            result.trace,
            result.policy,
            result.seed,
            result.capacity_milli,
            int(result.allocated[-1]),
            result.failed,
            result.placed,
            result.wall_seconds,
            curve or curves(result),
            dict(result.failed_by_kind),
            gpu_hours=result.gpu_hours,
        )


def _record(run: RunResult | RunRecord) -> RunRecord:
    return run if isinstance(run, RunRecord) else RunRecord.of(run)


def summary_row(run: RunResult | RunRecord) -> dict[str, object]:
    record = _record(run)
    allocated, _, rate = record.curves.at(HEADLINE)
    final = record.allocated_final_milli / max(1, record.capacity_milli) * 100
    return {
        "trace": record.trace,
        "policy": record.policy,
        "seed": record.seed,
        "unallocated_gpu_pct_at_100": _fmt(100 - allocated),
        "allocated_gpu_pct_at_100": _fmt(allocated),
        "allocated_gpu_pct_final": _fmt(final),
        "failed_pods": record.failed,
        "frag_rate_pct_at_100": _fmt(rate),
        "gpu_hours": _fmt(record.gpu_hours),
        "wall_seconds": _fmt(record.wall_seconds),
    }


def curve_rows(run: RunResult | RunRecord) -> list[dict[str, object]]:
    record = _record(run)
    curve = record.curves
    return [
        {
            "trace": record.trace,
            "policy": record.policy,
            "seed": record.seed,
            "arrived_pct": int(k),
            "allocated_gpu_pct": _fmt(float(a)),
            "unallocated_gpu_pct": _fmt(100 - float(a)),
            "frag_gpu_pct": _fmt(float(f)),
            "frag_rate_pct": _fmt(float(r)),
        }
        for k, a, f, r in zip(curve.arrived_pct, curve.allocated_pct, curve.frag_pct, curve.frag_rate_pct, strict=True)
    ]


def _fmt(value: float) -> str:
    return "" if math.isnan(value) else f"{value:.2f}"
