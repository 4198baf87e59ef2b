"""What ``gpuslice simulate`` and ``gpuslice bound`` do, as plain functions (the command line
itself is declared in ``scheduler.cli``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from scheduler.core.errors import UsageError
from scheduler.core.policies import REGISTRY

from . import defragtable
from .advise import DEFAULT_POLICY
from .bound import Bound, bound
from .defrag import DefragSpec
from .engine import RunResult
from .errors import Interrupted, TraceError
from .load import embedded_scenario, load_trace
from .metrics import RunRecord
from .model import ARRIVALS, REPLAY_MODES, TIMED, Trace
from .reference import Reference
from .reference import load as load_reference
from .report import Report, write_csv
from .runner import RunSpec, default_workers, run_all

PAPER_POLICIES = ("random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd")
DEFAULT_POLICIES = (*PAPER_POLICIES, DEFAULT_POLICY)  # the paper's six and the extender's default
NOTHING_WRITTEN = "nothing written (no --out): add --out DIR for {files}"
MAX_SEEDS = 1000  # runs are traces x policies x seeds: a typo such as 1-100000 would never end


def _console() -> Console:
    """Stdout, at least 132 columns wide so the table stays readable when piped."""
    console = Console()
    return console if console.is_terminal and console.width >= 132 else Console(width=max(132, console.width))


def parse_seeds(text: str) -> list[int]:
    """``42``, ``42,43,47`` or ``42-51`` (inclusive), at most :data:`MAX_SEEDS` of them."""
    accepted = f"a seed (42), a list (42,43) or a range (42-51), at most {MAX_SEEDS} seeds"
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part.lstrip("-"):
                low, high = part.split("-", 1)
                a, b = int(low), int(high)
                if b < a or b - a >= MAX_SEEDS:
                    raise ValueError
                seeds.extend(range(a, b + 1))
            else:
                seeds.append(int(part))
        except ValueError:
            raise UsageError(f"--seeds {text!r}: accepted: {accepted}") from None
    seeds = list(dict.fromkeys(seeds))
    if len(seeds) > MAX_SEEDS:
        raise UsageError(f"--seeds {text!r}: accepted: {accepted}")
    return seeds


def parse_policies(values: Sequence[str] | None) -> list[str]:
    names: list[str] = []
    for value in values or [",".join(DEFAULT_POLICIES)]:
        for name in value.split(","):
            name = name.strip().lower()
            if not name:
                continue
            if name not in REGISTRY:
                raise UsageError(f"--policy {name!r}: accepted: {', '.join(sorted(REGISTRY))}")
            names.append(name)
    if not names:
        raise UsageError(f"--policy {','.join(values or [])!r}: accepted: one or more of {', '.join(sorted(REGISTRY))}")
    return list(dict.fromkeys(names))


DEFRAG_ARMS = "off (the plain replay), wait (budget 0: pods wait for the planner, no move) or a number of evictions"


def parse_arms(text: str, every_min: float, min_fall_milli: float) -> list[DefragSpec | None]:
    """``off,wait,4``: the defragmentation arms to run (None: the plain replay), each planner run
    ``every_min`` minutes apart (the caller checked both numbers)."""
    arms: list[DefragSpec | None] = []
    for part in text.split(","):
        word = part.strip().lower()
        if word == "off":
            arms.append(None)
        elif word == "wait" or word.isdigit():
            arms.append(DefragSpec(every_min * 60, 0 if word == "wait" else int(word), min_fall_milli))
        else:
            raise UsageError(f"--defrag-budget {text!r}: accepted: a comma-separated list of {DEFRAG_ARMS}")
    return list(dict.fromkeys(arms))


def load_traces(paths: Sequence[Path], nodes: Path | None) -> list[Trace]:
    if not paths:
        if nodes is not None:
            raise UsageError("--nodes needs an openb pod list (a .csv) as the trace")
        return [embedded_scenario()]
    traces = [load_trace(p, nodes) for p in paths]
    names = [t.name for t in traces]
    if len(set(names)) != len(names):
        raise UsageError(f"two traces have the same name ({', '.join(names)}); rename one")
    return traces


def simulate(
    traces: Sequence[Path],
    nodes: Path | None,
    policy: Sequence[str] | None,
    seeds: str,
    inflate: float | None = None,
    replay: str | None = None,
    shuffle: bool | None = None,
    workers: int | None = None,
    out: Path | None = None,
    reference: Path | None = None,
    with_bound: bool = False,
    quiet: bool = False,
    defrag_budget: str | None = None,
    defrag_every_min: float = 10.0,
    defrag_min_fall_milli: float = 500.0,
    compress: float = 1.0,
) -> None:
    """``gpuslice simulate``: replay ``traces`` (none: the embedded scenario) through the packing
    core, print the comparison and write it to ``out``. With ``defrag_budget`` (arms such as
    ``off,wait,4``, timed replays only) each run is repeated per arm and the defragmentation table
    (:mod:`.defragtable`) is printed and written instead. :class:`UsageError` for a rejected option.

    The caller has checked the numbers and ``out`` (the composition root does, from the
    command line's text); this checks what needs the simulator: seeds, policies, replay
    modes, the defragmentation arms, and which inputs an option applies to.
    """
    console = _console()
    seed_list = parse_seeds(seeds)
    policies = parse_policies(policy)
    if replay is not None and replay not in REPLAY_MODES:
        raise UsageError(f"--replay {replay!r}: accepted: {', '.join(REPLAY_MODES)}")
    arms = None if defrag_budget is None else parse_arms(defrag_budget, defrag_every_min, defrag_min_fall_milli)
    loaded = load_traces(traces, nodes)
    if with_bound and all((replay or t.replay) != ARRIVALS for t in loaded):
        raise UsageError("--bound: the LP bound covers arrivals only, and every input here replays timed")
    if arms is not None:
        for t in loaded:
            if (replay or t.replay) != TIMED:
                raise UsageError(
                    f"--defrag-budget needs simulated time: {t.name} replays {replay or t.replay}; "
                    f"give --replay {TIMED}"
                )
        specs = [
            RunSpec(t, p, s, replay, inflate, shuffle, defrag=a, compress=compress)
            for t in loaded
            for p in policies
            for s in seed_list
            for a in arms
        ]
        results, stopped = _finished(specs, workers, quiet)
        recorded = defragtable.rows(results)
        console.print(defragtable.table(defragtable.summary(recorded)))
        written = []
        if out is not None:
            written.append(out / defragtable.DEFRAG_FILE)
            write_csv(written[0], defragtable.COLUMNS, recorded)
        _wrote(console, written, stopped, defragtable.DEFRAG_FILE)
        return
    ref: Reference | None = load_reference(reference) if reference is not None else None
    specs = [
        RunSpec(t, p, s, replay, inflate, shuffle, compress=compress)
        for t in loaded
        for p in policies
        for s in seed_list
    ]
    results, stopped = _finished(specs, workers, quiet)
    bounds: dict[tuple[str, int], float] = {}
    if with_bound and stopped is None:
        for t in loaded:
            if (replay or t.replay) != ARRIVALS:
                continue
            for s in seed_list:
                bounds[(t.name, s)] = bound(t, s, 100, inflate, shuffle).bound_pct
    report = Report([RunRecord.of(r) for r in results], ref, bounds)
    report.print(console)
    for note in report.notes():
        console.print(f"note: {note}", highlight=False)
    # stopped: the data of the finished runs at once, not the seconds the plots take
    written = report.write(out, plots=stopped is None) if out is not None and results else []
    _wrote(
        console,
        written,
        stopped,
        "summary.csv, curves.csv, table.md and the plots" if out is None else "",
        plots_skipped=stopped is not None,
    )


def _finished(specs: Sequence[RunSpec], workers: int | None, quiet: bool) -> tuple[list[RunResult], Interrupted | None]:
    """The runs' results; stopped by a signal, those that had finished and the interruption."""
    try:
        return run_all(specs, workers or default_workers(), Console(stderr=True), show_progress=not quiet), None
    except Interrupted as stopped:
        return stopped.finished, stopped


def _wrote(
    console: Console, written: Sequence[Path], stopped: Interrupted | None, unwritten: str, plots_skipped: bool = False
) -> None:
    """Say what was written (or, with no ``--out``, that nothing was: ``unwritten`` names what
    ``--out`` would write); after an interruption, end the command with one line that says
    what was kept and where, and that the plots were left out if they were
    (:class:`Interrupted`, exit 128 + the signal)."""
    if stopped is None:
        for path in written:
            console.print(f"wrote {path}", highlight=False)
        if not written and unwritten:
            console.print(NOTHING_WRITTEN.format(files=unwritten), highlight=False)
        return
    folder = written[0].parent if written else None
    kept = f"; wrote them to {folder}/ ({', '.join(p.name for p in written)})" if folder else "; nothing written"
    if folder and plots_skipped:
        kept += "; no plots (stopped: run it again to draw them)"
    raise Interrupted(stopped.signum, stopped.finished, stopped.total, kept)


def bound_table(
    traces: Sequence[Path],
    nodes: Path | None,
    seeds: str,
    inflate: float | None = None,
    shuffle: bool | None = None,
    at: int = 100,
    out: Path | None = None,
) -> None:
    """``gpuslice bound``: the LP upper bound per (trace, seed), printed and written to ``out``."""
    console = _console()
    seed_list = parse_seeds(seeds)
    loaded = load_traces(traces, nodes)
    timed = [t.name for t in loaded if t.replay != ARRIVALS]
    if timed:
        raise UsageError(f"{', '.join(timed)}: replays timed; the LP bound covers arrivals-only replays")
    results: list[Bound] = [bound(t, s, at, inflate, shuffle) for t in loaded for s in seed_list]
    table = Table(title=f"Upper bound on allocated GPU at arrived = {at}% (LP relaxation, HiGHS)")
    for column in ("trace", "seed", "pods", "requested %", "bound %", "bound unallocated %"):
        table.add_column(column, justify="left" if column == "trace" else "right")
    rows = []
    for b in results:
        table.add_row(
            b.trace,
            str(b.seed),
            str(b.pods),
            f"{b.requested_pct:.2f}",
            f"{b.bound_pct:.2f}",
            f"{100 - b.bound_pct:.2f}",
        )
        rows.append(
            {
                "trace": b.trace,
                "seed": b.seed,
                "arrived_pct": at,
                "pods": b.pods,
                "requested_gpu_pct": f"{b.requested_pct:.2f}",
                "bound_allocated_gpu_pct": f"{b.bound_pct:.2f}",
                "bound_unallocated_gpu_pct": f"{100 - b.bound_pct:.2f}",
            }
        )
    console.print(table)
    for note in sorted({note for b in results for note in b.notes}):
        console.print(f"note: {note}")
    if out is not None:
        path = out / "bound.csv"
        write_csv(path, list(rows[0]) if rows else ["trace"], rows)
        console.print(f"wrote {path}")


def sweep(
    file: Path,
    data: Path | None = None,
    out: Path | None = None,
    reference: Path | None = None,
    executor: str | None = None,
    quiet: bool = False,
) -> int:
    """``gpuslice sweep``: the runs of ``file`` that ``out`` lacks, then the report from the
    store. Returns how many runs failed (their errors are stored)."""
    from .executors import parse_executor
    from .sweep import load_sweep
    from .sweeper import run_sweep

    console = _console()
    chosen = parse_executor(executor)  # before the file is read: a bad option costs nothing
    described = load_sweep(file, data, out, reference)
    if described.out is None:
        raise UsageError(f"--out: {file.name} names no results folder (give --out DIR or an out: key)")
    summary = run_sweep(described, chosen, described.out, Console(stderr=True), show_progress=not quiet)
    _report(described.out, reference, console)
    failed = len(summary.failed)
    console.print(
        f"sweep {described.name}: {summary.planned} runs, {summary.stored_before} were stored, {summary.ran} ran, "
        f"{failed} failed" + (f" (their errors: {described.out / 'runs'}/<id>.json)" if failed else "")
    )
    return failed


def report(out: Path, reference: Path | None = None) -> None:
    """``gpuslice report``: the tables and plots of the runs stored in ``out``, run nothing."""
    _report(out, reference, _console())


def _report(out: Path, reference: Path | None, console: Console) -> None:
    from .sweeper import stored_report

    made, failed, notes = stored_report(out, reference)
    made.print(console)
    for path in made.write(out):
        console.print(f"wrote {path}")
    for note in notes:
        console.print(f"note: {note}")
    if failed:
        console.print(f"note: {len(failed)} stored runs failed and are left out; their errors are in {out}/runs/")


__all__ = ["TraceError", "bound_table", "report", "simulate", "sweep"]
