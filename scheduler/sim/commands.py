"""``gpuslice simulate`` and ``gpuslice bound``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from scheduler.cli import app
from scheduler.core.errors import GpusliceError
from scheduler.core.policies import REGISTRY

from .bound import Bound, bound
from .errors import TraceError
from .load import embedded_scenario, load_trace
from .model import ARRIVALS, REPLAY_MODES, Trace
from .reference import Reference
from .reference import load as load_reference
from .report import Report, write_csv
from .runner import RunSpec, default_workers, run_all

PAPER_POLICIES = ("random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd")
DEFAULT_SEEDS = "42"


def _console() -> Console:
    """Stdout, at least 132 columns wide so the table stays readable when piped."""
    console = Console()
    return console if console.is_terminal and console.width >= 132 else Console(width=max(132, console.width))


def _fail(message: str, code: int = 2) -> typer.Exit:
    print(f"error: {message}", file=sys.stderr)
    return typer.Exit(code)


def parse_seeds(text: str) -> list[int]:
    """``42``, ``42,43,47`` or ``42-51`` (inclusive)."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part.lstrip("-"):
                low, high = part.split("-", 1)
                a, b = int(low), int(high)
                if b < a:
                    raise ValueError
                seeds.extend(range(a, b + 1))
            else:
                seeds.append(int(part))
        except ValueError:
            raise ValueError(f"--seeds {text!r}: accepted: a seed (42), a list (42,43) or a range (42-51)") from None
    return list(dict.fromkeys(seeds))


def parse_policies(values: list[str] | None) -> list[str]:
    names: list[str] = []
    for value in values or [",".join(PAPER_POLICIES)]:
        for name in value.split(","):
            name = name.strip().lower()
            if not name:
                continue
            if name not in REGISTRY:
                raise ValueError(f"--policy {name!r}: accepted: {', '.join(sorted(REGISTRY))}")
            names.append(name)
    return list(dict.fromkeys(names))


def load_traces(paths: list[Path] | None, nodes: Path | None) -> list[Trace]:
    if not paths:
        if nodes is not None:
            raise ValueError("--nodes needs an openb pod list (a .csv) as the trace")
        return [embedded_scenario()]
    traces = [load_trace(p, nodes) for p in paths]
    names = [t.name for t in traces]
    if len(set(names)) != len(names):
        raise ValueError(f"two traces have the same name ({', '.join(names)}); rename one")
    return traces


TRACE_HELP = (
    "Input(s): an openb pod list (.csv), a scenario (.yaml) or a Kubernetes v1 List "
    "(kubectl get nodes,pods -A -o yaml). None: a small embedded scenario."
)


