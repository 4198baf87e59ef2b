"""fgd-reserve's rules taken apart: each rule alone (fgd-cpu's score with fgd-reserve's
learning, plus that rule) and each rule removed (every other rule kept), on tuning and held-out
seeds, written to ablation.csv (one row per run) and printed as ablation.md.

    python simulations/fgd-reserve/ablation.py run [--openb DIR] [--variants DIR] [--workers N]  # what is missing
    python simulations/fgd-reserve/ablation.py table  # the table of ablation.md

A rule that cannot act on a trace (the MIG rules where no GPU is MIG, the departures rule where
no pod leaves, the GPU nodes' CPU rule where every node has GPUs) leaves its runs as they are
without it, so a variant is run once per set of rules that can act there: "without mig-cpu" on
an openb trace is the run of every rule.

The figure is the one each replay is judged by: pods turned away (the MIG and MPS/time-slicing
scenarios) or unallocated GPU % at arrived = 100% (openb). The effect of a rule is the per-seed
difference it makes on the same seed (removed: without it minus with every rule; alone: the rule
alone minus none): its mean, the sd of the per-seed differences (the seeds' spread) and the
standard error of the mean. The effect is inside the spread when its mean is no larger than
that sd: on a single run, the rule moves the figure less than the seed does.
"""

from __future__ import annotations

import argparse
import csv
import functools
import math
import os
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
OUT = HERE / "ablation.csv"
FIELDS = ("set", "role", "variant", "rules", "seed", "failed_pods", "unallocated_pct", "gpu_hours")

# the rules measured: fgd-reserve's, and mig-cpu (a price on MIG nodes' CPU for pods without
# GPUs), measured here and removed after (the runs with it were made at commit ABLATION_COMMIT)
RULES = ("reservation", "cpu-bound", "departures", "mig-balance", "mig-cpu", "gpu-cpu")
ABLATION_COMMIT = "741917c"


@dataclass(frozen=True)
class Set:
    name: str
    trace: str  # a scenario under simulations/scenarios, or an openb pod list's name
    role: str  # tune or held-out
    seeds: tuple[int, ...]
    acting: frozenset[str]  # the rules that can act on the trace
    figure: str  # failed_pods or unallocated_pct
    only: frozenset[str] = frozenset()  # the variants run on these seeds (empty: all)


MIG = frozenset({"reservation", "cpu-bound", "departures", "mig-balance", "mig-cpu"})  # no node without GPUs
MIG_ARRIVALS = MIG - {"departures"}  # nothing leaves
OPENB = frozenset({"reservation", "cpu-bound"})  # arrivals on GPU nodes only, no MIG
MPS_TS = frozenset({"reservation", "cpu-bound", "departures"})
SETS = (  # the held-out replays first (the MIG ones, where the rules in question act), then tuning
    Set(
        "h100-mig-fractions", "h100-mig-fractions.yaml", "held-out", tuple(range(111, 151)), MIG_ARRIVALS, "failed_pods"
    ),
    Set("h100-mig-departures", "h100-mig-departures.yaml", "held-out", tuple(range(51, 66)), MIG, "failed_pods"),
    Set(  # more seeds for the rule in question: mig-cpu removed against every rule
        "h100-mig-departures",
        "h100-mig-departures.yaml",
        "held-out",
        tuple(range(51, 111)),  # 51-65 as run for every variant, then 66-110
        MIG,
        "failed_pods",
        frozenset({"all", "without mig-cpu"}),
    ),
    Set("gpuspec10", "gpuspec10", "held-out", (42,), OPENB, "unallocated_pct"),
    Set("cpu235", "cpu235", "held-out", (42,), OPENB, "unallocated_pct"),
    Set("inference-mps-ts", "inference-mps-timeslicing.yaml", "held-out", tuple(range(11, 16)), MPS_TS, "failed_pods"),
    Set("gen-gpuspec33-s2", "variants:gen-gpuspec33-s2", "held-out", (42,), OPENB, "unallocated_pct"),
    Set("gpuspec20", "gpuspec20", "tune", (42,), OPENB, "unallocated_pct"),
    Set("default", "default", "tune", (42,), OPENB, "unallocated_pct"),
    Set("cpu300", "cpu300", "tune", (42,), OPENB, "unallocated_pct"),
    Set("h100-mig-fractions", "h100-mig-fractions.yaml", "tune", tuple(range(11, 21)), MIG_ARRIVALS, "failed_pods"),
    Set("h100-mig-departures", "h100-mig-departures.yaml", "tune", tuple(range(11, 14)), MIG, "failed_pods"),
    Set("inference-mps-ts", "inference-mps-timeslicing.yaml", "tune", tuple(range(1, 4)), MPS_TS, "failed_pods"),
)


