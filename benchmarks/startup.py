"""How long the command line takes to start, against ``python -c pass`` and against an older revision.

    python benchmarks/startup.py [--baseline REV] [--runs 15]

Measures, in fresh processes, the wall time of ``gpuslice --help``, ``gpuslice simulate --help`` and
``gpuslice inspect`` (against a ``gpuslice serve --cluster-file example`` this script starts), for
this checkout and for ``REV`` (exported with ``git archive`` into a temporary folder, so the
working tree is left alone); both run with this interpreter and the same installed dependencies.
Prints the median and the fastest run of each, the median's ratio to ``python -c pass`` (the cost
of starting the interpreter at all) and to the same command at ``REV``. The goal: each command
within 0.5 s on the 2-core development machine.

The default ``REV``, eaf14ea, is the code before the start-up work. On the 2-core development
machine it gave (median of 15): ``--help`` 0.62 s, ``simulate --help`` 0.80 s, ``inspect`` 0.93 s,
with ``python -c pass`` at 0.03 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOAL_S = 0.5


def launcher(tree: Path) -> list[str]:
    """The command line's ``main`` from ``tree``, ahead of whatever is installed."""
    code = f"import sys; sys.path.insert(0, {str(tree)!r}); from scheduler.cli import main; main()"
    return [sys.executable, "-c", code]


def timed(command: list[str], runs: int, ok: tuple[int, ...] = (0,)) -> list[float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        times.append(time.perf_counter() - started)
        if done.returncode not in ok:
            raise SystemExit(f"{' '.join(command[-3:])} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return times


def export(revision: str, into: Path) -> Path:
    """``revision`` of this repository, as files under ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", revision], capture_output=True, check=True
    ).stdout
    tar = into / "tree.tar"
    tar.write_bytes(archive)
    tree = into / "tree"
    with tarfile.open(tar) as handle:
        handle.extractall(tree, filter="data")
    return tree


def serving() -> tuple[subprocess.Popen[str], str]:
    """``gpuslice serve --cluster-file example`` on a free port, and its URL once listening."""
    process = subprocess.Popen(
        [*launcher(REPO), "serve", "--cluster-file", "example", "--port", "0", "--log-format", "json"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert process.stderr is not None
    deadline = time.monotonic() + 30
    for line in process.stderr:
        entry = json.loads(line) if line.startswith("{") else {}
        if entry.get("msg") == "listening":
            return process, str(entry["url"])
        if time.monotonic() > deadline:
            break
    process.kill()
    raise SystemExit("gpuslice serve did not start")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default="eaf14ea", help="git revision to compare with")
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    server, url = serving()
    try:
        with tempfile.TemporaryDirectory(prefix="gpuslice-startup-") as scratch:
            baseline = export(args.baseline, Path(scratch))
            bare = statistics.median(timed([sys.executable, "-c", "pass"], args.runs))
            print(f"python -c pass: {bare:.3f} s (median of {args.runs}); baseline {args.baseline}")
            print(f"{'command':<24} {'median s':>9} {'fastest':>8} {'x pass':>7} {'baseline s':>10} {'x baseline':>10}")
            for label, argv in (
                ("gpuslice --help", ["--help"]),
                ("gpuslice simulate --help", ["simulate", "--help"]),
                ("gpuslice inspect", ["inspect", "--url", url]),
            ):
                now = timed([*launcher(REPO), *argv], args.runs)
                before = timed([*launcher(baseline), *argv], args.runs)
                median, old = statistics.median(now), statistics.median(before)
                mark = "" if median <= GOAL_S else f"  over the {GOAL_S} s goal"
                print(
                    f"{label:<24} {median:>9.3f} {min(now):>8.3f} {median / bare:>7.1f} {old:>10.3f} "
                    f"{median / old:>10.2f}{mark}"
                )
    finally:
        server.terminate()
        server.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
