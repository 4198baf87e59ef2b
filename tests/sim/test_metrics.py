"""Curves by arrived %, as the authors' analysis buckets them."""

from __future__ import annotations

import math

import numpy as np

from scheduler.sim.engine import RunResult
from scheduler.sim.metrics import SUMMARY_COLUMNS, curves, summary_row


def result(arrived: list[int], allocated: list[int], capacity: int = 1000) -> RunResult:
    n = len(arrived)
    return RunResult(
        "t",
        "p",
        1,
        capacity,
        np.array(arrived),
        np.array(allocated),
        np.zeros(n),
        np.full(n, capacity) - np.array(allocated),
        0,
        0,
        1.0,
    )


def test_bucket_mean_and_neighbour_fallback() -> None:
    # capacity 1000: arrived 0, 995, 1004, 1006 -> buckets 0, 100 (99.5 -> 100, half to even),
    # 100, 101. Bucket 100 = mean(90.00, 91.00) = 90.5; bucket 1..98 have no event within 1 and
    # hold the last event before them (0 %); bucket 99 falls back to 98..100 = 90.5.
    c = curves(result([0, 995, 1004, 1006], [0, 900, 910, 930]))
    lookup = dict(zip(c.arrived_pct.tolist(), c.allocated_pct.tolist(), strict=True))
    assert lookup[100] == 90.5
    assert lookup[101] == 93.0
    assert lookup[99] == 90.5
    assert lookup[50] == 0.0
    assert summary_row(result([0, 995, 1004, 1006], [0, 900, 910, 930]))["unallocated_gpu_pct_at_100"] == "9.50"


def test_summary_has_the_issue_columns_and_blanks_when_never_reached() -> None:
    row = summary_row(result([0, 500], [0, 400]))
    assert tuple(row) == SUMMARY_COLUMNS
    assert row["unallocated_gpu_pct_at_100"] == "" and row["allocated_gpu_pct_final"] == "40.00"
    assert math.isnan(curves(result([0, 500], [0, 400])).at(100)[0])
