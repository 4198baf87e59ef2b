"""Seeded variants of an openb pod list, made the way the openb family was made from its default trace.

The family's files (``cpuXXX``, ``gpushareXX``, ``multigpuXX``, ``gpuspecXX``) differ from the
default trace in a way that can be read off the rows; this module repeats it at any level and
with any seed, so a policy can be measured on workloads no tuning looked at:

* the pods fall into four classes: CPU-only (``num_gpu`` 0), GPU-sharing (one GPU,
  ``gpu_milli`` < 1000), one whole GPU, several whole GPUs;
* a class that shrinks keeps a uniform sample of its own rows; a class that grows keeps all
  of them and adds rows drawn uniformly with replacement from itself (every row a variant
  adds is a copy of one of the default trace's rows of the same class);
* ``cpu=p``: CPU-only pods become the fraction p of all pods (cpu050: 5%, cpu200: 20%); the
  GPU pods are untouched;
* ``gpushare=x``: GPU-sharing pods carry the fraction x of the summed GPU request, the number
  of GPU pods staying the same; the whole-GPU pods (one and several GPUs as one pool) make up
  the rest; CPU-only pods are untouched;
* ``multigpu=x``: multi-GPU pods are added (or removed) until they carry the fraction x of the
  summed GPU request; nothing else changes;
* ``gpuspec=f``: the fraction f of the GPU pods get a ``gpu_spec`` (the GPU models they may
  run on). Which pods: a weighted draw without replacement, sharing and multi-GPU pods at
  0.78 the weight of one-GPU pods (the rate measured across gpuspec05/10/20). Which models:
  a draw from the class's own table below (counts pooled over the three shared gpuspec
  files), again until the pod fits some node of a drawn model by CPU, memory and GPU count;
* the rows are shuffled and renamed ``openb-pod-0000``... in their new order.

Classes change in the order cpu, gpushare, multigpu; pinning comes last, so a mix such as
``gpuspec=0.33 cpu=0.25`` pins a third of the GPU pods of the CPU-heavy trace. The output has
the default trace's columns; time columns travel with their row.
"""

from __future__ import annotations

import csv
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import TraceError

Row = dict[str, str]

COLUMNS = (
    "name",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)
CPU, SHARE, WHOLE, MULTI = "cpu", "share", "whole", "multi"

# gpu_spec per class, counted over gpuspec05, gpuspec10 and gpuspec20 (pods pinned there:
# 957 sharing, 1,565 one-GPU, 23 multi-GPU); a pinned pod's models are drawn by these weights.
SPEC_TABLE: Mapping[str, tuple[tuple[str, int], ...]] = {
    SHARE: (("T4", 591), ("P100", 348), ("G2|P100|T4|V100M16|V100M32", 18)),
    WHOLE: (
        ("T4", 686),
        ("G2", 374),
        ("V100M16|V100M32", 195),
        ("P100|V100M16|V100M32", 96),
        ("G3", 76),
        ("G2|P100|T4|V100M16|V100M32", 25),
        ("A10|G2|T4|V100M16|V100M32", 23),
        ("P100|T4|V100M16|V100M32", 21),
        ("V100M32", 19),
        ("P100|V100M16", 16),
        ("A10|T4", 12),
        ("V100M16", 10),
        ("P100", 7),
        ("A10|G2|P100|T4|V100M16|V100M32", 4),
        ("P100|T4", 1),
    ),
    MULTI: (
        ("G2", 13),
        ("G3", 4),
        ("V100M16|V100M32", 3),
        ("P100|V100M16|V100M32", 1),
        ("T4|V100M16|V100M32", 1),
        ("V100M32", 1),
    ),
}
# Pinning weight of a pod by class, relative to one-GPU pods (measured: 0.78 and 0.77).
PIN_WEIGHT: Mapping[str, float] = {SHARE: 0.78, WHOLE: 1.0, MULTI: 0.78}
_SPEC_TRIES = 20


@dataclass(frozen=True, slots=True)
class VariantSpec:
    """One variant: each level None (as in the base trace) or a fraction in [0, 1)
    (``gpushare`` up to 1: every GPU pod shares a GPU)."""

    name: str
    seed: int
    cpu: float | None = None
    gpushare: float | None = None
    multigpu: float | None = None
    gpuspec: float | None = None

    def __post_init__(self) -> None:
        for field in ("cpu", "gpushare", "multigpu", "gpuspec"):
            value = getattr(self, field)
            top = 1.0 if field == "gpushare" else 0.99
            if value is not None and not 0.0 <= value <= top:
                raise ValueError(f"variant {self.name}: {field} {value} (accepted: a fraction from 0 to {top:g})")


@dataclass(frozen=True, slots=True)
class NodeRoom:
    """What a pinned pod must fit on: a node's model, CPU, memory and GPU count."""

    model: str
    cpu_milli: int
    memory_mib: int
    gpus: int


