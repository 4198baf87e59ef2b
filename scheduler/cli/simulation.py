"""``gpuslice simulate`` and ``gpuslice bound``: the simulator face."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ._app import command

TRACE_HELP = (
    "Input(s): an openb pod list (.csv), a scenario (.yaml) or a Kubernetes v1 List "
    "(kubectl get nodes,pods -A -o yaml). None: a small embedded scenario."
)
SEEDS_HELP = "Seeds: 42, 42,43 or 42-51."
DEFAULT_SEEDS = "42"


@command("simulate")
def simulate(
    traces: Annotated[list[Path] | None, typer.Argument(help=TRACE_HELP, show_default=False)] = None,
    nodes: Annotated[
        Path | None, typer.Option(help="openb node list (default: the GPU node list beside the pod list).")
    ] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option("--policy", "-p", help="Policy, repeatable or comma separated (default: the paper's six)."),
    ] = None,
    seeds: Annotated[str, typer.Option(help=SEEDS_HELP)] = DEFAULT_SEEDS,
    inflate: Annotated[
        float | None,
        typer.Option(
            help="Arrivals: grow the workload to this x GPU capacity "
            "(default: the input's own, 1.3 for openb; 0: as given)."
        ),
    ] = None,
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
    defrag_budget: Annotated[
        str | None,
        typer.Option(
            help="Timed replay: run the defragmentation planner, one run per arm: off (plain replay), wait "
            "(pods wait for the planner, no move) or evictions per planner run, such as off,wait,4. "
            "Writes defrag.csv instead of summary.csv."
        ),
    ] = None,
    defrag_every: Annotated[float, typer.Option(help="Minutes of simulated time between planner runs.")] = 10.0,
    defrag_min_fall: Annotated[
        float, typer.Option(help="Milli-GPU of fragmentation a move made only to lower it must remove.")
    ] = 500.0,
) -> None:
    """Replay traces or scenarios through the packing core and compare policies."""
    from scheduler.sim import commands

    commands.simulate(
        traces or [],
        nodes,
        policy,
        seeds,
        inflate,
        replay,
        shuffle,
        workers,
        out,
        reference,
        with_bound,
        quiet,
        defrag_budget,
        defrag_every,
        defrag_min_fall,
    )


@command("bound")
def bound(
    traces: Annotated[list[Path] | None, typer.Argument(help=TRACE_HELP, show_default=False)] = None,
    nodes: Annotated[Path | None, typer.Option(help="openb node list.")] = None,
    seeds: Annotated[str, typer.Option(help=SEEDS_HELP)] = DEFAULT_SEEDS,
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
    per-GPU share patterns, exclusive and MIG GPUs by their slots, solved with HiGHS.
    """
    from scheduler.sim import commands

    commands.bound_table(traces or [], nodes, seeds, inflate, shuffle, at, out)
