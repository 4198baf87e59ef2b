"""Resident memory of ``gpuslice serve`` at scale, and its growth over a sustained run.

A cluster file of ``--nodes`` nodes of 8 GPUs with ``--running`` pods already bound (allocation
records as gpuslice writes them) is served; the resident memory is read once the first sync is
done, then kube-scheduler's loop (benchmarks/extender_driver.py: default node sampling,
asynchronous binds) schedules ``--pods`` more (at most ``--cycles`` scheduling cycles: once
the cluster is full, the pods left are retried, each up to 20 times), and the resident memory is
printed every ``--every`` scheduling cycles, with its growth per 1,000 cycles over the second
half. A do-nothing extender's resident memory is printed as the baseline (the same HTTP stack
holding nothing).

    python benchmarks/serve_memory.py                         # 5,000 nodes, 50,000 running, 20,000 more
    python benchmarks/serve_memory.py --nodes 1000 --running 10000 --pods 4000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import extender_driver as driver


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--running", type=int, default=50_000, help="pods bound before the service starts")
    parser.add_argument("--pods", type=int, default=20_000, help="pods scheduled in the sustained run")
    parser.add_argument("--every", type=int, default=2000, help="cycles between two readings")
    parser.add_argument(
        "--cycles",
        type=int,
        default=40_000,
        help="stop after this many scheduling cycles (once the cluster is full, the pods left are retried at length)",
    )
    parser.add_argument("--policy", default="binpack")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    for name in ("nodes", "running", "pods", "every", "cycles"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name} {getattr(args, name)}: accepted: 1 or more")
    work = Path(tempfile.mkdtemp(prefix="gpuslice-memory-"))
    path = work / "cluster.json"
    t0 = time.perf_counter()
    cluster = driver.write_cluster(path, args.nodes, args.pods, args.seed, "many", running_pods=args.running)
    print(
        f"cluster: {args.nodes} nodes x 8 GPUs, {len(cluster.running)} pods running, {len(cluster.pending)} to "
        f"schedule; file {path.stat().st_size / 2**20:.0f} MiB, made in {time.perf_counter() - t0:.0f} s",
        flush=True,
    )
    port = driver.free_port()
    noop = [sys.executable, str(Path(driver.__file__)), "--noop-port", str(port)]
    with driver.running(noop, port, work / "noop.log") as (_, pid):
        print(f"do-nothing extender: {driver.resident_mib(pid):.0f} MiB resident", flush=True)
    port = driver.free_port()
    command = driver.serve_command(path, port, args.policy)
    started = time.perf_counter()
    with driver.running(command, port, work / "serve.log") as (client, pid):
        synced = driver.resident_mib(pid)
        print(f"gpuslice serve, synced in {time.perf_counter() - started:.0f} s: {synced:.0f} MiB resident", flush=True)
        readings: list[tuple[int, float]] = [(0, synced)]

        def read(cycles: int) -> None:
            rss = driver.resident_mib(pid)
            readings.append((cycles, rss))
            print(f"  after {cycles:6d} scheduling cycles: {rss:7.0f} MiB", flush=True)

        scheduler = driver.KubeScheduler(port, cluster.nodes, cluster.running, percentage=0)
        got = scheduler.run(cluster.pending, 0, pid, every=(args.every, read), max_cycles=args.cycles)
        read(got.attempts)
        over = driver.over_allocated(client)
    half = [r for r in readings if r[0] >= readings[-1][0] / 2]
    growth = (half[-1][1] - half[0][1]) / max(1, half[-1][0] - half[0][0]) * 1000
    print(
        f"\nbound {got.bound} of {len(cluster.pending)} pods ({got.bind_errors} bind failures, {over} over-allocated); "
        f"resident {synced:.0f} MiB after the sync, {readings[-1][1]:.0f} MiB at the end; growth over the second "
        f"half of the run: {growth:.2f} MiB per 1,000 scheduling cycles"
    )


if __name__ == "__main__":
    main()