@app.command()
def simulate(
    traces: Annotated[list[Path] | None, typer.Argument(help=TRACE_HELP, show_default=False)] = None,
    nodes: Annotated[
        Path | None, typer.Option(help="openb node list (default: the GPU node list beside the pod list).")
    ] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option("--policy", "-p", help="Policy, repeatable or comma separated (default: the paper's six)."),
    ] = None,
    seeds: Annotated[str, typer.Option(help="Seeds: 42, 42,43 or 42-51.")] = DEFAULT_SEEDS,
    inflate: Annotated[
        float | None,
        typer.Option(
            help="Grow the workload to this x GPU capacity (arrivals default: the input's own, "
            "1.3 for openb; timed: only when given; 0: as given)."
        ),
    ] = None,
    compress: Annotated[
        float,
        typer.Option(help="Timed: divide creation times by this factor, durations kept (the load rises)."),
    ] = 1.0,
    replay: Annotated[
        str | None,
        typer.Option(
            help="arrivals (FGD protocol) or timed (creation and deletion "
            "times, departures free shares). Default: the input's own."
        ),
    ] = None,
    shuffle: Annotated[
        bool | None,
        typer.Option(
            "--shuffle/--no-shuffle", help="Arrivals: seeded shuffle (default: the input's own).", show_default=False
        ),
    ] = None,
    workers: Annotated[int | None, typer.Option(help="Processes (default: all cores).")] = None,
    out: Annotated[Path | None, typer.Option(help="Write summary.csv, curves.csv and PNG plots here.")] = None,
    reference: Annotated[
        Path | None, typer.Option(help="The paper's curves (fgd_expected_results) to compare and overlay.")
    ] = None,
    with_bound: Annotated[
        bool,
        typer.Option("--bound/--no-bound", help="Also compute the LP upper bound per (trace, seed) (arrivals only)."),
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")] = False,
) -> None:
    """Replay traces or scenarios through the packing core and compare policies."""
    console = _console()
    try:
        seed_list = parse_seeds(seeds)
        policies = parse_policies(policy)
        if replay is not None and replay not in REPLAY_MODES:
            raise ValueError(f"--replay {replay!r}: accepted: {', '.join(REPLAY_MODES)}")
        if workers is not None and workers < 1:
            raise ValueError(f"--workers {workers}: accepted: 1 or more")
        if inflate is not None and inflate < 0:
            raise ValueError(f"--inflate {inflate}: accepted: 0 (as given) or a positive ratio such as 1.3")
        if not compress > 0:
            raise ValueError(f"--compress {compress}: accepted: a positive factor (1: times as recorded)")
        loaded = load_traces(traces, nodes)
        ref: Reference | None = load_reference(reference) if reference is not None else None
    except (GpusliceError, ValueError) as exc:
        raise _fail(str(exc)) from None
    specs = [
        RunSpec(t, p, s, replay, inflate, shuffle, compress=compress)
        for t in loaded
        for p in policies
        for s in seed_list
    ]
    try:
        results = run_all(specs, workers or default_workers(), Console(stderr=True), show_progress=not quiet)
    except GpusliceError as exc:
        raise _fail(str(exc)) from None
    bounds: dict[tuple[str, int], float] = {}
    if with_bound:
        for t in loaded:
            if (replay or t.replay) != ARRIVALS:
                continue
            for s in seed_list:
                bounds[(t.name, s)] = bound(t, s, 100, inflate, shuffle).bound_pct
    report = Report(results, ref, bounds)
    report.print(console)
    if out is not None:
        for path in report.write(out):
            console.print(f"wrote {path}")


@app.command("bound")
def bound_command(
    traces: Annotated[list[Path] | None, typer.Argument(help=TRACE_HELP, show_default=False)] = None,
    nodes: Annotated[Path | None, typer.Option(help="openb node list.")] = None,
    seeds: Annotated[str, typer.Option(help="Seeds: 42, 42,43 or 42-51.")] = DEFAULT_SEEDS,
    inflate: Annotated[float | None, typer.Option(help="As for simulate.")] = None,
    shuffle: Annotated[
        bool | None, typer.Option("--shuffle/--no-shuffle", help="As for simulate.", show_default=False)
    ] = None,
    at: Annotated[int, typer.Option(help="Cut the arrivals at this arrived GPU % (the headline is 100).")] = 100,
    out: Annotated[Path | None, typer.Option(help="Write bound.csv here.")] = None,
) -> None:
    """Upper bound on the GPU any placement could allocate to the same arrivals.

    The run's own arrivals (same seed) up to ``--at`` % of GPU capacity; an LP relaxation over
    (pod shape, node class) with per-node CPU/memory/pod constraints, shared GPUs as mixes of
    per-GPU share patterns, exclusive and MIG GPUs by their slots, solved with HiGHS. See
    scheduler/sim/bound.py.
    """
    console = _console()
    try:
        seed_list = parse_seeds(seeds)
        loaded = load_traces(traces, nodes)
        results: list[Bound] = [bound(t, s, at, inflate, shuffle) for t in loaded for s in seed_list]
    except (GpusliceError, ValueError, RuntimeError) as exc:
        raise _fail(str(exc)) from None
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


__all__ = ["TraceError", "bound_command", "simulate"]
