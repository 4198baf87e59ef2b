"""Running a sweep: plan it, skip what the store already has, run the rest on an executor,
store each outcome the moment it comes back, and make the report from the store.

The report is always made from the store, never from the runs in memory, so ``gpuslice report
OUT`` remakes exactly what the sweep wrote.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from .errors import TraceError
from .executors import Executor, Outcome, RunFailed
from .load import load_trace
from .metrics import RunRecord
from .model import Trace
from .reference import Reference
from .reference import load as load_reference
from .report import Report
from .store import OK, Store, StoreError, record_of, run_entry
from .sweep import PlannedRun, Sweep, SweepError, plan

KEEP_BARS = 40  # at most this many runs to do: every run keeps its bar; more: finished bars go


@dataclass
class SweepSummary:
    planned: int
    stored_before: int
    ran: int = 0
    failed: list[str] = field(default_factory=list)  # "label: error" of the runs that failed


def input_hashes(sweep: Sweep) -> list[str]:
    """The content hash of every input; :class:`SweepError` for one that is not there."""
    hashes = []
    for i, item in enumerate(sweep.inputs):
        if not item.path.is_file():
            raise SweepError(
                f"{sweep.source.name}: inputs[{i}]: {item.path} does not exist (inputs are relative to the data "
                f"folder {sweep.data}; set it with --data DIR or the file's data: key)"
            )
        hashes.append(item.content_hash())
    return hashes


class _Display:
    """The store writer and the progress bars: what happens when a run starts, moves, ends."""

    def __init__(
        self, runs: list[PlannedRun], sweep: Sweep, store: Store, bars: Progress, summary: SweepSummary
    ) -> None:
        self.runs, self.sweep, self.store, self.bars = runs, sweep, store, bars
        self.summary = summary
        self.keep = len(runs) <= KEEP_BARS
        self.tasks: dict[int, TaskID] = {}
        self.totals: dict[int, int] = {}  # events per run, as its progress said
        self.overall = bars.add_task(f"{sweep.name}: runs", total=len(runs))

    def started(self, index: int) -> None:
        if index not in self.tasks:
            self.tasks[index] = self.bars.add_task(self.runs[index].label, total=None)

    def progress(self, index: int, done: int, total: int) -> None:
        self.started(index)
        self.totals[index] = total
        self.bars.update(self.tasks[index], completed=done, total=total)

    def finished(self, index: int, outcome: Outcome) -> None:
        run = self.runs[index]
        self.store.put(run_entry(run, self.sweep, outcome))
        self.summary.ran += 1
        self.bars.advance(self.overall)
        self.started(index)
        task = self.tasks[index]
        if isinstance(outcome, RunFailed):
            self.summary.failed.append(f"{run.label}: {outcome.error}")
            self.bars.console.print(f"failed: {run.label}: {outcome.error}")
        if self.keep and isinstance(outcome, RunRecord):
            events = self.totals.get(index, outcome.placed + outcome.failed)
            self.bars.update(task, completed=events, total=events)
        else:
            self.bars.remove_task(task)


def run_sweep(
    sweep: Sweep, executor: Executor, out: Path, console: Console | None = None, show_progress: bool = True
) -> SweepSummary:
    """Every run of ``sweep`` that ``out`` does not hold yet, on ``executor``, each outcome stored
    as it comes (make the report with :func:`stored_report`)."""
    console = console or Console(stderr=True)
    began, wall = datetime.now(UTC), time.perf_counter()
    _check_reference(sweep)
    planned = plan(sweep, input_hashes(sweep))
    store = Store(out)
    store.remove_leftovers()
    entries = store.entries()
    todo: list[PlannedRun] = []
    for run in planned:
        entry = entries.get(run.run_id)
        if entry is None or entry["status"] != OK:
            todo.append(run)
        elif (entry["run"]["trace"], entry["run"]["label"]) != (run.trace, run.policy.label):
            entry["run"]["trace"], entry["run"]["label"] = run.trace, run.policy.label  # relabelled, same run
            store.put(entry)
    store.write_plan(sweep, planned, str(sweep.reference) if sweep.reference else None)
    summary = SweepSummary(len(planned), len(planned) - len(todo))
    console.print(
        f"sweep {sweep.name}: {len(planned)} runs, {summary.stored_before} already in {out}, "
        f"{len(todo)} to run on {executor.name}"
    )
    traces: dict[int, Trace] = {}
    broken: dict[int, str] = {}
    for index in sorted({run.input_index for run in todo}):
        item = sweep.inputs[index]
        try:
            traces[index] = load_trace(item.path, item.nodes)
        except TraceError as exc:
            broken[index] = str(exc)
    try:
        _run_all(sweep, executor, store, todo, traces, broken, summary, console, show_progress)
    finally:
        store.add_session(
            {
                "started": began.isoformat(timespec="seconds"),
                "executor": executor.name,
                "seconds": round(time.perf_counter() - wall, 1),
                "ran": summary.ran,
                "failed": len(summary.failed),
                "complete": summary.ran == len(todo),
            }
        )
    return summary


def _run_all(
    sweep: Sweep,
    executor: Executor,
    store: Store,
    todo: list[PlannedRun],
    traces: dict[int, Trace],
    broken: dict[int, str],
    summary: SweepSummary,
    console: Console,
    show_progress: bool,
) -> None:
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not show_progress,
        transient=False,
    ) as bars:
        display = _Display(todo, sweep, store, bars, summary)
        runnable = []
        for index, run in enumerate(todo):
            if run.input_index in broken:
                display.finished(index, RunFailed(broken[run.input_index]))
            else:
                runnable.append(index)
        executor.run([todo[i] for i in runnable], traces, _Reindexed(display, runnable))


class _Reindexed:
    """The display's events for a subset of its runs (the executor numbers them from 0)."""

    def __init__(self, display: _Display, indices: list[int]) -> None:
        self.display, self.indices = display, indices

    def started(self, index: int) -> None:
        self.display.started(self.indices[index])

    def progress(self, index: int, done: int, total: int) -> None:
        self.display.progress(self.indices[index], done, total)

    def finished(self, index: int, outcome: Outcome) -> None:
        self.display.finished(self.indices[index], outcome)


