"""Where a sweep's runs execute: local processes, or a Dask distributed cluster.

Both take the same runs and report through the same three callbacks (a run started, a run's
progress, a run's outcome), always on the caller's thread, so the sweep writes its store and
draws its progress bars in one place whatever the executor.

* ``local`` / ``local:N``: N processes of this machine (default: all cores), one process per
  run (``max_tasks_per_child=1``), as ``gpuslice simulate`` does; ``local:1`` runs in this
  process.
* ``dask://HOST:PORT``: the runs are submitted to the Dask scheduler there; ``dask-local:N``
  starts a Dask cluster of N worker processes on this machine for the sweep. Each input trace is
  scattered once to every worker (``broadcast=True``) and every run of that trace takes it by
  reference, so a trace crosses the network once per worker, not once per run. Progress comes
  back as worker events (``log_event`` / ``subscribe_topic``). Workers need only
  ``pip install gpuslice`` (the same version) and one thread each (``--nthreads 1``): a run is
  pure Python, two threads would share one core's GIL.

A Dask worker runs run after run in one process, where the local executor gives each run a
fresh one. The core's tables (fit's, the fragmentation measure's) are caches of pure functions
of immutable states (bounded in size), so they change how fast a run goes, never its result:
the tests compare a Dask store with a local one, and the paper grid's runs on Dask match,
seed by seed, the runs recorded with one process per run.

``distributed`` is imported by the Dask executor only, so local sweeps never load it.

A run that raises is an outcome, not an error of the sweep: :func:`execute` turns the exception
into a :class:`RunFailed`, and a worker that dies is recorded the same way.
"""

from __future__ import annotations

import dataclasses
import os
import queue as queue_module
import time
import traceback
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any, Protocol

from scheduler.core.errors import GpusliceError, UsageError

from .engine import simulate
from .metrics import RunRecord
from .model import Trace
from .pools import held, process_pool
from .sweep import PlannedRun

EXECUTORS_HELP = "local, local:N, dask-local:N or dask://HOST:PORT"
PROGRESS_STEPS = 20  # progress messages per run (every 5%)
WORKER_WAIT_SECONDS = 60.0
CONNECT_SECONDS = 20.0
LOCAL_HOST = "127.0.0.1"


@dataclass(frozen=True)
class RunFailed:
    error: str  # one line
    detail: str = ""  # the traceback, for a bug


Outcome = RunRecord | RunFailed


class Events(Protocol):
    def started(self, index: int) -> None: ...
    def progress(self, index: int, done: int, total: int) -> None: ...
    def finished(self, index: int, outcome: Outcome) -> None: ...


class Executor(Protocol):
    name: str

    def run(self, runs: Sequence[PlannedRun], traces: Mapping[int, Trace], events: Events) -> None:
        """Run every one of ``runs`` (their traces: ``traces[run.input_index]``), reporting each."""


def execute(run: PlannedRun, trace: Trace, progress: Callable[[int, int], None] | None = None) -> Outcome:
    """One run, its exception (if any) turned into a :class:`RunFailed`; its CPU time is that of
    the thread that ran it (a worker's own threads are not the run's)."""
    cpu = time.thread_time()
    try:
        result = simulate(
            trace,
            run.policy.name,
            run.seed,
            replay=run.replay,
            inflate=run.inflate,
            shuffle=run.shuffle,
            progress=progress,
            policy_options=dict(run.policy.options) or None,
        )
    except Exception as exc:
        text = str(exc) if isinstance(exc, GpusliceError) else f"{type(exc).__name__}: {exc}"
        return RunFailed(text.splitlines()[0] if text else type(exc).__name__, traceback.format_exc(limit=8))
    return dataclasses.replace(RunRecord.of(result), cpu_seconds=time.thread_time() - cpu)


def _throttled(send: Callable[[int, int], None]) -> Callable[[int, int], None]:
    """``send`` at most :data:`PROGRESS_STEPS` times a run."""
    last = [-1]

    def report(done: int, total: int) -> None:
        step = done * PROGRESS_STEPS // max(1, total)
        if step != last[0]:
            last[0] = step
            send(done, total)

    return report


def parse_executor(text: str | None) -> Executor:
    """An executor from ``--executor`` (None: all local cores)."""
    value = (text or "local").strip()
    kind, _, arg = value.partition(":")
    if value.startswith("dask://") or value.startswith("tls://") or value.startswith("tcp://"):
        return DaskExecutor(value.replace("dask://", "tcp://", 1))
    if kind in ("local", "dask-local"):
        if not arg:
            count = max(1, os.cpu_count() or 1)
        else:
            try:
                count = int(arg)
            except ValueError:
                count = 0
            if count < 1:
                raise UsageError(f"--executor {value!r}: the number of workers must be 1 or more")
        return LocalExecutor(count) if kind == "local" else DaskExecutor(None, count)
    raise UsageError(f"--executor {value!r}: accepted: {EXECUTORS_HELP}")


# ------------------------------------------------------------------ local processes


def _local_task(run: PlannedRun, trace: Trace, index: int, updates: Any) -> tuple[int, Outcome]:
    return index, execute(run, trace, _throttled(lambda done, total: updates.put((index, done, total))))


