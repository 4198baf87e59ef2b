"""Simulator speed on the Alibaba openb trace (fetched as the README says).

Two figures:
  single  one full default run (1213 nodes, the trace inflated to 130% of GPU capacity) with FGD,
          in this process; target <= 30 s
  grid    the paper's six policies x 10 seeds of one trace, over worker processes (one per run);
          target <= 600 s with both cores

    python benchmarks/sim_speed.py [--data DIR] [--trace default] [--seeds 42-51] [--workers 2] [--single-only]

DIR (the folder of openb_pod_list_*.csv) defaults to $GPUSLICE_OPENB, else where the README's
commands put it (data/clusterdata/cluster-trace-gpu-v2023/csv).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from scheduler.sim.commands import PAPER_POLICIES, parse_seeds
from scheduler.sim.datasets import OPENB_ENV, openb_dir
from scheduler.sim.engine import simulate
from scheduler.sim.metrics import summary_row
from scheduler.sim.openb import read_trace
from scheduler.sim.runner import RunSpec, run_all

DEFAULT_DATA = openb_dir(Path(__file__).resolve().parents[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--trace", default="default")
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--single-only", action="store_true")
    args = parser.parse_args()
    path = args.data / f"openb_pod_list_{args.trace}.csv"
    if not path.exists():
        print(f"no trace at {path} (give --data or set {OPENB_ENV})", file=sys.stderr)
        return 2
    trace = read_trace(path)
    print(
        f"machine: {os.cpu_count()} cores; trace {trace.name}: {len(trace.nodes)} nodes, {trace.gpus} GPUs, "
        f"{len(trace.pods)} pods"
    )

    started = time.perf_counter()
    result = simulate(trace, "fgd", 42)
    single = time.perf_counter() - started
    events = len(result.arrived) - 1
    row = summary_row(result)
    print(
        f"single: fgd seed 42, {events} pods in {single:.1f} s ({events / single:.0f} pods/s), "
        f"unallocated at 100% {row['unallocated_gpu_pct_at_100']}%  [target <= 30 s: "
        f"{'met' if single <= 30 else 'MISSED'}]"
    )
    if args.single_only:
        return 0

    seeds = parse_seeds(args.seeds)
    specs = [RunSpec(trace, p, s) for p in PAPER_POLICIES for s in seeds]
    started = time.perf_counter()
    results = run_all(specs, args.workers, show_progress=False)
    grid = time.perf_counter() - started
    per_policy = {p: [r.wall_seconds for r in results if r.policy == p] for p in PAPER_POLICIES}
    print(
        f"grid: {len(PAPER_POLICIES)} policies x {len(seeds)} seeds = {len(specs)} runs on {args.workers} "
        f"workers in {grid:.0f} s  [target <= 600 s: {'met' if grid <= 600 else 'MISSED'}]"
    )
    for policy, walls in per_policy.items():
        print(f"  {policy:14s} mean {sum(walls) / len(walls):5.1f} s per run (max {max(walls):.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
