"""What ``gpuslice simulate --defrag-budget`` writes and prints: per run, the pods turned away,
the evictions the planner spent and the GPU-hours allocated; per (trace, policy, arm), their
means over seeds, and the pods the planner let in per eviction, against waiting alone.

Arms: ``off`` is the plain timed replay (a pod that fits nowhere is turned away at once);
``wait`` (budget 0) lets it wait for the next planner run without any move; a number is the
planner with that many evictions a run. The planner's benefit is ``wait`` minus that arm.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from rich.table import Table

from .engine import RunResult

DEFRAG_FILE = "defrag.csv"
COLUMNS = (
    "trace",
    "policy",
    "seed",
    "arm",
    "every_min",
    "budget",
    "pods",
    "turned_away",
    "evicted_lost",
    "evictions",
    "moves",
    "waited_in",
    "gpu_hours",
    "wall_seconds",
)


def arm(result: RunResult) -> str:
    spec = result.defrag
    if spec is None:
        return "off"
    return "wait" if spec.budget == 0 else str(spec.budget)


def rows(results: Sequence[RunResult]) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for r in results:
        spec = r.defrag
        out.append(
            {
                "trace": r.trace,
                "policy": r.policy,
                "seed": r.seed,
                "arm": arm(r),
                "every_min": "" if spec is None else f"{spec.every_s / 60:g}",
                "budget": "" if spec is None else spec.budget,
                "pods": r.placed + r.failed,
                "turned_away": r.failed,
                "evicted_lost": r.evicted_lost,
                "evictions": r.evictions,
                "moves": r.moves,
                "waited_in": r.waited_in,
                "gpu_hours": f"{r.gpu_hours:.1f}",
                "wall_seconds": f"{r.wall_seconds:.2f}",
            }
        )
    return out


def read(path: Path) -> list[dict[str, object]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def summary(recorded: Sequence[dict[str, object]]) -> list[dict[str, object]]:
    """Per (trace, policy, arm): seeds, means (and sd of the pods turned away), and the pods let
    in per eviction against the ``wait`` arm of the same (trace, policy) and seeds."""
    groups: dict[tuple[str, str, str], list[dict[str, object]]] = defaultdict(list)
    for row in recorded:
        groups[(str(row["trace"]), str(row["policy"]), str(row["arm"]))].append(row)

    def mean(members: list[dict[str, object]], key: str) -> float:
        return statistics.fmean(float(str(m[key])) for m in members)

    out = []
    for (trace, policy, name), members in groups.items():
        turned = [float(str(m["turned_away"])) for m in members]
        waiting = groups.get((trace, policy, "wait"))
        per_eviction = math.nan
        if waiting is not None and name not in ("off", "wait"):
            seeds = {str(m["seed"]) for m in members}
            base = [w for w in waiting if str(w["seed"]) in seeds]
            spent = sum(float(str(m["evictions"])) for m in members)
            if base and spent and len(base) == len(members):
                saved = sum(float(str(w["turned_away"])) for w in base) - sum(turned)
                per_eviction = saved / spent
        out.append(
            {
                "trace": trace,
                "policy": policy,
                "arm": name,
                "seeds": len(members),
                "pods": mean(members, "pods"),
                "turned_away": statistics.fmean(turned),
                "turned_away_sd": statistics.stdev(turned) if len(turned) > 1 else 0.0,
                "evictions": mean(members, "evictions"),
                "evicted_lost": mean(members, "evicted_lost"),
                "gpu_hours": mean(members, "gpu_hours"),
                "per_eviction": per_eviction,
            }
        )
    order = {"off": 0, "wait": 1}
    return sorted(out, key=lambda r: (r["trace"], r["policy"], order.get(str(r["arm"]), 2), str(r["arm"]).zfill(6)))


def _number(value: object, digits: int = 1) -> str:
    v = float(str(value))
    return "–" if math.isnan(v) else f"{v:.{digits}f}"


def table(summarized: Sequence[dict[str, object]]) -> Table:
    out = Table(title="Defragmentation in timed replay (mean over seeds; arm: off / wait / evictions per run)")
    for column in ("trace", "policy", "arm", "seeds", "turned away", "evictions", "lost", "GPU-hours", "in / eviction"):
        out.add_column(column, justify="left" if column in ("trace", "policy", "arm") else "right")
    for r in summarized:
        out.add_row(
            str(r["trace"]),
            str(r["policy"]),
            str(r["arm"]),
            str(r["seeds"]),
            f"{_number(r['turned_away'])} ± {_number(r['turned_away_sd'])}",
            _number(r["evictions"]),
            _number(r["evicted_lost"]),
            _number(r["gpu_hours"], 0),
            _number(r["per_eviction"], 2),
        )
    return out


def markdown(summarized: Sequence[dict[str, object]]) -> str:
    """The table as Markdown (for simulations/README.md)."""
    lines = [
        "| scenario | policy | arm | pods | turned away | evictions | evicted, not placed again | GPU-hours "
        "| let in per eviction |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in summarized:
        lines.append(
            f"| {r['trace']} | {r['policy']} | {r['arm']} | {_number(r['pods'], 0)} | "
            f"{_number(r['turned_away'])} ± {_number(r['turned_away_sd'])} | {_number(r['evictions'])} | "
            f"{_number(r['evicted_lost'])} | {_number(r['gpu_hours'], 0)} | {_number(r['per_eviction'], 2)} |"
        )
    return "\n".join(lines) + "\n"