def pod_class(row: Mapping[str, str]) -> str:
    gpus, milli = int(row["num_gpu"]), int(row["gpu_milli"])
    if gpus == 0:
        return CPU
    if gpus == 1:
        return SHARE if milli < 1000 else WHOLE
    return MULTI


def gpu_milli(row: Mapping[str, str]) -> int:
    return int(row["num_gpu"]) * int(row["gpu_milli"])


def resize(rows: Sequence[Row], count: int, rng: random.Random) -> list[Row]:
    """``count`` rows: a uniform sample of ``rows`` when fewer, else all of them plus draws
    with replacement."""
    if count <= len(rows):
        return rng.sample(list(rows), count)
    if not rows:
        raise ValueError(f"cannot grow an empty class to {count} pods")
    return list(rows) + [dict(rng.choice(rows)) for _ in range(count - len(rows))]


def _mean(values: Iterable[int]) -> float:
    items = list(values)
    return sum(items) / len(items) if items else 0.0


def with_cpu_share(pools: dict[str, list[Row]], fraction: float, rng: random.Random) -> None:
    """CPU-only pods become ``fraction`` of all pods."""
    others = sum(len(pools[c]) for c in (SHARE, WHOLE, MULTI))
    pools[CPU] = resize(pools[CPU], round(fraction * others / (1.0 - fraction)), rng)


def with_share_request(pools: dict[str, list[Row]], fraction: float, rng: random.Random) -> None:
    """Sharing pods carry ``fraction`` of the GPU request; GPU pods keep their number.

    With n GPU pods, mean requests s (sharing) and w (whole-GPU pods), k sharing pods carry
    k s / (k s + (n - k) w) = fraction, so k = fraction n w / (s (1 - fraction) + fraction w);
    then one pod at a time moves between the classes (a random whole-GPU pod out and a
    sharing pod in, or back) while that brings the realised fraction closer.
    """
    whole = pools[WHOLE] + pools[MULTI]
    n = len(pools[SHARE]) + len(whole)
    s = _mean(gpu_milli(r) for r in pools[SHARE])
    w = _mean(gpu_milli(r) for r in whole)
    k = round(fraction * n * w / (s * (1.0 - fraction) + fraction * w))
    source, spare = list(pools[SHARE]), list(whole)  # what added pods are copies of
    shares, kept = resize(source, k, rng), resize(spare, n - k, rng)
    rng.shuffle(kept)

    def error(share_milli: int, whole_milli: int) -> float:
        return abs(share_milli / max(1, share_milli + whole_milli) - fraction)

    share_milli, whole_milli = sum(map(gpu_milli, shares)), sum(map(gpu_milli, kept))
    for _ in range(n):
        if share_milli / max(1, share_milli + whole_milli) < fraction and kept and source:
            out, into = kept[-1], dict(rng.choice(source))
            if error(share_milli + gpu_milli(into), whole_milli - gpu_milli(out)) >= error(share_milli, whole_milli):
                break
            kept.pop()
            shares.append(into)
            share_milli, whole_milli = share_milli + gpu_milli(into), whole_milli - gpu_milli(out)
        elif share_milli / max(1, share_milli + whole_milli) > fraction and shares and spare:
            out, into = shares[-1], dict(rng.choice(spare))
            if error(share_milli - gpu_milli(out), whole_milli + gpu_milli(into)) >= error(share_milli, whole_milli):
                break
            shares.pop()
            kept.append(into)
            share_milli, whole_milli = share_milli - gpu_milli(out), whole_milli + gpu_milli(into)
        else:
            break
    pools[SHARE] = shares
    pools[WHOLE] = [r for r in kept if pod_class(r) == WHOLE]
    pools[MULTI] = [r for r in kept if pod_class(r) == MULTI]


def with_multi_request(pools: dict[str, list[Row]], fraction: float, rng: random.Random) -> None:
    """Multi-GPU pods are added (copies of their own) until they carry at least ``fraction``
    of the GPU request, or removed at random while the rest would still carry that much."""
    multi = list(pools[MULTI])
    source = list(multi)
    rest = sum(gpu_milli(r) for c in (SHARE, WHOLE) for r in pools[c])
    carried = sum(gpu_milli(r) for r in multi)
    if carried < fraction * (carried + rest):
        if not source:
            raise ValueError("cannot add multi-GPU pods: the base trace has none")
        while carried < fraction * (carried + rest):
            drawn = dict(rng.choice(source))
            multi.append(drawn)
            carried += gpu_milli(drawn)
    else:
        rng.shuffle(multi)
        while multi and carried - gpu_milli(multi[-1]) >= fraction * (carried - gpu_milli(multi[-1]) + rest):
            carried -= gpu_milli(multi.pop())
    pools[MULTI] = multi


