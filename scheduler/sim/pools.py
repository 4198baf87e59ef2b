"""Worker processes for runs that stop when asked: Ctrl-C or ``kill`` ends them all within a
second, and what had finished is the caller's to keep.

Ctrl-C sends SIGINT to the whole foreground process group. Left to themselves, the workers would
each turn it into their run's exception and the pool would go on starting the runs still queued
(a minute or more of a stopped command still working); ``kill`` (SIGTERM) reaches the parent alone,
which would die and leave the workers, the manager and the resource tracker running. So: the
workers ignore SIGINT (the parent alone decides), the parent notes both signals while the pool
runs and raises them between two waits (:class:`Signals`: KeyboardInterrupt, or :class:`Stopped`
for SIGTERM), and :func:`process_pool` answers either by cancelling the queued runs and
terminating the running ones before it lets the exception go on. The manager
shuts down with the pool, and the resource tracker ends when the last process holding it does.
"""

from __future__ import annotations

import multiprocessing
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from multiprocessing import resource_tracker
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
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # held since birth: see :func:`held`


@contextmanager
def held() -> Iterator[None]:
    """SIGINT held (blocked, not lost) in this thread meanwhile: a Ctrl-C comes when the block ends.

    Submitting to a pool starts its workers and its manager thread, which starts the workers that
    replace them. A thread's blocked signals pass to the threads it starts and to the processes
    they start, through exec: a worker is born with SIGINT held and lets it go only once it ignores
    it (:func:`_worker_start`). A Ctrl-C that caught a worker still starting up would otherwise
    end it with a traceback of the interpreter's start on the terminal.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


class Signals:
    """Ctrl-C and SIGTERM, noted while a pool runs and acted on where its caller checks.

    Raised where they strike, they could strike inside ``concurrent.futures.wait`` while it holds
    some of its futures' locks (it takes them one by one): those locks stay taken, and the pool's
    manager thread, cancelling those futures, waits for them at exit forever.
    """

    def __init__(self) -> None:
        self.signum = 0

    def note(self, signum: int, frame: object) -> None:
        self.signum = self.signum or signum

    def check(self) -> None:
        """Raise what was noted: KeyboardInterrupt for Ctrl-C, :class:`Stopped` for SIGTERM."""
        if self.signum == signal.SIGINT:
            raise KeyboardInterrupt
        if self.signum:
            raise Stopped(self.signum)


@contextmanager
def noted(signals: Signals) -> Iterator[None]:
    """SIGINT and SIGTERM go to ``signals`` meanwhile (in the main thread; elsewhere, as before)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.signal(s, signals.note) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


@contextmanager
def process_pool(workers: int) -> Iterator[tuple[ProcessPoolExecutor, Any, Signals]]:
    """A pool of ``workers`` fresh processes (one per run: ``max_tasks_per_child=1``), a managed
    queue they can send progress through, and the signals noted meanwhile: submit the runs under
    :func:`held`, call ``check()`` of the signals between waits. Left by an exception (Ctrl-C,
    :class:`Stopped`, a bug), the runs not started are cancelled and the running ones terminated
    at once."""
    context = multiprocessing.get_context("spawn")
    signals = Signals()
    # The resource tracker first, outside held(): starting it unblocks SIGINT in the calling
    # thread when done (multiprocessing.resource_tracker blocks and then unblocks it around its
    # own start), which would let the manager and the first workers be born with SIGINT open.
    resource_tracker.ensure_running()
    with noted(signals):
        with held():  # the manager starts here
            manager = context.Manager()
            pool = ProcessPoolExecutor(
                max_workers=workers, mp_context=context, max_tasks_per_child=1, initializer=_worker_start
            )
        try:
            try:
                yield pool, manager.Queue(), signals
            except BaseException:
                _abandon(pool)
                raise
            pool.shutdown(wait=True)
        finally:
            manager.shutdown()


def _abandon(pool: ProcessPoolExecutor) -> None:
    """Cancel the queued runs, end the running ones, and wait for the pool's manager thread:
    shut down without waiting, the pool drops its table of processes while that thread may
    still be replacing a worker that finished (a TypeError on the terminal)."""
    processes = list((pool._processes or {}).values())
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(JOIN_SECONDS)
        if process.is_alive():
            process.kill()
            process.join(JOIN_SECONDS)
    pool.shutdown(wait=True, cancel_futures=True)  # the workers are gone: the pool is broken and its thread ends


__all__ = ["Signals", "Stopped", "held", "noted", "process_pool", "stop_on_sigterm"]