def variants() -> dict[str, tuple[str, ...]]:
    """Variant name -> the rules it keeps."""
    found = {"all": RULES, "none": ()}
    for rule in RULES:
        found[f"only {rule}"] = (rule,)
        found[f"without {rule}"] = tuple(r for r in RULES if r != rule)
    return found


def effective(rules: tuple[str, ...], acting: frozenset[str]) -> tuple[str, ...]:
    return tuple(rule for rule in RULES if rule in rules and rule in acting)


def trace_path(trace: str, openb: Path, generated: Path) -> Path:
    """A scenario's file, a generated variant's pod list (``variants:NAME``) or an openb one's."""
    if trace.endswith(".yaml"):
        return REPO / "simulations" / "scenarios" / trace
    if trace.startswith("variants:"):
        return generated / f"openb_pod_list_{trace.removeprefix('variants:')}.csv"
    return openb / f"openb_pod_list_{trace}.csv"


@functools.cache
def load(path: str) -> Any:
    from scheduler.sim.load import load_trace

    return load_trace(path)


def run_one(path: str, rules: tuple[str, ...], seed: int) -> dict[str, object]:
    from scheduler.sim.engine import simulate
    from scheduler.sim.metrics import summary_row

    trace = load(path)
    result = simulate(trace, "fgd-reserve", seed, policy_options={"rules": list(rules)})
    row = summary_row(result)
    return {
        "failed_pods": result.failed,
        "unallocated_pct": row["unallocated_gpu_pct_at_100"],
        "gpu_hours": row["gpu_hours"],
    }


def done() -> set[tuple[str, str, int]]:
    if not OUT.exists():
        return set()
    with OUT.open(newline="", encoding="utf-8") as handle:
        return {(row["set"], row["rules"], int(row["seed"])) for row in csv.DictReader(handle)}


def jobs(openb: Path, generated: Path) -> Iterator[tuple[Set, tuple[str, ...], int, str]]:
    """(set, effective rules, seed, path) of every distinct run, in the order of SETS."""
    for s in SETS:
        chosen = [rules for name, rules in variants().items() if not s.only or name in s.only]
        distinct = sorted({effective(rules, s.acting) for rules in chosen}, key=len, reverse=True)
        for rules in distinct:
            for seed in s.seeds:
                yield s, rules, seed, str(trace_path(s.trace, openb, generated))


def run(openb: Path, generated: Path, workers: int) -> None:
    have = done()
    todo = [job for job in jobs(openb, generated) if (job[0].name, " ".join(job[1]), job[2]) not in have]
    from scheduler.core.policies.fgdreserve import RULES as KNOWN  # the rules of the code run

    gone = [job for job in todo if not set(job[1]) <= set(KNOWN)]
    todo = [job for job in todo if set(job[1]) <= set(KNOWN)]
    print(
        f"{len(todo)} runs to go ({len(gone)} with a removed rule left out: run them at {ABLATION_COMMIT})", flush=True
    )
    new = not OUT.exists()
    with OUT.open("a", newline="", encoding="utf-8") as handle, ProcessPoolExecutor(workers) as pool:
        writer = csv.DictWriter(handle, FIELDS)
        if new:
            writer.writeheader()
        futures = {pool.submit(run_one, path, rules, seed): (s, rules, seed) for s, rules, seed, path in todo}
        for count, future in enumerate(as_completed(futures), 1):
            s, rules, seed = futures[future]
            row = {"set": s.name, "role": s.role, "variant": "", "rules": " ".join(rules), "seed": seed}
            row.update(future.result())
            writer.writerow(row)
            handle.flush()
            print(f"{count}/{len(todo)} {s.name} {seed} [{' '.join(rules)}]", flush=True)


