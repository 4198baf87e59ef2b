"""Writing a set of runs out: ``summary.csv``, ``curves.csv``, ``table.md``, PNG plots and a
terminal table.

A :class:`Report` is made of :class:`~scheduler.sim.metrics.RunRecord` s, whether they come
straight from runs (``gpuslice simulate``) or from a sweep's store (``gpuslice report``): one
path for both, so a remade report is the report.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .metrics import CURVE_COLUMNS, HEADLINE, SUMMARY_COLUMNS, Curves, RunRecord, curve_rows, summary_row
from .reference import Reference

SUMMARY_FILE = "summary.csv"
CURVES_FILE = "curves.csv"
TABLE_FILE = "table.md"


def write_csv(path: Path, columns: Sequence[str], rows: Sequence[Mapping[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns))
        writer.writeheader()
        writer.writerows(rows)


def _float(value: object) -> float:
    try:
        return float(str(value))
    except ValueError:
        return math.nan


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def group_rows(
    rows: Sequence[Mapping[str, object]],
    bounds: Mapping[tuple[str, str], float] | None = None,
    reference: Reference | None = None,
) -> list[dict[str, object]]:
    """One row per (trace, policy) of summary rows: mean and sd over seeds, the paper's mean beside
    it, the bound (``bounds``: (trace, seed as text) -> allocated GPU %) when known."""
    bounds = bounds or {}
    groups: dict[tuple[str, str], list[Mapping[str, object]]] = defaultdict(list)
    for row in rows:
        groups[(str(row["trace"]), str(row["policy"]))].append(row)
    out = []
    for (trace, policy), members in groups.items():
        mean, sd = _mean_sd([_float(m["unallocated_gpu_pct_at_100"]) for m in members])
        paper = reference.mean_unallocated(trace, policy, HEADLINE) if reference else math.nan
        bound = [bounds[(trace, str(m["seed"]))] for m in members if (trace, str(m["seed"])) in bounds]
        out.append(
            {
                "trace": trace,
                "policy": policy,
                "seeds": len(members),
                "unallocated_mean": mean,
                "unallocated_sd": sd,
                "paper": paper,
                "delta": mean - paper,
                "bound_unallocated": 100 - statistics.fmean(bound) if bound else math.nan,
                "frag_rate": _mean_sd([_float(m["frag_rate_pct_at_100"]) for m in members])[0],
                "failed": statistics.fmean(_float(m["failed_pods"]) for m in members),
                "gpu_hours": _mean_sd([_float(m.get("gpu_hours", "")) for m in members])[0],
                "wall": statistics.fmean(_float(m["wall_seconds"]) for m in members),
            }
        )
    return out


class Report:
    """The figures of a set of runs, grouped by (trace, policy)."""

    def __init__(
        self,
        records: Sequence[RunRecord],
        reference: Reference | None = None,
        bounds: dict[tuple[str, int], float] | None = None,
    ) -> None:
        self.records = list(records)
        self.preamble = ""  # a line on where the runs come from, for table.md
        self.reference = reference
        self.bounds = bounds or {}  # (trace, seed) -> upper bound on allocated GPU % at arrived = 100%
        self.curves: list[Curves] = [r.curves for r in self.records]
        self.rows = [summary_row(r) for r in self.records]

    def groups(self) -> dict[tuple[str, str], list[int]]:
        out: dict[tuple[str, str], list[int]] = defaultdict(list)
        for i, r in enumerate(self.records):
            out[(r.trace, r.policy)].append(i)
        return dict(out)

    def write(self, out: Path, plots: bool = True) -> list[Path]:
        """``summary.csv``, ``curves.csv``, ``table.md`` and (unless ``plots`` is False) the
        plots, into ``out``."""
        out.mkdir(parents=True, exist_ok=True)
        write_csv(out / SUMMARY_FILE, SUMMARY_COLUMNS, self.rows)
        write_csv(out / CURVES_FILE, CURVE_COLUMNS, [row for r in self.records for row in curve_rows(r)])
        rows = self.table_rows()
        (out / TABLE_FILE).write_text(
            (f"{self.preamble}\n\n" if self.preamble else "")
            + "Unallocated GPU % at arrived = 100%, mean over seeds, ours / the paper's:\n\n"
            + pivot_table(rows)
            + "\nPer (trace, policy), mean ± sd over seeds:\n\n"
            + markdown_table(rows),
            encoding="utf-8",
        )
        written = [out / SUMMARY_FILE, out / CURVES_FILE, out / TABLE_FILE]
        if plots:
            from .plots import plot_overview, plot_traces

            written += plot_traces(self, out)
            if self.records:
                written.append(plot_overview(rows, out))
        return written

    # ------------------------------------------------------------ table

    def table_rows(self) -> list[dict[str, object]]:
        """One row per (trace, policy): mean and sd over seeds, the paper's mean beside it."""
        bounds = {(trace, str(seed)): value for (trace, seed), value in self.bounds.items()}
        return group_rows(self.rows, bounds, self.reference)

    def table(self) -> Table:
        """The rich table; a GPU-hours column only when some run has them (timed replays), the
        paper's and the bound's columns only when some row has them. Trace names and ``mean ± sd``
        never wrap nor are cut: at 80 columns the other columns' headers wrap instead."""
        rows = self.table_rows()
        timed = any(_float(r["gpu_hours"]) > 0 for r in rows)
        columns: dict[str, list[str]] = {
            "trace": [str(r["trace"]) for r in rows],
            "policy": [str(r["policy"]) for r in rows],
            "seeds": [str(r["seeds"]) for r in rows],
            "unallocated %": [_cell(r["unallocated_mean"], r["unallocated_sd"]) for r in rows],
            "paper %": [_cell(r["paper"]) for r in rows],
            "Δ pp": [_cell(r["delta"], signed=True) for r in rows],
            "bound: unalloc. %": [_cell(r["bound_unallocated"]) for r in rows],
            "frag rate %": [_cell(r["frag_rate"]) for r in rows],
            "failed pods": [_cell(r["failed"], digits=0) for r in rows],
            "GPU-hours": [_cell(r["gpu_hours"], digits=0) for r in rows] if timed else [],
            "s/run": [_cell(r["wall"], digits=1) for r in rows],
        }
        optional = ("paper %", "Δ pp", "bound: unalloc. %")
        shown = {
            name: cells
            for name, cells in columns.items()
            if (cells or not rows) and not (name in optional and all(c == "–" for c in cells))
        }
        if not timed:
            shown.pop("GPU-hours", None)
        table = Table(title="Unallocated GPU % at arrived = 100% (mean ± sd over seeds)")
        for name in shown:
            whole = name in ("trace", "policy", "unallocated %")
            table.add_column(name, justify="left" if name in ("trace", "policy") else "right", no_wrap=whole)
        for i in range(len(rows)):
            table.add_row(*(cells[i] for cells in shown.values()))
        return table

    def print(self, console: Console) -> None:
        console.print(self.table())

    def notes(self) -> list[str]:
        """Why a trace's row is empty, and what to pass: its pods ask for less GPU than the
        cluster has, so arrivals never reach the point the table reads (a kubectl snapshot
        with a few pending pods, typically)."""
        out = []
        for trace in dict.fromkeys(r.trace for r in self.records):
            members = [c for r, c in zip(self.records, self.curves, strict=True) if r.trace == trace]
            if not all(math.isnan(c.at(HEADLINE)[0]) for c in members):
                continue
            reached = max((int(c.arrived_pct.max()) for c in members if c.arrived_pct.size), default=0)
            out.append(
                f"{trace}: its pods ask for {reached}% of the cluster's GPU capacity, so arrivals never reach the "
                f"{HEADLINE}% the table reads at ('–'). To compare policies on a full cluster, grow the workload "
                "from these pods' shapes: --inflate 1.3 (with --replay arrivals for a timed input); or write "
                f"the curves up to {reached}% with --out DIR (curves.csv)."
            )
        return out


