"""``gpuslice simulate``, ``bound``, ``advise``, ``sweep`` and ``report``: the simulator face."""

from __future__ import annotations

import signal
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


ADVISE_OUTPUTS = ("table", "json")


@command("advise")
def advise(
    metrics: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Recorded metrics: a Prometheus query_range (or query) response as JSON, or a snapshot of an "
            "agent's /metrics; several files: the peak over all.",
            show_default=False,
        ),
    ] = None,
    cluster: Annotated[
        Path | None,
        typer.Option(help="A Kubernetes v1 List (kubectl get nodes,pods -A -o yaml): compute the GPUs freed."),
    ] = None,
    threshold_pct: Annotated[
        float, typer.Option(help="Far below: a measured peak at most this percent of the share's memory.")
    ] = 50.0,
    headroom_pct: Annotated[float, typer.Option(help="The suggested share: the peak plus this percent.")] = 20.0,
    granularity_mib: Annotated[int, typer.Option(help="... rounded up to a multiple of this many MiB.")] = 1024,
    policy: Annotated[str, typer.Option(help="The packing policy for the freed GPUs (default: the extender's).")] = "",
    output: Annotated[str, typer.Option("--output", "-o", help="table or json.")] = "table",
) -> None:
    """Right-sizing: pods whose measured peak is far below their share, the share that would fit,
    and how many GPUs the cluster would free if they were resized (docs/observability.md)."""
    import json

    from scheduler.core.errors import UsageError
    from scheduler.sim import advise as advice

    if output not in ADVISE_OUTPUTS:
        raise UsageError(f"--output: {output!r}; accepted: {', '.join(ADVISE_OUTPUTS)}")
    options = advice.Options(threshold_pct, headroom_pct, granularity_mib, policy or advice.DEFAULT_POLICY)
    report = advice.advise(metrics or [], cluster, options)
    if output == "json":
        print(json.dumps(advice.as_json(report), indent=2))
    else:
        print("\n".join(advice.render(report)))


EXIT_FAILED_MAX = 100  # the exit status of a sweep is the number of failed runs, up to this


def _unwind(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


@command("sweep")
def sweep(
    file: Annotated[Path, typer.Argument(help="The sweep description (YAML): inputs, policies, seeds, ...")],
    out: Annotated[
        Path | None, typer.Option(help="Results folder: the store (runs/) and the report (default: the file's out:).")
    ] = None,
    data: Annotated[
        Path | None, typer.Option(help="Folder the inputs are relative to (default: the file's data:).")
    ] = None,
    reference: Annotated[
        Path | None, typer.Option(help="The paper's curves (fgd_expected_results); default: the file's reference:.")
    ] = None,
    executor: Annotated[
        str | None,
        typer.Option(help="local, local:N, dask-local:N or dask://HOST:PORT (default: local, all cores)."),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")] = False,
) -> None:
    """Run a grid of simulations (resumable: stored runs are skipped), then report it.

    Each run's result is stored in OUT/runs/ the moment it ends; started again, the sweep runs only
    what is missing (and what failed). The exit status is the number of failed runs (at most 100).
    """
    from scheduler.sim import commands

    # A stopped sweep (kill, a pod's termination) leaves its cluster and workers closed: SIGTERM
    # unwinds like Ctrl-C, through the executor's clean-up. Stored runs are kept either way.
    signal.signal(signal.SIGTERM, _unwind)
    failed = commands.sweep(file, data, out, reference, executor, quiet)
    if failed:
        raise typer.Exit(min(failed, EXIT_FAILED_MAX))


@command("report")
def report(
    out: Annotated[Path, typer.Argument(help="A sweep's results folder.")],
    reference: Annotated[
        Path | None, typer.Option(help="The paper's curves (default: the sweep's reference, if still there).")
    ] = None,
) -> None:
    """Remake a sweep's tables and plots from its store alone (runs nothing)."""
    from scheduler.sim import commands

    commands.report(out, reference)
