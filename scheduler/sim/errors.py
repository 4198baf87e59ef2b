"""Errors of the simulator's inputs (rooted in the project's :class:`GpusliceError`)."""

from __future__ import annotations

from pathlib import Path

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
