"""Writing a set of runs out: ``summary.csv``, ``curves.csv``, PNG plots and a terminal table."""

from __future__ import annotations

import csv
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from .engine import RunResult
from .metrics import CURVE_COLUMNS, HEADLINE, SUMMARY_COLUMNS, Curves, curve_rows, curves, summary_row
from .reference import Reference

SUMMARY_FILE = "summary.csv"
CURVES_FILE = "curves.csv"


def write_csv(path: Path, columns: Sequence[str], rows: Sequence[dict[str, object]]) -> None:
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


class Report:
    """The figures of a set of runs, grouped by (trace, policy)."""

    def __init__(
        self,
        results: Sequence[RunResult],
        reference: Reference | None = None,
        bounds: dict[tuple[str, int], float] | None = None,
    ) -> None:
        self.results = list(results)
        self.reference = reference
        self.bounds = bounds or {}  # (trace, seed) -> upper bound on allocated GPU % at arrived = 100%
        self.curves: list[Curves] = [curves(r) for r in self.results]
        self.rows = [summary_row(r, c) for r, c in zip(self.results, self.curves, strict=True)]

    def groups(self) -> dict[tuple[str, str], list[int]]:
        out: dict[tuple[str, str], list[int]] = defaultdict(list)
        for i, r in enumerate(self.results):
            out[(r.trace, r.policy)].append(i)
        return dict(out)

    def write(self, out: Path) -> list[Path]:
        out.mkdir(parents=True, exist_ok=True)
        write_csv(out / SUMMARY_FILE, SUMMARY_COLUMNS, self.rows)
        rows = [row for r, c in zip(self.results, self.curves, strict=True) for row in curve_rows(r, c)]
        write_csv(out / CURVES_FILE, CURVE_COLUMNS, rows)
        written = [out / SUMMARY_FILE, out / CURVES_FILE]
        written += self.plot(out)
        return written

    # ------------------------------------------------------------ table

    def table_rows(self) -> list[dict[str, object]]:
        """One row per (trace, policy): mean and sd over seeds, the paper's mean beside it."""
        rows = []
        for (trace, policy), members in self.groups().items():
            unalloc = [_float(self.rows[i]["unallocated_gpu_pct_at_100"]) for i in members]
            rate = [_float(self.rows[i]["frag_rate_pct_at_100"]) for i in members]
            mean, sd = _mean_sd(unalloc)
            paper = self.reference.mean_unallocated(trace, policy, HEADLINE) if self.reference else math.nan
            bound = [
                self.bounds[(trace, self.results[i].seed)]
                for i in members
                if (trace, self.results[i].seed) in self.bounds
            ]
            rows.append(
                {
                    "trace": trace,
                    "policy": policy,
                    "seeds": len(members),
                    "unallocated_mean": mean,
                    "unallocated_sd": sd,
                    "paper": paper,
                    "delta": mean - paper,
                    "bound_unallocated": 100 - statistics.fmean(bound) if bound else math.nan,
                    "frag_rate": _mean_sd(rate)[0],
                    "failed": statistics.fmean(self.results[i].failed for i in members),
                    "gpu_hours": statistics.fmean(self.results[i].gpu_hours for i in members),
                    "wall": statistics.fmean(self.results[i].wall_seconds for i in members),
                }
            )
        return rows

    def table(self) -> Table:
        table = Table(title="Unallocated GPU % at arrived = 100% (mean ± sd over seeds)")
        for column in (
            "trace",
            "policy",
            "seeds",
            "unallocated %",
            "paper %",
            "Δ pp",
            "bound: unalloc. %",
            "frag rate %",
            "failed pods",
            "GPU-hours",
            "s/run",
        ):
            table.add_column(column, justify="left" if column in ("trace", "policy") else "right")
        for row in self.table_rows():
            table.add_row(
                str(row["trace"]),
                str(row["policy"]),
                str(row["seeds"]),
                _cell(row["unallocated_mean"], row["unallocated_sd"]),
                _cell(row["paper"]),
                _cell(row["delta"], signed=True),
                _cell(row["bound_unallocated"]),
                _cell(row["frag_rate"]),
                _cell(row["failed"], digits=0),
                _cell(row["gpu_hours"], digits=0),
                _cell(row["wall"], digits=1),
            )
        return table

    def print(self, console: Console) -> None:
        console.print(self.table())

    # ------------------------------------------------------------ plots

    def plot(self, out: Path) -> list[Path]:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        written = []
        traces = sorted({r.trace for r in self.results})
        groups = self.groups()
        for trace in traces:
            policies = [p for (t, p) in groups if t == trace]
            for kind, ylabel, pick in (
                ("unallocated", "unallocated GPU (% of capacity)", lambda c: 100 - c.allocated_pct),
                ("frag_rate", "fragmentation rate (% of idle GPU)", lambda c: c.frag_rate_pct),
            ):
                fig, ax = plt.subplots(figsize=(7.5, 4.5))
                for n, policy in enumerate(policies):
                    color = f"C{n % 10}"
                    xs, median, low, high = _band([self.curves[i] for i in groups[(trace, policy)]], pick)
                    if xs.size == 0:
                        continue
                    ax.plot(xs, median, color=color, label=f"{policy} (ours)")
                    ax.fill_between(xs, low, high, color=color, alpha=0.2, linewidth=0)
                    if self.reference is not None:
                        ref = self._reference_band(trace, policy, kind)
                        if ref is not None:
                            ax.plot(ref[0], ref[1], color=color, linestyle="--", linewidth=1, label=f"{policy} (paper)")
                ax.set_xlabel("arrived GPU request (% of capacity)")
                ax.set_ylabel(ylabel)
                ax.set_title(f"{trace}: median over seeds, band min-max", fontsize=10)
                ax.grid(True, alpha=0.3)
                if kind == "unallocated" and ax.get_xlim()[1] > 100:
                    # the interesting part: where policies part ways, up to the end of the run
                    ax.set_xlim(left=60)
                    ax.set_ylim(bottom=0, top=min(45.0, ax.get_ylim()[1]))
                ax.legend(fontsize=7, ncol=2)
                path = out / f"{trace}_{kind}.png"
                fig.tight_layout()
                fig.savefig(path, dpi=110)
                plt.close(fig)
                written.append(path)
        return written

    def _reference_band(self, trace: str, policy: str, kind: str) -> tuple[np.ndarray, np.ndarray] | None:
        assert self.reference is not None
        source = self.reference.allocation if kind == "unallocated" else self.reference.frag_rate
        seeds = source.get((trace, policy))
        if not seeds:
            return None
        xs = sorted(set.intersection(*(set(c) for c in seeds)))
        values = np.array([[c[x] for x in xs] for c in seeds])
        median = np.median(values, axis=0)
        return np.array(xs), (100 - median if kind == "unallocated" else median)


def _band(members: Sequence[Curves], pick: object) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    assert callable(pick)
    common = sorted(set.intersection(*(set(c.arrived_pct.tolist()) for c in members))) if members else []
    if not common:
        return np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0)
    rows = []
    for c in members:
        values = pick(c)
        lookup = dict(zip(c.arrived_pct.tolist(), values.tolist(), strict=True))
        rows.append([lookup[x] for x in common])
    data = np.array(rows)
    return np.array(common), np.median(data, axis=0), data.min(axis=0), data.max(axis=0)


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
    groups: dict[tuple[str, str], list[dict[str, str]]] = defaultdict(list)
    for row in rows:
        groups[(row["trace"], row["policy"])].append(row)
    out = []
    for (trace, policy), members in groups.items():
        mean, sd = _mean_sd([_float(m["unallocated_gpu_pct_at_100"]) for m in members])
        paper = reference.mean_unallocated(trace, policy, HEADLINE) if reference else math.nan
        bound = [bound_by[(trace, m["seed"])] for m in members if (trace, m["seed"]) in bound_by]
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
                "wall": statistics.fmean(_float(m["wall_seconds"]) for m in members),
            }
        )
    return out
