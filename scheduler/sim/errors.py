"""Errors of the simulator's inputs (rooted in the project's :class:`GpusliceError`)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from scheduler.core.errors import GpusliceError


class TraceError(GpusliceError, ValueError):
    """An input file is malformed: the message names the file, the row or line, and the field."""

    def __init__(self, file: str | Path, where: str, problem: str) -> None:
        self.file = Path(file).name if str(file) else "<input>"
        self.where = where
        self.problem = problem
        location = f"{self.file} {where}" if where else self.file
        super().__init__(f"{location}: {problem}")


class SolverError(GpusliceError):
    """The LP solver behind ``gpuslice bound`` gave no solution; the message says why."""


class Interrupted(GpusliceError):
    """Ctrl-C or SIGTERM stopped a set of runs; ``finished`` holds the runs that had ended (in the
    order they were asked for), the caller keeps them. Exits ``128 + signum``, as a shell reports
    a command a signal ended."""

    def __init__(self, signum: int, finished: list[Any], total: int, kept: str = "") -> None:
        self.signum = signum
        self.finished = finished
        self.total = total
        self.exit_code = 128 + signum
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        super().__init__(f"stopped by {name}: {len(finished)} of {total} runs had finished{kept}")