def _cell(value: object, sd: object = None, signed: bool = False, digits: int = 2) -> str:
    v = _float(value)
    if math.isnan(v):
        return "–"
    text = f"{v:+.{digits}f}" if signed else f"{v:.{digits}f}"
    s = _float(sd) if sd is not None else math.nan
    return text if math.isnan(s) else f"{text} ± {s:.{digits}f}"


def markdown_table(rows: Sequence[dict[str, object]]) -> str:
    """The table as Markdown (for simulations/README.md)."""
    lines = [
        "| trace | policy | seeds | unallocated % (ours) | paper % | Δ pp | bound: unalloc. % | frag rate % "
        "| failed pods |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['trace']} | {row['policy']} | {row['seeds']} | "
            f"{_cell(row['unallocated_mean'], row['unallocated_sd'])} | {_cell(row['paper'])} | "
            f"{_cell(row['delta'], signed=True)} | {_cell(row['bound_unallocated'])} | {_cell(row['frag_rate'])} | "
            f"{_cell(row['failed'], digits=0)} |"
        )
    return "\n".join(lines) + "\n"


def rows_from_files(
    summary: Path, bounds: Path | None = None, reference: Reference | None = None
) -> list[dict[str, object]]:
    """The table rows of a recorded ``summary.csv`` (and ``bound.csv``), for documents."""
    with summary.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    bound_by: dict[tuple[str, str], float] = {}
    if bounds is not None and bounds.exists():
        with bounds.open(newline="", encoding="utf-8") as handle:
            for b in csv.DictReader(handle):
                bound_by[(b["trace"], b["seed"])] = _float(b["bound_allocated_gpu_pct"])
    return group_rows(rows, bound_by, reference)


def pivot_table(
    rows: Sequence[Mapping[str, object]],
    limits: Mapping[str, float] | None = None,
    policies: Sequence[str] | None = None,
) -> str:
    """Markdown, one line per trace: per policy (``policies``, default: as they come), ours (mean
    over seeds) / the paper's; with ``limits`` (policy -> pp), a mark where the difference is
    outside the check."""
    by = {(str(r["trace"]), str(r["policy"])): r for r in rows}
    policies = list(policies or dict.fromkeys(p for _, p in by))
    traces = sorted({t for t, _ in by}, key=lambda t: (t != "default", t))
    lines = ["| trace | " + " | ".join(policies) + " |", "|---|" + "---:|" * len(policies)]
    for trace in traces:
        cells = []
        for policy in policies:
            row = by.get((trace, policy))
            if row is None:
                cells.append("–")
                continue
            ours, paper, delta = (_float(row[k]) for k in ("unallocated_mean", "paper", "delta"))
            limit = (limits or {}).get(policy, math.inf)
            mark = "" if math.isnan(delta) or abs(delta) <= limit else " ✗"
            cells.append(f"{ours:.2f}" if math.isnan(paper) else f"{ours:.2f} / {paper:.2f}{mark}")
        lines.append(f"| {trace} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
