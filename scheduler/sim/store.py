"""A sweep's results store: one JSON file per run in ``OUT/runs/``, and the plan in
``OUT/sweep.json``.

Each file is written whole or not at all (a temporary file beside it, flushed to disk, then
renamed over the name: a rename is atomic on POSIX file systems), so a sweep killed at any
moment leaves finished runs and no half-written one; a temporary file left by a kill is
ignored and removed by the next sweep. A run's file is named by its id, so a sweep started
again finds what it has already done by listing the folder.

A run file (``"status": "ok"``) holds the run's description, its counts and its curves by
arrived % (what every table and plot is made from); a failed run (``"status": "failed"``)
holds the error instead, and is run again by the next sweep.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from scheduler.core.errors import GpusliceError

from .executors import Outcome, RunFailed
from .metrics import Curves, RunRecord
from .sweep import PlannedRun, Sweep

RUNS_DIR = "runs"
PLAN_FILE = "sweep.json"
STORE_FORMAT = 1
OK, FAILED = "ok", "failed"


class StoreError(GpusliceError):
    """A results store cannot be read: the message names the file and what is wrong with it."""


def write_atomic(path: Path, text: str) -> None:
    """``text`` at ``path``, all of it or (after a kill) none of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with temporary.open("w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def _version() -> str:
    try:
        return metadata.version("gpuslice")
    except metadata.PackageNotFoundError:
        return "unknown"


def run_entry(run: PlannedRun, sweep: Sweep, outcome: Outcome, worker: str = "") -> dict[str, Any]:
    """The JSON object a run's file holds."""
    item = sweep.inputs[run.input_index]
    try:
        shown = item.path.relative_to(sweep.data).as_posix()
    except ValueError:
        shown = item.path.name
    entry: dict[str, Any] = {
        "format": STORE_FORMAT,
        "id": run.run_id,
        "status": FAILED if isinstance(outcome, RunFailed) else OK,
        "run": {
            "trace": run.trace,
            "input": shown,
            "policy": run.policy.name,
            "label": run.policy.label,
            "options": dict(run.policy.options),
            "seed": run.seed,
            "inflate": run.inflate,
            "replay": run.replay,
            "shuffle": run.shuffle,
        },
        "made_by": {"gpuslice": _version(), "host": worker or socket.gethostname()},
    }
    if isinstance(outcome, RunFailed):
        entry["error"] = outcome.error
        entry["detail"] = outcome.detail
        return entry
    c = outcome.curves
    entry["result"] = {
        "capacity_milli": outcome.capacity_milli,
        "allocated_final_milli": outcome.allocated_final_milli,
        "failed_pods": outcome.failed,
        "placed_pods": outcome.placed,
        "failed_by_kind": dict(sorted(outcome.failed_by_kind.items())),
        "wall_seconds": outcome.wall_seconds,
        "cpu_seconds": None if math.isnan(outcome.cpu_seconds) else outcome.cpu_seconds,
        "gpu_hours": None if math.isnan(outcome.gpu_hours) else outcome.gpu_hours,
        "curves": {
            "arrived_pct": [int(v) for v in c.arrived_pct],
            "allocated_pct": [float(v) for v in c.allocated_pct],
            "frag_pct": [float(v) for v in c.frag_pct],
            "frag_rate_pct": [float(v) for v in c.frag_rate_pct],
        },
    }
    return entry


def record_of(entry: dict[str, Any]) -> RunRecord:
    """The :class:`RunRecord` of an ``ok`` entry, labelled as the entry says."""
    run, result = entry["run"], entry["result"]
    c = result["curves"]
    curves = Curves(
        np.array(c["arrived_pct"], dtype=np.int64),
        np.array(c["allocated_pct"], dtype=np.float64),
        np.array(c["frag_pct"], dtype=np.float64),
        np.array(c["frag_rate_pct"], dtype=np.float64),
    )
    return RunRecord(
        str(run["trace"]),
        str(run["label"]),
        int(run["seed"]),
        int(result["capacity_milli"]),
        int(result["allocated_final_milli"]),
        int(result["failed_pods"]),
        int(result["placed_pods"]),
        float(result["wall_seconds"]),
        curves,
        {str(k): int(v) for k, v in result["failed_by_kind"].items()},
        math.nan if result.get("cpu_seconds") is None else float(result["cpu_seconds"]),
        math.nan if result.get("gpu_hours") is None else float(result["gpu_hours"]),
    )


class Store:
    """The results folder of a sweep."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.runs = root / RUNS_DIR

    def path(self, run_id: str) -> Path:
        return self.runs / f"{run_id}.json"

    def put(self, entry: dict[str, Any]) -> None:
        write_atomic(self.path(str(entry["id"])), json.dumps(entry, indent=1, allow_nan=False) + "\n")

    def entries(self) -> dict[str, dict[str, Any]]:
        """Every run file, by id; :class:`StoreError` for one that is not a run record."""
        out: dict[str, dict[str, Any]] = {}
        if not self.runs.is_dir():
            return out
        for path in sorted(self.runs.glob("*.json")):
            entry = self._read(path)
            out[str(entry["id"])] = entry
        return out

    def _read(self, path: Path) -> dict[str, Any]:
        where = f"{RUNS_DIR}/{path.name}"
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise StoreError(f"{where}: is not a run record ({exc}); remove it to run it again") from None
        ok = isinstance(entry, dict) and entry.get("id") == path.stem and entry.get("status") in (OK, FAILED)
        if ok and entry["status"] == OK:
            try:
                record_of(entry)
            except (KeyError, TypeError, ValueError, AttributeError):
                ok = False
        if not ok or entry.get("format") != STORE_FORMAT:
            raise StoreError(f"{where}: is not a run record of store format {STORE_FORMAT}; remove it to run it again")
        return dict(entry)

    def remove_leftovers(self) -> None:
        """Temporary files a killed sweep left behind."""
        if self.runs.is_dir():
            for path in self.runs.glob(".*.tmp"):
                with contextlib.suppress(OSError):
                    path.unlink()

    def write_plan(self, sweep: Sweep, runs: Iterable[PlannedRun], reference: str | None) -> None:
        """The plan of the sweep starting now; the sessions of earlier sweeps are kept."""
        plan = {
            "format": STORE_FORMAT,
            "name": sweep.name,
            "reference": reference,
            "runs": [run.run_id for run in runs],
            "sessions": self.read_plan().get("sessions", []),
        }
        write_atomic(self.root / PLAN_FILE, json.dumps(plan, indent=1) + "\n")

    def add_session(self, session: dict[str, Any]) -> None:
        """One sweep's account (when, where, how long, how many runs) added to the plan."""
        plan = self.read_plan()
        plan.setdefault("sessions", []).append(session)
        write_atomic(self.root / PLAN_FILE, json.dumps(plan, indent=1) + "\n")

    def read_plan(self) -> dict[str, Any]:
        path = self.root / PLAN_FILE
        if not path.exists():
            return {}
        try:
            plan = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise StoreError(f"{PLAN_FILE}: cannot be read ({exc})") from None
        if (
            not isinstance(plan, dict)
            or not isinstance(plan.get("runs", []), list)
            or not isinstance(plan.get("sessions", []), list)
        ):
            raise StoreError(f"{PLAN_FILE}: is not a sweep plan")
        return plan
