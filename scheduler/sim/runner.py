"""Many runs (trace x policy x seed), spread over processes, one rich progress bar per run.

Each run gets its own process (``max_tasks_per_child=1``): the core's tables start
empty, so a run's result depends only on (trace, policy, seed, options) and repeats
exactly. Progress travels back through a managed queue.
"""

from __future__ import annotations

import multiprocessing
import os
import queue as queue_module
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .defrag import DefragSpec
from .engine import RunResult, simulate
from .model import Trace


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


def _run(spec: RunSpec, index: int, progress: Any) -> tuple[int, RunResult]:
    def report(done: int, total: int) -> None:
        if progress is not None:
            progress.put((index, done, total))

    result = simulate(
        spec.trace,
        spec.policy,
        spec.seed,
        replay=spec.replay,
        inflate=spec.inflate,
        shuffle=spec.shuffle,
        progress=report,
        policy_options=spec.policy_options or None,
        defrag=spec.defrag,
        compress=spec.compress,
    )
    return index, result


def default_workers() -> int:
    return max(1, os.cpu_count() or 1)


def run_all(
    specs: Sequence[RunSpec], workers: int | None = None, console: Console | None = None, show_progress: bool = True
) -> list[RunResult]:
    """Every run's result, in the order of ``specs``."""
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
        if workers == 1:
            for i, spec in enumerate(specs):
                bars.start_task(tasks[i])

                def step(done: int, total: int, task: Any = tasks[i]) -> None:
                    bars.update(task, completed=done, total=total)

                results[i] = simulate(
                    spec.trace,
                    spec.policy,
                    spec.seed,
                    replay=spec.replay,
                    inflate=spec.inflate,
                    shuffle=spec.shuffle,
                    progress=step,
                    policy_options=spec.policy_options or None,
                    defrag=spec.defrag,
                    compress=spec.compress,
                )
            return [r for r in results if r is not None]
        context = multiprocessing.get_context("spawn")
        with context.Manager() as manager:
            updates = manager.Queue()
            with ProcessPoolExecutor(max_workers=workers, mp_context=context, max_tasks_per_child=1) as pool:
                pending: set[Future[tuple[int, RunResult]]] = {
                    pool.submit(_run, spec, i, updates) for i, spec in enumerate(specs)
                }
                started: set[int] = set()
                while pending:
                    done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                    _drain(updates, bars, tasks, started)
                    for future in done:
                        index, result = future.result()
                        results[index] = result
                        bars.update(tasks[index], completed=len(result.arrived) - 1, total=len(result.arrived) - 1)
                _drain(updates, bars, tasks, started)
    return [r for r in results if r is not None]


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
