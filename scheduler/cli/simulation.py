"""``gpuslice simulate``, ``bound``, ``advise``, ``sweep`` and ``report``: the simulator face.

Numbers, files and folders arrive as text and are checked here (:mod:`._options`) before any
input is read or any run starts; the face checks what only it knows (policy names, the
form of ``--seeds``, replay modes).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from scheduler.core.errors import UsageError
from scheduler.sim.limits import MAX_INFLATE

from . import _options as opt
from ._app import command

TRACE_HELP = (
    "Input(s): an openb pod list (.csv), a scenario (.yaml) or a Kubernetes v1 List "
    "(kubectl get nodes,pods -A -o yaml; 'example': the embedded example cluster). None: a small embedded scenario."
)
SEEDS_HELP = "Seeds: 42, 42,43 or 42-51."
DEFAULT_SEEDS = "42"
INFLATE_ACCEPTED = f"0 (as given) or a ratio up to {MAX_INFLATE:g}, such as 1.3"
DEFRAG_EVERY = (0.1, 525600.0)  # minutes: six seconds to a year of simulated time
DEFRAG_EVERY_ACCEPTED = f"minutes of simulated time from {DEFRAG_EVERY[0]:g} to {DEFRAG_EVERY[1]:g}, such as 10"
MIN_FALL_ACCEPTED = "milli-GPU, 0 or more, such as 500"
COMPRESS_ACCEPTED = "a factor from 0.01 to 1000 (1: times as recorded), such as 4"


def inflate_option(text: str | None) -> float | None:
    return None if text is None else opt.ratio("--inflate", text, 0.0, MAX_INFLATE, INFLATE_ACCEPTED)


def inputs(traces: list[Path] | None, nodes: Path | None) -> list[Path]:
    """The input files (``example``: the example cluster), and ``--nodes``, exist and can be read."""
    if nodes is not None:
        opt.readable_file("--nodes", nodes)
    return [opt.cluster_file("input", path) for path in traces or []]


def out_option(path: Path | None) -> Path | None:
    return None if path is None else opt.writable_folder("--out", path)


def defrag_numbers(budget: str | None, every: str | None, min_fall: str | None) -> tuple[float, float]:
    """``--defrag-every`` and ``--defrag-min-fall`` (defaults 10 and 500), only with ``--defrag-budget``."""
    for option, given in (("--defrag-every", every), ("--defrag-min-fall", min_fall)):
        if given is not None and budget is None:
            raise UsageError(f"{option} needs --defrag-budget (the arms to run, such as off,wait,4)")
    minutes = 10.0 if every is None else opt.ratio("--defrag-every", every, *DEFRAG_EVERY, DEFRAG_EVERY_ACCEPTED)
    fall = 500.0 if min_fall is None else opt.ratio("--defrag-min-fall", min_fall, 0.0, math.inf, MIN_FALL_ACCEPTED)
    return minutes, fall


@command("simulate")
def simulate(
    traces: Annotated[list[Path] | None, typer.Argument(help=TRACE_HELP, show_default=False)] = None,
    nodes: Annotated[
        Path | None, typer.Option(help="openb node list (default: the GPU node list beside the pod list).")
    ] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            "--policy", "-p", help="Policy, repeatable or comma separated (default: the paper's six and fgd-reserve)."
        ),
    ] = None,
    seeds: Annotated[str, typer.Option(help=SEEDS_HELP)] = DEFAULT_SEEDS,
    inflate: Annotated[
        str | None,
        typer.Option(
            metavar="RATIO",
            help="Grow the workload to this x GPU capacity (arrivals default: the input's own, "
            f"1.3 for openb; timed: only when given; 0: as given; at most {MAX_INFLATE:g}).",
        ),
    ] = None,
    compress: Annotated[
        str,
        typer.Option(
            metavar="FACTOR",
            help="Timed: divide creation times by this factor, durations kept (the load rises).",
        ),
    ] = "1",
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
    workers: Annotated[str | None, typer.Option(metavar="N", help="Processes (default: all cores).")] = None,
    out: Annotated[
        Path | None, typer.Option(help="Write summary.csv, curves.csv and PNG plots here (none: nothing is written).")
    ] = None,
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
    defrag_every: Annotated[
        str | None,
        typer.Option(
            metavar="MINUTES", help="With --defrag-budget: minutes of simulated time between planner runs (10)."
        ),
    ] = None,
    defrag_min_fall: Annotated[
        str | None,
        typer.Option(
            metavar="MILLI",
            help="With --defrag-budget: milli-GPU of fragmentation a move made only to lower it must remove (500).",
        ),
    ] = None,
) -> None:
    """Replay traces or scenarios through the packing core and compare policies."""
    ratio = inflate_option(inflate)
    factor = opt.ratio("--compress", compress, 0.01, 1000.0, COMPRESS_ACCEPTED)
    processes = None if workers is None else opt.whole("--workers", workers, 1, 4096, "1 or more")
    if with_bound and replay is not None and replay.strip().lower() == "timed":
        raise UsageError("--bound with --replay timed: the LP bound covers arrivals only; drop one of them")
    every, min_fall = defrag_numbers(defrag_budget, defrag_every, defrag_min_fall)
    if defrag_budget is not None and replay is not None and replay.strip().lower() == "arrivals":
        raise UsageError(
            "--defrag-budget with --replay arrivals: the planner needs simulated time; give --replay timed"
        )
    if defrag_budget is not None and reference is not None:
        raise UsageError("--reference with --defrag-budget: the defragmentation table has no paper curves; drop one")
    paths = inputs(traces, nodes)
    if reference is not None:
        opt.readable_folder("--reference", reference)
    folder = out_option(out)
    from scheduler.sim import commands
    from scheduler.sim.pools import stop_on_sigterm

    stop_on_sigterm()  # kill: the workers end and the finished runs are written, as for Ctrl-C
    commands.simulate(
        paths,
        nodes,
        policy,
        seeds,
        ratio,
        replay,
        shuffle,
        processes,
        folder,
        reference,
        with_bound,
        quiet,
        defrag_budget,
        every,
        min_fall,
        compress=factor,
    )


@command("bound")
def bound(
    traces: Annotated[list[Path] | None, typer.Argument(help=TRACE_HELP, show_default=False)] = None,
    nodes: Annotated[Path | None, typer.Option(help="openb node list.")] = None,
    seeds: Annotated[str, typer.Option(help=SEEDS_HELP)] = DEFAULT_SEEDS,
    inflate: Annotated[str | None, typer.Option(metavar="RATIO", help="As for simulate.")] = None,
    shuffle: Annotated[
        bool | None, typer.Option("--shuffle/--no-shuffle", help="As for simulate.", show_default=False)
    ] = None,
    at: Annotated[
        str, typer.Option(metavar="PCT", help="Cut the arrivals at this arrived GPU % (the headline is 100).")
    ] = "100",
    out: Annotated[Path | None, typer.Option(help="Write bound.csv here.")] = None,
) -> None:
    """Upper bound on the GPU any placement could allocate to the same arrivals.

    The run's own arrivals (same seed) up to ``--at`` % of GPU capacity; an LP relaxation over
    (pod shape, node class) with per-node CPU/memory/pod constraints, shared GPUs as mixes of
    per-GPU share patterns, exclusive and MIG GPUs by their slots, solved with HiGHS.
    """
    ratio = inflate_option(inflate)
    top = int(MAX_INFLATE * 100)
    cut = opt.whole("--at", at, 1, top, f"a whole percent from 1 to {top} (arrivals reach 100 x the inflation)")
    paths = inputs(traces, nodes)
    folder = out_option(out)
    from scheduler.sim import commands

    commands.bound_table(paths, nodes, seeds, ratio, shuffle, cut, folder)


ADVISE_OUTPUTS = ("table", "json")
ADVISE_EXAMPLE = "advise-week.json"  # a week of the example cluster's recorded memory use (Prometheus JSON)


@command("advise")
def advise(
    metrics: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Recorded metrics: a Prometheus query_range (or query) response as JSON, or a snapshot of an "
            "agent's /metrics; several files: the peak over all. 'example': a week of the example cluster's.",
            show_default=False,
        ),
    ] = None,
    cluster: Annotated[
        Path | None,
        typer.Option(
            help="A Kubernetes v1 List (kubectl get nodes,pods -A -o yaml; 'example': the embedded example "
            "cluster): compute the GPUs freed."
        ),
    ] = None,
    threshold_pct: Annotated[
        str, typer.Option(metavar="PCT", help="Far below: a measured peak at most this percent of the share's memory.")
    ] = "50",
    headroom_pct: Annotated[
        str, typer.Option(metavar="PCT", help="The suggested share: the peak plus this percent.")
    ] = "20",
    granularity_mib: Annotated[
        str, typer.Option(metavar="MIB", help="... rounded up to a multiple of this many MiB.")
    ] = "1024",
    policy: Annotated[str, typer.Option(help="The packing policy for the freed GPUs (default: the extender's).")] = "",
    output: Annotated[str, typer.Option("--output", "-o", help="table or json.")] = "table",
) -> None:
    """Right-sizing: pods whose measured peak is far below their share, the share that would fit,
    and how many GPUs the cluster would free if they were resized (docs/observability.md)."""
    import json

    chosen = opt.choice("--output", output, ADVISE_OUTPUTS)
    threshold = opt.ratio("--threshold-pct", threshold_pct, 0.0, 100.0, "a percent in (0, 100]")
    headroom = opt.ratio("--headroom-pct", headroom_pct, 0.0, 1000.0, "a percent in [0, 1000]")
    granularity = opt.whole("--granularity-mib", granularity_mib, 1, 1 << 20, "a whole number of MiB >= 1")
    metrics = [opt.example_or_file("input", path, ADVISE_EXAMPLE) for path in metrics or []]
    if cluster is not None:
        cluster = opt.cluster_file("--cluster", cluster)
    from scheduler.sim import advise as advice

    options = advice.Options(threshold, headroom, granularity, policy or advice.DEFAULT_POLICY)
    report = advice.advise(metrics or [], cluster, options)
    if chosen == "json":
        print(json.dumps(advice.as_json(report), indent=2))
    else:
        print("\n".join(advice.render(report)))


EXIT_FAILED_MAX = 100  # the exit status of a sweep is the number of failed runs, up to this


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
    opt.readable_file("input", file)
    for option, folder in (("--data", data), ("--reference", reference)):
        if folder is not None:
            opt.readable_folder(option, folder)
    if out is not None:
        opt.writable_folder("--out", out)
    from scheduler.sim import commands
    from scheduler.sim.pools import stop_on_sigterm

    # A stopped sweep (kill, a pod's termination) leaves its cluster and workers closed: SIGTERM
    # unwinds like Ctrl-C, through the executor's clean-up. Stored runs are kept either way.
    stop_on_sigterm()
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
    opt.readable_folder("input", out)
    if reference is not None:
        opt.readable_folder("--reference", reference)
    from scheduler.sim import commands

    commands.report(out, reference)
