"""Worker processes for runs that stop when asked: Ctrl-C or ``kill`` ends them all within a
second, and what had finished is the caller's to keep.

Ctrl-C sends SIGINT to the whole foreground process group. Left to themselves, the workers would
each turn it into their run's exception and the pool would go on starting the runs still queued
(a minute or more of a stopped command still working); ``kill`` (SIGTERM) reaches the parent alone,
which would die and leave the workers, the manager and the resource tracker running. So: the
workers ignore SIGINT (the parent alone decides), SIGTERM becomes :class:`Stopped` in the parent's
main thread (:func:`stop_on_sigterm`), and :func:`process_pool` answers either by cancelling the
queued runs and terminating the running ones before it lets the exception go on. The manager
shuts down with the pool, and the resource tracker ends when the last process holding it does.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any

JOIN_SECONDS = 0.5  # a terminated worker that has not ended by then is killed


class Stopped(SystemExit):
    """A signal (SIGTERM) that asks this process to stop, raised where the main thread was;
    exits ``128 + signum`` when nothing catches it, as a shell reports a signal's end."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


def _stop(signum: int, frame: object) -> None:
    raise Stopped(signum)


def stop_on_sigterm() -> None:
    """From now on SIGTERM unwinds this process like Ctrl-C (as :class:`Stopped`), through every
    ``finally`` and every pool's clean-up, instead of ending it where it stands."""
    signal.signal(signal.SIGTERM, _stop)


def _worker_start() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextmanager
def process_pool(workers: int) -> Iterator[tuple[ProcessPoolExecutor, Any]]:
    """A pool of ``workers`` fresh processes (one per run: ``max_tasks_per_child=1``) and a managed
    queue they can send progress through. Left by an exception (Ctrl-C, :class:`Stopped`, a bug),
    the runs not started are cancelled and the running ones terminated at once."""
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        pool = ProcessPoolExecutor(
            max_workers=workers, mp_context=context, max_tasks_per_child=1, initializer=_worker_start
        )
        try:
            yield pool, manager.Queue()
        except BaseException:
            _abandon(pool)
            raise
        pool.shutdown(wait=True)


def _abandon(pool: ProcessPoolExecutor) -> None:
    processes = list((pool._processes or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(JOIN_SECONDS)
        if process.is_alive():
            process.kill()
            process.join(JOIN_SECONDS)


__all__ = ["Stopped", "process_pool", "stop_on_sigterm"]
