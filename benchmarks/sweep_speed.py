"""Sweep speed: the same grid with the local executor and on a local Dask cluster.

For one grid (default: 2 openb traces x 2 policies x 10 seeds = 40 runs) it runs the sweep twice
into fresh stores, with ``local:N`` (N processes, one process per run) and with ``dask-local:N``
(a Dask LocalCluster of N single-thread worker processes; its start and close are timed apart,
as a remote cluster is there before the sweep), and prints for each: the wall time; the overhead
per run in CPU, (CPU of this process, the scheduler in it, and the workers - the runs' own CPU) /
runs, also as % of a run's CPU (the goal's figure: it does not
move when other jobs share the machine); and in worker wall time, (sweep wall x N - the runs' own
wall time) / runs (which does). Then the ratios against the local executor measured in the same
invocation, and whether both stores hold the same numbers. Goal: the Dask path's overhead under
5% of a run's time for openb runs.

    python benchmarks/sweep_speed.py [--data DIR] [--traces default,multigpu50]
        [--policies fgd,gpupacking] [--seeds 42-51] [--workers 2] [--embedded]

DIR holds openb/ (default: $GPUSLICE_SHARED_DATA or <repo>/../shared/data). ``--embedded``
runs the small embedded scenario instead (runs of a few ms: what is left is the overhead alone).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

from rich.console import Console

from scheduler.sim.executors import DaskExecutor, LocalExecutor, local_cluster
from scheduler.sim.load import EMBEDDED
from scheduler.sim.store import Store
from scheduler.sim.sweep import parse_sweep
from scheduler.sim.sweeper import run_sweep

DEFAULT_DATA = Path(
    os.environ.get("GPUSLICE_SHARED_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data")
)


def cpu_seconds() -> float:
    """CPU time of this process and of its children that have ended (the workers, once closed)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def process_cpu(pids: list[int]) -> float:
    """CPU time of running processes, from /proc (Linux)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return total


def self_cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def measure(kind: str, doc: dict[str, object], base: Path, out: Path, workers: int) -> dict[str, float]:
    """One sweep of ``doc`` into ``out``: wall and CPU, of the whole and of the runs themselves."""
    sweep = parse_sweep(doc, base / "sweep.yaml")
    quiet = Console(stderr=True, quiet=True)
    cpu, started = cpu_seconds(), time.perf_counter()
    startup = 0.0
    if kind == "local":
        summary = run_sweep(sweep, LocalExecutor(workers), out, quiet, show_progress=False)
    else:
        import distributed

        with local_cluster(workers) as cluster, distributed.Client(cluster) as client:
            client.wait_for_workers(workers)
            pids = list(client.run(os.getpid).values())
            startup = time.perf_counter() - started
            executor = DaskExecutor(None, workers)
            executor.client = client
            began, before = time.perf_counter(), self_cpu() + process_cpu(pids)
            summary = run_sweep(sweep, executor, out, quiet, show_progress=False)
            swept, sweep_cpu = time.perf_counter() - began, self_cpu() + process_cpu(pids) - before
            closing = time.perf_counter()
        startup += time.perf_counter() - closing
    wall, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    if kind == "local":
        sweep_cpu = cpu  # a process per run: starting workers is part of every run's cost
    if summary.failed:
        raise SystemExit(f"{kind}: {len(summary.failed)} runs failed: {summary.failed[0]}")
    entries = list(Store(out).entries().values())
    runs = len(entries)
    own_wall = sum(float(e["result"]["wall_seconds"]) for e in entries)
    own_cpu = sum(float(e["result"]["cpu_seconds"]) for e in entries)
    sweep_wall = swept if kind != "local" else wall
    return {
        "wall": wall,
        "startup": startup,
        "runs": runs,
        "mean_run_cpu": own_cpu / runs,
        "cpu_overhead": (sweep_cpu - own_cpu) / runs,
        "cpu_overhead_pct": 100 * (sweep_cpu - own_cpu) / own_cpu,
        "startup_cpu": cpu - sweep_cpu,
        "wall_overhead": (sweep_wall * workers - own_wall) / runs,
        "wall_overhead_pct": 100 * (sweep_wall * workers - own_wall) / own_wall,
    }


def numbers(out: Path) -> dict[str, object]:
    entries = Store(out).entries()
    return {k: (e["result"]["curves"], e["result"]["failed_pods"]) for k, e in entries.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--traces", default="default,multigpu50")
    parser.add_argument("--policies", default="fgd,gpupacking")
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--embedded", action="store_true", help="the small embedded scenario instead of openb")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="sweep-speed-"))
    try:
        if args.embedded:
            text = resources.files("scheduler").joinpath("examples", EMBEDDED).read_text(encoding="utf-8")
            (scratch / EMBEDDED).write_text(text, encoding="utf-8")
            base, inputs = scratch, [EMBEDDED]
        else:
            base = args.data / "openb"
            inputs = [f"openb_pod_list_{t}.csv" for t in args.traces.split(",")]
            missing = [i for i in inputs if not (base / i).exists()]
            if missing:
                print(f"no trace {missing[0]} in {base} (give --data or set GPUSLICE_SHARED_DATA)", file=sys.stderr)
                return 2
        doc: dict[str, object] = {
            "name": "speed",
            "inputs": inputs,
            "policies": args.policies.split(","),
            "seeds": args.seeds,
        }
        print(f"machine: {os.cpu_count()} cores; grid: {', '.join(inputs)} x {args.policies} x seeds {args.seeds}")
        local = measure("local", doc, base, scratch / "local", args.workers)
        dask = measure("dask", doc, base, scratch / "dask", args.workers)
        for name, m in (("local", local), ("dask", dask)):
            print(
                f"{name:5s} ({args.workers} workers): {int(m['runs'])} runs in {m['wall']:.1f} s wall"
                + (
                    f" (cluster start and close: {m['startup']:.1f} s, {m['startup_cpu']:.1f} s CPU, not counted below)"
                    if name == "dask"
                    else ""
                )
                + f"; a run takes {m['mean_run_cpu']:.2f} s CPU; overhead per run: {m['cpu_overhead']:.3f} s CPU = "
                f"{m['cpu_overhead_pct']:.1f}% of a run's CPU, {m['wall_overhead']:.3f} s of worker wall time = "
                f"{m['wall_overhead_pct']:.1f}%"
            )
        goal = dask["cpu_overhead_pct"] < 5
        print(
            f"dask / local: wall x{dask['wall'] / local['wall']:.3f}, CPU overhead per run x"
            f"{dask['cpu_overhead'] / local['cpu_overhead']:.3f}; dask overhead {dask['cpu_overhead_pct']:.1f}% "
            f"of a run's CPU [goal < 5%: {'met' if goal else 'MISSED'}]"
        )
        same = numbers(scratch / "local") == numbers(scratch / "dask")
        print(f"stores: same run ids and numbers: {'yes' if same else 'NO'}")
        return 0 if same else 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
