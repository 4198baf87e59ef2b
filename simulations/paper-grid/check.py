"""Check the paper grid's report against the runs recorded before it, seed by seed.

    python simulations/paper-grid/check.py

For every (trace, policy, seed) in both this folder's summary.csv and a recorded one
(simulations/openb/<trace>/summary.csv, simulations/fgd-cpu/<trace>/summary.csv), the figures
of a run (unallocated and allocated GPU at arrived = 100%, allocated at the end, failed pods,
frag rate) must be equal: the simulator is deterministic given (trace, policy, seed). Exit
status 1 if one differs.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RECORDED = [HERE.parent / "openb", HERE.parent / "fgd-cpu"]
FIGURES = (
    "unallocated_gpu_pct_at_100",
    "allocated_gpu_pct_at_100",
    "allocated_gpu_pct_final",
    "failed_pods",
    "frag_rate_pct_at_100",
)


def rows(path: Path) -> dict[tuple[str, str, str], dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return {(r["trace"], r["policy"], r["seed"]): r for r in csv.DictReader(handle)}


def main() -> int:
    grid = rows(HERE / "summary.csv")
    recorded: dict[tuple[str, str, str], dict[str, str]] = {}
    for folder in RECORDED:
        for summary in sorted(folder.glob("*/summary.csv")):
            recorded.update(rows(summary))
    both = sorted(set(grid) & set(recorded))
    differ = [k for k in both if any(grid[k][f] != recorded[k][f] for f in FIGURES)]
    pairs = sorted({(t, p) for t, p, _ in both})
    print(
        f"{len(grid)} runs in the grid's report, {len(recorded)} recorded before; {len(both)} in both "
        f"({len(pairs)} (trace, policy) pairs): {len(both) - len(differ)} identical, {len(differ)} differ"
    )
    for key in differ:
        changed = {f: (grid[key][f], recorded[key][f]) for f in FIGURES if grid[key][f] != recorded[key][f]}
        print("differs:", key, changed)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