class LocalExecutor:
    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.name = f"local:{workers}"

    def run(self, runs: Sequence[PlannedRun], traces: Mapping[int, Trace], events: Events) -> None:
        if self.workers == 1:
            for i, run in enumerate(runs):
                events.started(i)

                def moved(done: int, total: int, i: int = i) -> None:
                    events.progress(i, done, total)

                events.finished(i, execute(run, traces[run.input_index], moved))
            return
        workers = min(self.workers, max(1, len(runs)))
        with process_pool(workers) as (pool, updates, signals):
            index_of: dict[Future[tuple[int, Outcome]], int] = {}
            with held():
                for i, run in enumerate(runs):
                    index_of[pool.submit(_local_task, run, traces[run.input_index], i, updates)] = i
            pending = set(index_of)
            started: set[int] = set()
            while pending:
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                signals.check()
                _drain(updates, events, started)
                for future in done:
                    index = index_of[future]
                    try:
                        outcome = future.result()[1]
                    except Exception as exc:  # the worker process died (BrokenProcessPool)
                        outcome = RunFailed(f"the worker process died: {type(exc).__name__}: {exc}")
                    events.finished(index, outcome)


def _drain(updates: Any, events: Events, started: set[int]) -> None:
    while True:
        try:
            index, done, total = updates.get_nowait()
        except queue_module.Empty:
            return
        _moved(events, started, index, done, total)


def _moved(events: Events, started: set[int], index: int, done: int, total: int) -> None:
    if index not in started:
        started.add(index)
        events.started(index)
    events.progress(index, done, total)


# ------------------------------------------------------------------ Dask distributed


def _dask_task(run: PlannedRun, trace: Trace, index: int, topic: str) -> Outcome:
    from distributed import get_worker

    worker = get_worker()
    return execute(run, trace, _throttled(lambda done, total: worker.log_event(topic, [index, done, total])))


# Settings for tasks that are one long pure-Python call each: no statistical profiler (it
# samples the running thread's stack every 10 ms, for a dashboard no sweep looks at), and the
# health checks, system monitor and memory monitor at 1-5 s instead of 20-500 ms. An idle
# worker then takes 0.3% of a core instead of 3%, the scheduler and client 0.7% instead of 4%.
# Remote workers take the same from their environment (docs/sweeps.md).
WORKER_CONFIG = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.tick.interval": "1s",
    "distributed.admin.system-monitor.interval": "5s",
    "distributed.worker.memory.monitor-interval": "1s",
}


# What a worker imports when it starts (``dask worker --preload scheduler.sim.executors``), so that
# the first run given to it does not pay for the simulator's imports (about half a second).
WORKER_PRELOAD = "scheduler.sim.executors"


def local_cluster(workers: int) -> Any:
    """A Dask LocalCluster for sweeps: ``workers`` single-thread processes on 127.0.0.1, no
    profiler, the simulator imported at start, the dashboard on any free port (never a clash
    with another cluster's)."""
    import dask
    import distributed

    with dask.config.set(WORKER_CONFIG):  # the nannies hand the config to their workers
        return distributed.LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            host=LOCAL_HOST,
            dashboard_address=f"{LOCAL_HOST}:0",
            preload=[WORKER_PRELOAD],
        )


class DaskExecutor:
    """The runs as tasks of a Dask cluster: at ``address``, or a local one of ``local_workers``."""

    def __init__(self, address: str | None, local_workers: int | None = None) -> None:
        self.address = address
        self.local_workers = local_workers
        self.name = f"dask-local:{local_workers}" if address is None else f"dask {address}"
        self.client: Any = None  # set while a sweep runs on a cluster it was given (tests)

    def run(self, runs: Sequence[PlannedRun], traces: Mapping[int, Trace], events: Events) -> None:
        if not runs:
            return
        if self.client is not None:
            self._run(self.client, runs, traces, events)
            return
        import distributed

        if self.address is None:
            with local_cluster(self.local_workers or 1) as cluster, distributed.Client(cluster) as client:
                self._run(client, runs, traces, events)
            return
        try:
            client = distributed.Client(self.address, timeout=CONNECT_SECONDS)
        except OSError as exc:
            raise UsageError(f"--executor: no Dask scheduler answers at {self.address}: {exc}") from None
        with client:
            self._run(client, runs, traces, events)

    def _run(self, client: Any, runs: Sequence[PlannedRun], traces: Mapping[int, Trace], events: Events) -> None:

        try:
            client.wait_for_workers(1, timeout=WORKER_WAIT_SECONDS)
        except TimeoutError:
            raise UsageError(
                f"--executor: the Dask scheduler has no worker after {WORKER_WAIT_SECONDS:.0f} s"
            ) from None
        topic = f"gpuslice-progress-{uuid.uuid4().hex[:8]}"
        # One queue for both kinds of news, filled by the client's threads (worker events and
        # done callbacks), read here: no polling over thousands of futures.
        news: queue_module.Queue[tuple[Any, ...]] = queue_module.Queue()
        client.subscribe_topic(topic, lambda event: news.put(("moved", *event[1])))
        needed = sorted({run.input_index for run in runs})
        shipped = {i: client.scatter(traces[i], broadcast=True, hash=False) for i in needed}
        pending: dict[int, Any] = {}
        for i, run in enumerate(runs):
            future = client.submit(
                _dask_task, run, shipped[run.input_index], i, topic, key=f"gpuslice-run-{run.run_id}-{topic}"
            )
            future.add_done_callback(lambda f, i=i: news.put(("done", i, f)))
            pending[i] = future
        started: set[int] = set()
        try:
            while pending:
                try:
                    item = news.get(timeout=1.0)
                except queue_module.Empty:
                    continue
                if item[0] == "moved":
                    _moved(events, started, *item[1:])
                    continue
                index, future = item[1], item[2]
                try:
                    outcome = future.result()
                except Exception as exc:  # the task could not run: its worker died, it was cancelled
                    outcome = RunFailed(f"the Dask task failed: {type(exc).__name__}: {exc}")
                del pending[index]
                future.release()
                events.finished(index, outcome)
        finally:
            client.unsubscribe_topic(topic)
            client.cancel(list(pending.values()))
            for future in shipped.values():
                future.release()
