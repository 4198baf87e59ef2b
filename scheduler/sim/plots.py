"""The PNG plots of a report: per trace, unallocated GPU and fragmentation rate against arrived
GPU (one line per policy, median over seeds, band min..max, the paper's median dashed); and one
overview figure, unallocated GPU at arrived = 100% per trace and policy.

matplotlib is imported inside the functions: only a report that is written pays for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .metrics import Curves

if TYPE_CHECKING:
    from .report import Report

OVERVIEW_FILE = "unallocated_by_trace.png"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_traces(report: Report, out: Path) -> list[Path]:
    """Two plots per trace, ``<trace>_unallocated.png`` and ``<trace>_frag_rate.png``."""
    plt = _pyplot()
    written = []
    traces = sorted({r.trace for r in report.records})
    groups = report.groups()
    kinds: tuple[tuple[str, str, Callable[[Curves], np.ndarray]], ...] = (
        ("unallocated", "unallocated GPU (% of capacity)", lambda c: 100 - c.allocated_pct),
        ("frag_rate", "fragmentation rate (% of idle GPU)", lambda c: c.frag_rate_pct),
    )
    for trace in traces:
        policies = [p for (t, p) in groups if t == trace]
        for kind, ylabel, pick in kinds:
            fig, ax = plt.subplots(figsize=(7.5, 4.5))
            drawn: list[tuple[np.ndarray, np.ndarray]] = []  # every curve and band edge, for the window
            for n, policy in enumerate(policies):
                color = f"C{n % 10}"
                xs, median, low, high = _band([report.curves[i] for i in groups[(trace, policy)]], pick)
                if xs.size == 0:
                    continue
                ax.plot(xs, median, color=color, label=f"{policy} (ours)")
                ax.fill_between(xs, low, high, color=color, alpha=0.2, linewidth=0)
                drawn += [(xs, low), (xs, high)]
                ref = _reference_band(report, trace, policy, kind)
                if ref is not None:
                    ax.plot(ref[0], ref[1], color=color, linestyle="--", linewidth=1, label=f"{policy} (paper)")
                    drawn.append(ref)
            ax.set_xlabel("arrived GPU request (% of capacity)")
            ax.set_ylabel(ylabel)
            title = f"{trace}: median over seeds, band min-max"
            if drawn and max(float(x.max()) for x, _ in drawn) > WINDOW[1]:
                title += f"; arrived {WINDOW[0]}-{WINDOW[1]}% shown"
                _window(ax, drawn)
            ax.set_title(title, fontsize=10)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7, ncol=2)
            path = out / f"{trace}_{kind}.png"
            fig.tight_layout()
            fig.savefig(path, dpi=110)
            plt.close(fig)
            written.append(path)
    return written


# Arrived GPU % shown when a run goes further (a timed replay's arrivals reach several times the
# capacity): from where policies part ways to a little past the headline (100%), as the FGD paper
# draws it; the y-axis then fits every curve and band inside that window.
WINDOW = (60, 130)


def _window(ax: Any, drawn: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
    inside = [y[(x >= WINDOW[0]) & (x <= WINDOW[1])] for x, y in drawn]
    values = np.concatenate([v for v in inside if v.size]) if any(v.size for v in inside) else np.zeros(1)
    top = float(np.nanmax(values)) if np.isfinite(values).any() else 1.0
    ax.set_xlim(*WINDOW)
    ax.set_ylim(bottom=0, top=max(1.0, top * 1.05))
    ax.axvline(100, color="0.5", linestyle=":", linewidth=1)


def plot_overview(rows: Sequence[Mapping[str, object]], out: Path) -> Path:
    """``unallocated_by_trace.png``: per trace a group of bars, one per policy (mean over seeds,
    grey whisker ± sd), the paper's mean as a black bar across it where it is known."""
    plt = _pyplot()
    by = {(str(r["trace"]), str(r["policy"])): r for r in rows}
    traces = sorted({t for t, _ in by}, key=lambda t: (t != "default", t))
    policies = list(dict.fromkeys(p for _, p in by))
    width = 0.8 / max(1, len(policies))
    fig, ax = plt.subplots(figsize=(max(7.5, 0.9 * len(traces) + 3.5), 4.8))
    xs = np.arange(len(traces))
    paper_labelled = False
    for n, policy in enumerate(policies):
        means, sds, papers = [], [], []
        for trace in traces:
            row = by.get((trace, policy), {})
            means.append(_number(row.get("unallocated_mean")))
            sds.append(_number(row.get("unallocated_sd")))
            papers.append(_number(row.get("paper")))
        at = xs - 0.4 + width * (n + 0.5)
        ax.bar(
            at,
            means,
            width,
            yerr=np.nan_to_num(sds),
            color=f"C{n % 10}",
            label=policy,
            error_kw={"ecolor": "0.45", "elinewidth": 0.8},
        )
        known = [i for i, v in enumerate(papers) if not math.isnan(v)]
        if known:
            ax.scatter(
                at[known],
                [papers[i] for i in known],
                marker="_",
                color="black",
                s=max(40.0, 900 * width),
                linewidths=2,
                zorder=3,
                label=None if paper_labelled else "paper",
            )
            paper_labelled = True
    ax.set_xticks(xs, traces, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("unallocated GPU at arrived = 100% (%)")
    note = "; black: the paper's mean" if paper_labelled else ""
    ax.set_title(f"Unallocated GPU per trace and policy (mean ± sd over seeds{note})", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    # beside the axes, never over a bar or its whisker
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    path = out / OVERVIEW_FILE
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _number(value: object) -> float:
    try:
        return float(str(value))
    except ValueError:
        return math.nan


def _reference_band(report: Report, trace: str, policy: str, kind: str) -> tuple[np.ndarray, np.ndarray] | None:
    if report.reference is None:
        return None
    source = report.reference.allocation if kind == "unallocated" else report.reference.frag_rate
    seeds = source.get((trace, policy))
    if not seeds:
        return None
    xs = sorted(set.intersection(*(set(c) for c in seeds)))
    values = np.array([[c[x] for x in xs] for c in seeds])
    median = np.median(values, axis=0)
    return np.array(xs), (100 - median if kind == "unallocated" else median)


def _band(
    members: Sequence[Curves], pick: Callable[[Curves], np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    common = sorted(set.intersection(*(set(c.arrived_pct.tolist()) for c in members))) if members else []
    if not common:
        return np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0)
    rows = []
    for c in members:
        lookup = dict(zip(c.arrived_pct.tolist(), pick(c).tolist(), strict=True))
        rows.append([lookup[x] for x in common])
    data = np.array(rows)
    return np.array(common), np.median(data, axis=0), data.min(axis=0), data.max(axis=0)
