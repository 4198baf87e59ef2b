"""Many runs (trace x policy x seed), spread over processes, one rich progress bar per run.

Each run gets its own process (``max_tasks_per_child=1``): the core's tables start
empty, so a run's result depends only on (trace, policy, seed, options) and repeats
exactly. Progress travels back through a managed queue.
"""

from __future__ import annotations

import os
import queue as queue_module
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .defrag import DefragSpec
from .engine import RunResult, simulate
from .errors import Interrupted
from .model import Trace
from .pools import Stopped, held, process_pool


@dataclass(frozen=True)
class RunSpec:
    trace: Trace
    policy: str
    seed: int
    replay: str | None = None
    inflate: float | None = None
    shuffle: bool | None = None
    policy_options: dict[str, Any] = field(default_factory=dict)
    defrag: DefragSpec | None = None
    compress: float = 1.0

    @property
    def label(self) -> str:
        arm = "" if self.defrag is None else f" defrag {self.defrag.budget}"
        return f"{self.trace.name} {self.policy} seed {self.seed}{arm}"


def _simulate(spec: RunSpec, progress: Callable[[int, int], None]) -> RunResult:
    return simulate(
        spec.trace,
        spec.policy,
        spec.seed,
        replay=spec.replay,
        inflate=spec.inflate,
        shuffle=spec.shuffle,
        progress=progress,
        policy_options=spec.policy_options or None,
        defrag=spec.defrag,
        compress=spec.compress,
    )


def _run(spec: RunSpec, index: int, progress: Any) -> tuple[int, RunResult]:
    def report(done: int, total: int) -> None:
        if progress is not None:
            progress.put((index, done, total))

    return index, _simulate(spec, report)


def default_workers() -> int:
    return max(1, os.cpu_count() or 1)


def run_all(
    specs: Sequence[RunSpec], workers: int | None = None, console: Console | None = None, show_progress: bool = True
) -> list[RunResult]:
    """Every run's result, in the order of ``specs``. Stopped by Ctrl-C or SIGTERM (once
    :func:`~.pools.stop_on_sigterm` is in force), it ends every worker and raises
    :class:`~.errors.Interrupted` with the runs that had finished."""
    workers = max(1, min(workers or default_workers(), len(specs) or 1))
    console = console or Console(stderr=True)
    results: list[RunResult | None] = [None] * len(specs)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not show_progress,
        transient=False,
    ) as bars:
        tasks = [bars.add_task(spec.label, total=None, start=False) for spec in specs]
        try:
            if workers == 1:
                for i, spec in enumerate(specs):
                    bars.start_task(tasks[i])

                    def step(done: int, total: int, task: Any = tasks[i]) -> None:
                        bars.update(task, completed=done, total=total)

                    results[i] = _simulate(spec, step)
            else:
                _in_processes(specs, workers, bars, tasks, results)
        except KeyboardInterrupt:
            raise Interrupted(signal.SIGINT, [r for r in results if r is not None], len(specs)) from None
        except Stopped as stop:
            raise Interrupted(stop.signum, [r for r in results if r is not None], len(specs)) from None
    return [r for r in results if r is not None]


def _in_processes(
    specs: Sequence[RunSpec], workers: int, bars: Progress, tasks: list[Any], results: list[RunResult | None]
) -> None:
    """The runs in ``workers`` processes, each result put in ``results`` the moment it arrives."""
    with process_pool(workers) as (pool, updates, signals):
        with held():
            pending: set[Future[tuple[int, RunResult]]] = {
                pool.submit(_run, spec, i, updates) for i, spec in enumerate(specs)
            }
        started: set[int] = set()
        while pending:
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            signals.check()
            _drain(updates, bars, tasks, started)
            for future in done:
                index, result = future.result()
                results[index] = result
                bars.update(tasks[index], completed=len(result.arrived) - 1, total=len(result.arrived) - 1)
        _drain(updates, bars, tasks, started)


def _drain(updates: Any, bars: Progress, tasks: list[Any], started: set[int]) -> None:
    while True:
        try:
            index, done, total = updates.get_nowait()
        except queue_module.Empty:
            return
        if index not in started:
            started.add(index)
            bars.start_task(tasks[index])
        bars.update(tasks[index], completed=done, total=total)
