"""Soak gpuslice for ten minutes or more: two ``gpuslice serve`` replicas, one (fake) API server.

Pods of every sharing mode arrive at a steady rate and depart after an exponential lifetime;
a driver plays kube-scheduler (filter, prioritize, pick, bind, requeue on a failed bind)
through both replicas. Per window (a minute by default) it prints arrivals, departures,
binds, failed binds, p50/p99 of filter, prioritize and bind, and over-allocations found in the
API server's objects; at the end: binds done, failed binds, over-allocations, lost shares
(ledger entries or records of pods that are gone, after a stale interval and a sweep),
whether both replicas show the API server's truth, and each replica's resident memory at
start, after the first window and at the end, against a stated bound. See
tests/reliability/soak.py.

    python benchmarks/soak.py                   # 10 minutes, 6 pods/s, mean life 8 s
    python benchmarks/soak.py --minutes 30 --rate 10 --life 20

Exit status 1 when an over-allocation, a lost share, an unreachable replica, a replica that
does not show the truth, or memory growth beyond the bound was found.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.* are importable

from tests.reliability.soak import run_soak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long pods keep arriving (default 10)")
    parser.add_argument("--rate", type=float, default=6.0, help="pods arriving per second (default 6)")
    parser.add_argument("--life", type=float, default=8.0, help="mean pod lifetime in seconds (default 8)")
    parser.add_argument("--window", type=float, default=60.0, help="seconds per printed window (default 60)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.rate <= 0 or args.life <= 0 or args.window <= 0:
        parser.error("--minutes, --rate, --life and --window must be positive")
    logging.getLogger("gpuslice").setLevel(logging.CRITICAL)
    with tempfile.TemporaryDirectory(prefix="gpuslice-soak-") as workdir:
        report = run_soak(
            Path(workdir),
            seconds=args.minutes * 60,
            arrival_per_s=args.rate,
            mean_life_s=args.life,
            window_s=args.window,
            seed=args.seed,
            log=lambda line: print(line, flush=True),
        )
    print(report.render())
    print("PASS" if report.ok() else "FAIL")
    return 0 if report.ok() else 1


if __name__ == "__main__":
    sys.exit(main())
