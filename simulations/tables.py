"""Print the Markdown tables of simulations/README.md from the recorded results.

python simulations/tables.py [--reference ../shared/data/fgd_expected_results]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from scheduler.sim.reference import load
from scheduler.sim.report import markdown_table, rows_from_files

HERE = Path(__file__).resolve().parent
DEFAULT_REFERENCE = Path(os.environ.get("GPUSLICE_SHARED_DATA", HERE.parents[1] / "shared" / "data")) / (
    "fgd_expected_results"
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reference", type=Path, default=DEFAULT_REFERENCE)
    args = parser.parse_args()
    reference = load(args.reference) if args.reference.exists() else None
    for summary in sorted(HERE.glob("*/*/summary.csv")):
        print(f"### {summary.parent.relative_to(HERE)}\n")
        print(markdown_table(rows_from_files(summary, summary.parent / "bound.csv", reference)))


if __name__ == "__main__":
    main()
