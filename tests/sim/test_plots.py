"""What the report's plots and table show: no claim about the paper without the paper, a legend
beside the bars, a window on long runs that cuts no curve, and a table that fits 80 columns."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import matplotlib
import pytest
from rich.console import Console

from scheduler.sim import plots
from scheduler.sim.load import embedded_scenario
from scheduler.sim.metrics import RunRecord
from scheduler.sim.report import Report
from scheduler.sim.runner import RunSpec, run_all

matplotlib.use("Agg")


def report(replay: str | None = None, policies: tuple[str, ...] = ("fgd", "gpuclustering")) -> Report:
    trace = embedded_scenario()
    specs = [RunSpec(trace, p, s, replay=replay) for p in policies for s in (1, 2)]
    return Report([RunRecord.of(r) for r in run_all(specs, 1, show_progress=False)])


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """The figures the plots draw, kept open (the plots close each one once saved)."""
    import matplotlib.pyplot as plt

    close = plt.close
    kept: list[Any] = []
    monkeypatch.setattr(plt, "close", kept.append)
    yield kept
    for fig in kept:
        close(fig)


def test_the_overview_claims_no_paper_mean_without_a_reference_and_its_legend_covers_no_bar(
    tmp_path: Path, figures: list[Any]
) -> None:
    made = report()
    plots.plot_overview(made.table_rows(), tmp_path)
    (fig,) = figures
    ax = fig.axes[0]
    assert "paper" not in ax.get_title()
    fig.canvas.draw()
    legend = ax.get_legend().get_window_extent()
    axes = ax.get_window_extent()
    assert legend.x0 >= axes.x1  # beside the axes: it can hide no bar and no whisker


def test_a_timed_replay_is_shown_around_the_headline_and_no_curve_is_cut(tmp_path: Path, figures: list[Any]) -> None:
    made = report(replay="timed")
    assert max(float(c.arrived_pct.max()) for c in made.curves) > plots.WINDOW[1]  # runs far past 100%
    plots.plot_traces(made, tmp_path)
    unallocated = figures[0].axes[0]
    assert unallocated.get_xlim() == plots.WINDOW
    low, high = plots.WINDOW
    shown = [
        y
        for c in made.curves
        for x, y in zip(c.arrived_pct.tolist(), (100 - c.allocated_pct).tolist(), strict=True)
        if low <= x <= high
    ]
    bottom, top = unallocated.get_ylim()
    assert bottom <= min(shown) and max(shown) <= top, (min(shown), max(shown), bottom, top)


def test_the_table_fits_80_columns_with_whole_trace_names_and_whole_mean_sd() -> None:
    made = report(policies=("gpuclustering", "fgd-reserve"))
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(made.table())
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    rows = [line for line in lines if "small-mixed" in line]
    assert len(rows) == 2
    assert all(re.search(r"\d+\.\d\d ± \d+\.\d\d", row) for row in rows), "\n".join(lines)
    assert all(re.search(r"\b(gpuclustering|fgd-reserve)\b", row) for row in rows), "\n".join(lines)