def figures() -> dict[tuple[str, str], dict[int, float]]:
    """(set, effective rules) -> seed -> the set's figure."""
    found: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    figure = {s.name: s.figure for s in SETS}
    with OUT.open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            found[(row["set"], row["rules"])][int(row["seed"])] = float(row[figure[row["set"]]])
    return found


def effect(a: dict[int, float], b: dict[int, float], seeds: tuple[int, ...]) -> tuple[float, float, int] | None:
    """Mean and sd over ``seeds`` of a - b, seed by seed, and how many seeds (None if none; the
    sd is nan for one seed)."""
    common = [seed for seed in seeds if seed in a and seed in b]
    if not common:
        return None
    diffs = [a[seed] - b[seed] for seed in common]
    sd = statistics.stdev(diffs) if len(diffs) > 1 else math.nan
    return statistics.fmean(diffs), sd, len(diffs)


def inside(found: tuple[float, float, int] | None) -> bool | None:
    """Whether an effect is inside the seeds' spread: its mean no larger than the sd of the
    per-seed differences (None when not measured on two seeds or more)."""
    return None if found is None or found[2] < 2 else abs(found[0]) <= found[1]


def cell(found: tuple[float, float, int] | None) -> str:
    if found is None:
        return "–"
    mean, sd, n = found
    if n < 2:
        return f"{mean:+.2f} (1 seed)"
    return f"{mean:+.2f} (sd {sd:.2f}, se {sd / math.sqrt(n):.2f}, {n} seeds){'' if inside(found) else ' **outside**'}"


def mean_of(runs: dict[int, float], seeds: tuple[int, ...]) -> str:
    ran = [runs[seed] for seed in seeds if seed in runs]
    return f"{statistics.fmean(ran):.2f}" if ran else "–"


def table() -> None:
    """Per (replay, seeds, rule that acts there): the figure with every rule and with none, and
    the rule's effect removed and alone (mean, sd and standard error of the per-seed difference;
    **outside** where the mean is larger than the sd: outside the seeds' spread)."""
    data = figures()
    print(
        "| replay | role | seeds | figure | every rule | none | rule | removed: without - every | alone: only - none |"
    )
    print("|---|---|---|---|---:|---:|---|---:|---:|")
    for s in SETS:
        full = data.get((s.name, " ".join(effective(RULES, s.acting))), {})
        bare = data.get((s.name, ""), {})
        span = f"{s.seeds[0]}-{s.seeds[-1]}" if len(s.seeds) > 1 else str(s.seeds[0])
        for rule in RULES:
            if rule not in s.acting or (s.only and f"without {rule}" not in s.only):
                continue
            without = data.get((s.name, " ".join(effective(tuple(r for r in RULES if r != rule), s.acting))), {})
            alone = data.get((s.name, rule), {})
            print(
                f"| {s.name} | {s.role} | {span} | {s.figure} | {mean_of(full, s.seeds)} | {mean_of(bare, s.seeds)} "
                f"| {rule} | {cell(effect(without, full, s.seeds))} | {cell(effect(alone, bare, s.seeds))} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=("run", "table"))
    parser.add_argument("--openb", type=Path, default=Path(os.environ.get("OPENB", "data/openb")))
    parser.add_argument("--variants", type=Path, default=HERE.parent / "variants" / "data")  # make.py's --out
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    if args.what == "run":
        run(args.openb, args.variants, args.workers)
    else:
        table()


if __name__ == "__main__":
    sys.exit(main())
