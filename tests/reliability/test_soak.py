"""A short soak in the default run (benchmarks/soak.py runs it for 10 minutes and more): two
``gpuslice serve`` replicas, pods arriving and departing, no over-allocation, no share lost,
both replicas showing the truth at the end, memory within its bound."""

from __future__ import annotations

import os
from pathlib import Path

from .soak import run_soak

SECONDS = float(os.environ.get("GPUSLICE_SOAK_SECONDS", "15"))


def test_a_short_soak_through_two_replicas(tmp_path: Path) -> None:
    report = run_soak(tmp_path, seconds=SECONDS, arrival_per_s=6.0, mean_life_s=5.0, window_s=5.0, log=lambda _: None)
    print("\n" + report.render())
    assert report.binds_done >= SECONDS * 2  # most of the ~6 pods a second found a share
    assert report.over_allocations == 0
    assert report.lost_shares == 0, report.final
    assert report.unreachable == 0
    assert report.views_match
    assert report.memory_ok(), report.rss_kib