def fits_somewhere(row: Mapping[str, str], models: Iterable[str], rooms: Sequence[NodeRoom]) -> bool:
    allowed = set(models)
    cpu, memory, gpus = int(row["cpu_milli"]), int(row["memory_mib"]), int(row["num_gpu"])
    return any(r.model in allowed and cpu <= r.cpu_milli and memory <= r.memory_mib and gpus <= r.gpus for r in rooms)


def pin(rows: list[Row], fraction: float, rooms: Sequence[NodeRoom], rng: random.Random) -> int:
    """Give ``fraction`` of the GPU pods a ``gpu_spec`` (in place); the number pinned.

    Pods are drawn without replacement by weight (``PIN_WEIGHT``: each pod's key is
    u ** (1 / weight), the largest keys win); a pod whose drawn models fit it nowhere draws
    again, and is left unpinned (the next pod is taken) after ``_SPEC_TRIES`` misses.
    """
    gpu_rows = [r for r in rows if pod_class(r) != CPU]
    target = round(fraction * len(gpu_rows))
    keyed = sorted(gpu_rows, key=lambda r: rng.random() ** (1.0 / PIN_WEIGHT[pod_class(r)]), reverse=True)
    pinned = 0
    for row in keyed:
        if pinned == target:
            break
        table = SPEC_TABLE[pod_class(row)]
        specs, weights = [s for s, _ in table], [w for _, w in table]
        for _ in range(_SPEC_TRIES):
            spec = rng.choices(specs, weights)[0]
            if fits_somewhere(row, spec.split("|"), rooms):
                row["gpu_spec"] = spec
                pinned += 1
                break
    return pinned


def make_variant(base: Sequence[Mapping[str, str]], rooms: Sequence[NodeRoom], spec: VariantSpec) -> list[Row]:
    """The variant's rows (shuffled, renamed), drawn from ``random.Random(spec.seed)``."""
    rng = random.Random(spec.seed)
    pools: dict[str, list[Row]] = {CPU: [], SHARE: [], WHOLE: [], MULTI: []}
    for row in base:
        copy = {c: row.get(c) or "" for c in COLUMNS}
        copy["gpu_spec"] = "" if spec.gpuspec is not None else copy["gpu_spec"]
        pools[pod_class(copy)].append(copy)
    if spec.cpu is not None:
        with_cpu_share(pools, spec.cpu, rng)
    if spec.gpushare is not None:
        with_share_request(pools, spec.gpushare, rng)
    if spec.multigpu is not None:
        with_multi_request(pools, spec.multigpu, rng)
    rows = [dict(r) for c in (CPU, SHARE, WHOLE, MULTI) for r in pools[c]]
    if spec.gpuspec is not None:
        pin(rows, spec.gpuspec, rooms, rng)
    rng.shuffle(rows)
    for i, row in enumerate(rows):
        row["name"] = f"openb-pod-{i:04d}"
    return rows


def describe(rows: Sequence[Mapping[str, str]]) -> dict[str, float]:
    """The levels a variant actually has (the fractions the family's names promise)."""
    classes = [pod_class(r) for r in rows]
    total = sum(gpu_milli(r) for r in rows) or 1
    gpu_pods = sum(1 for c in classes if c != CPU) or 1
    return {
        "pods": len(rows),
        "cpu": sum(1 for c in classes if c == CPU) / len(rows),
        "gpushare": sum(gpu_milli(r) for r, c in zip(rows, classes, strict=True) if c == SHARE) / total,
        "multigpu": sum(gpu_milli(r) for r, c in zip(rows, classes, strict=True) if c == MULTI) / total,
        "gpuspec": sum(1 for r, c in zip(rows, classes, strict=True) if c != CPU and r.get("gpu_spec")) / gpu_pods,
        "gpu_request": total / 1000,
    }


def read_rows(path: Path, required: Sequence[str] = ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli")) -> list[Row]:
    """A CSV's rows as dicts; TraceError when unreadable or a ``required`` column is missing."""
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in required if c not in (reader.fieldnames or [])]
            if missing:
                raise TraceError(path, "header", f"missing column(s) {', '.join(missing)}")
            return [dict(r) for r in reader]
    except OSError as exc:
        raise TraceError(path, "", f"cannot be read: {exc.strerror or exc}") from exc


def read_rooms(path: Path) -> list[NodeRoom]:
    """The GPU nodes of an openb node list, as what a pinned pod must fit on."""
    rows = read_rows(path, ("cpu_milli", "memory_mib", "gpu", "model"))
    return [NodeRoom(r["model"], int(r["cpu_milli"]), int(r["memory_mib"]), int(r["gpu"])) for r in rows if r["model"]]


def write_rows(path: Path, rows: Sequence[Mapping[str, str]]) -> None:
    """Write atomically: a half-written pod list never stands under the final name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with partial.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    partial.replace(path)
