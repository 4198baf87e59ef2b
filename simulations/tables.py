"""Print the Markdown tables of simulations/README.md from the recorded results.

python simulations/tables.py [--reference DIR]

DIR: the FGD authors' result curves, by default where the README's commands fetch them
(data/fgd/experiments/analysis/expected_results) or $GPUSLICE_FGD_RESULTS.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from scheduler.sim.datasets import results_dir
from scheduler.sim.reference import load
from scheduler.sim.report import markdown_table, pivot_table, rows_from_files

HERE = Path(__file__).resolve().parent
DEFAULT_REFERENCE = results_dir(HERE.parent)
PAPER = ("random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd")
LIMIT = {"random": 0.5, "bestfit": 0.5, "fgd": 0.5, "dotprod": 1.0, "gpuclustering": 1.0, "gpupacking": 1.0}


def versus(rows: list[dict[str, object]], new: str = "fgd-cpu", old: str = "fgd") -> str:
    """One line per trace: the new policy against our FGD port, the paper's FGD and the LP bound."""
    by = {(str(r["trace"]), str(r["policy"])): r for r in rows}
    traces = sorted({t for t, p in by if p == new}, key=lambda t: (t != "default", t))
    lines = [
        f"| trace | {new} | fgd (ours) | fewer than fgd | fgd (paper) | bound | s/run {new} / fgd |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for trace in traces:
        a, b = by[(trace, new)], by.get((trace, old))
        if b is None:
            continue
        mean_a, mean_b = float(str(a["unallocated_mean"])), float(str(b["unallocated_mean"]))
        lines.append(
            f"| {trace} | {mean_a:.2f} ± {float(str(a['unallocated_sd'])):.2f} "
            f"| {mean_b:.2f} ± {float(str(b['unallocated_sd'])):.2f} "
            f"| {100 * (mean_b - mean_a) / mean_b:.1f}% | {float(str(b['paper'])):.2f} "
            f"| {float(str(a['bound_unallocated'])):.2f} "
            f"| {float(str(a['wall'])):.0f} / {float(str(b['wall'])):.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reference", type=Path, default=DEFAULT_REFERENCE)
    args = parser.parse_args()
    reference = load(args.reference) if args.reference.exists() else None
    openb: list[dict[str, object]] = []
    challenger: list[dict[str, object]] = []
    for summary in sorted(HERE.glob("*/*/summary.csv")):
        rows = rows_from_files(summary, summary.parent / "bound.csv", reference)
        if summary.parent.parent.name == "openb":
            openb += rows
        if summary.parent.parent.name == "fgd-cpu":
            challenger += rows
        print(f"### {summary.parent.relative_to(HERE)}\n")
        print(markdown_table(rows))
    print("### openb: unallocated GPU % at arrived = 100%, ours / paper (mean of 10 seeds)\n")
    print(pivot_table(openb, LIMIT, PAPER))
    if challenger:
        print("### fgd-cpu against FGD: unallocated GPU % at arrived = 100% (mean ± sd of 10 seeds)\n")
        print(versus(challenger))


if __name__ == "__main__":
    main()