def _check_reference(sweep: Sweep) -> None:
    """Read the sweep's reference now, so a wrong path stops it before hours of runs."""
    if sweep.reference is None:
        return
    if not sweep.reference.is_dir():
        raise SweepError(
            f"{sweep.source.name}: reference: {sweep.reference} does not exist (it is relative to the data folder "
            f"{sweep.data}; set it with --reference DIR)"
        )
    load_reference(sweep.reference)


def stored_report(out: Path, reference: Path | None = None) -> tuple[Report, list[dict[str, Any]], list[str]]:
    """The report of the runs stored in ``out`` (in the plan's order), the failed entries, and
    notes to show (a reference that is gone)."""
    store = Store(out)
    plan_doc = store.read_plan()
    entries = store.entries()
    if not entries:
        raise StoreError(f"{out}: holds no stored run (expected the results folder of a sweep, with runs/*.json)")
    order = {run_id: n for n, run_id in enumerate(plan_doc.get("runs", []))}
    ranked = sorted(entries.values(), key=lambda e: (order.get(e["id"], len(order)), e["id"]))
    notes: list[str] = []
    ref: Reference | None = None
    if reference is not None:
        ref = load_reference(reference)
    elif plan_doc.get("reference"):
        recorded = Path(str(plan_doc["reference"]))
        if recorded.is_dir():
            ref = load_reference(recorded)
        else:
            notes.append(f"the sweep's reference {recorded} is gone: no paper column (give one with --reference)")
    records = [record_of(e) for e in ranked if e["status"] == OK]
    failed = [e for e in ranked if e["status"] != OK]
    made = Report(records, ref)
    made.preamble = _account(plan_doc, records, len(failed))
    return made, failed, notes


def _account(plan_doc: dict[str, Any], records: list[RunRecord], failed: int) -> str:
    """Where the runs come from: how many, in how many sweeps, how long."""
    sessions = [s for s in plan_doc.get("sessions", []) if isinstance(s, dict)]
    seconds = sum(float(s.get("seconds", 0)) for s in sessions)
    own = sum(r.wall_seconds for r in records)
    planned = len(plan_doc.get("runs", []))
    return (
        f"{len(records)} runs stored{f' of the {planned} planned' if planned else ''} ({failed} failed); "
        f"{len(sessions)} sweep(s), {seconds / 3600:.2f} h of wall time in all; "
        f"the runs' own time: {own / 3600:.2f} h"
    )
