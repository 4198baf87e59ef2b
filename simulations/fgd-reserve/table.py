"""Print the fgd-reserve tables of simulations/README.md from the recorded runs.

    python simulations/fgd-reserve/table.py

Reads, all recorded in this repository:
  ../paper-grid/summary.csv       the shared openb traces (the paper grid's sweep, fgd-reserve among its policies)
  variants/summary.csv            the generated variants (variants.yaml's sweep)
  variants-s5/summary.csv         those of generator seed 5 (variants-s5.yaml's sweep)
  scenarios/*/summary.csv         the timed replays and the MIG scenario (gpuslice simulate --out)
  bound.csv                       the LP bound per (trace, seed) (gpuslice bound --out)
and the roles (tune / held-out) from ../variants/make.py and TUNED below. Per (trace, policy):
mean ± sd over the seeds, and for fgd-reserve the number of its seeds worse than FGD's mean.
"""

from __future__ import annotations

import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "variants"))
from make import VARIANTS  # noqa: E402  (the record of the variants and their roles)

# The FGD paper's FGD, unallocated GPU % at arrived = 100% (mean of 10 seeds), where it has the trace.
PAPER_FGD = {
    "default": 4.77,
    "cpu050": 5.00,
    "cpu100": 4.79,
    "cpu200": 5.18,
    "gpushare40": 6.04,
    "gpushare80": 10.92,
    "multigpu20": 4.47,
    "multigpu30": 3.64,
    "multigpu50": 2.91,
    "gpuspec10": 5.34,
    "gpuspec20": 5.34,
}
TUNED = {"default", "cpu200", "cpu300", "gpuspec20"}  # the shared traces tuning looked at
POLICIES = ("fgd-reserve", "fgd", "bestfit")
Rows = dict[tuple[str, str], list[dict[str, str]]]


def read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def by_trace_policy(paths: list[Path]) -> Rows:
    by: Rows = defaultdict(list)
    for path in paths:
        if not path.exists():
            continue
        for row in read(path):
            if row["policy"] in POLICIES:
                by[(row["trace"], row["policy"])].append(row)
    return by


def mean_sd(values: list[float]) -> str:
    if not values:
        return "–"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.2f} ± {sd:.2f}"


def roles() -> dict[str, str]:
    grid = {r["trace"] for r in read(HERE.parent / "paper-grid" / "summary.csv")}
    found = {t: "tune" if t in TUNED else "held-out" for t in sorted(grid)}
    found.update({spec.name: role for role, spec in VARIANTS})
    return found


def bounds() -> dict[str, list[float]]:
    path = HERE / "bound.csv"
    out: dict[str, list[float]] = defaultdict(list)
    if path.exists():
        for row in read(path):
            out[row["trace"]].append(float(row["bound_unallocated_gpu_pct"]))
    return out


def arrivals_table() -> None:
    sweeps = [HERE / "variants" / "summary.csv", HERE / "variants-s5" / "summary.csv"]
    by = by_trace_policy([HERE.parent / "paper-grid" / "summary.csv", *sweeps])
    bound = bounds()
    print(
        "| trace | role | seeds | fgd-reserve | worse than FGD's mean | fgd (ours) | paper's FGD | bestfit | LP bound |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for trace, role in roles().items():
        un = {p: [float(r["unallocated_gpu_pct_at_100"]) for r in by.get((trace, p), [])] for p in POLICIES}
        if not un["fgd-reserve"]:
            continue
        fgd_mean = statistics.fmean(un["fgd"]) if un["fgd"] else float("nan")
        worse = sum(1 for v in un["fgd-reserve"] if v > fgd_mean)
        paper = PAPER_FGD.get(trace)
        lp = f"{statistics.fmean(bound[trace]):.2f}" if bound.get(trace) else "–"
        print(
            f"| {trace} | {role} | {len(un['fgd-reserve'])} / {len(un['fgd'])} | {mean_sd(un['fgd-reserve'])} "
            f"| {worse} | {mean_sd(un['fgd'])} | {'–' if paper is None else f'{paper:.2f}'} "
            f"| {mean_sd(un['bestfit'])} | {lp} |"
        )


def scenarios_table() -> None:
    """One block per folder of scenarios/ (named for the replay: the openb timed replay's runs say
    trace "default")."""
    print("| scenario | policy | seeds | pods turned away | GPU-hours | unallocated % at 100% |")
    print("|---|---|---:|---:|---:|---:|")
    for summary in sorted((HERE / "scenarios").glob("*/summary.csv")):
        by = by_trace_policy([summary])
        for policy in POLICIES:
            rows = [r for (_, p), found in by.items() if p == policy for r in found]
            if not rows:
                continue
            failed = [float(r["failed_pods"]) for r in rows]
            hours = [float(r["gpu_hours"] or 0) for r in rows]
            un = [float(r["unallocated_gpu_pct_at_100"]) for r in rows if r["unallocated_gpu_pct_at_100"]]
            shown = mean_sd(hours) if any(hours) else "– (no times)"
            name = summary.parent.name
            print(f"| {name} | {policy} | {len(rows)} | {mean_sd(failed)} | {shown} | {mean_sd(un)} |")


def main() -> None:
    arrivals_table()
    print()
    scenarios_table()


if __name__ == "__main__":
    main()
