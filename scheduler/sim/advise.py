"""``gpuslice advise``: shares far larger than their measured peak, the share that would fit, and the
GPUs the cluster would free if they were resized.

For each share (a pod on one GPU) with a measured peak and an allocation:

* **far below**: ``peak <= allocated x threshold / 100`` (``--threshold-pct``, 50);
* **the share that fits**: ``peak x (100 + headroom) / 100`` (``--headroom-pct``, 20), rounded
  up to a multiple of ``--granularity-mib`` (1024); on MIG, the smallest profile of the GPU's
  model whose memory holds it. Advised only when smaller than what the share has.

A pod on several GPUs gets one request for all of them (as it asked): the largest of its
shares' suggestions, and only if every one of them is far below.

**Freed GPUs** (with a cluster file): the cluster's running pods are packed onto its empty
nodes by the simulator (:func:`scheduler.sim.engine.simulate`: the extender's core, the named
policy, pods in the file's order, no shuffle), once as they are and once with the advised
pods resized; freed is the difference in GPUs holding at least one share. The resized request
keeps the pod's selectors and its compute (a fraction's, or an explicit compute share; else
compute in proportion to the new memory); a whole-GPU pod becomes a memory share of that
size; a MIG pod asks for the smaller profile.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from scheduler.core.catalog import CATALOG, MigProfile, ProfileSpec, canonical_model_name
from scheduler.core.errors import UsageError
from scheduler.core.inventory import Node
from scheduler.core.policies import REGISTRY
from scheduler.core.request import Demand, GpuKind, GpuRequest

from .engine import simulate
from .kubelist import read_kube_list
from .model import ARRIVALS, BoundPod, SimPod, Trace
from .recorded import ALLOCATED, ShareRecord, read

DEFAULT_POLICY = "fgd-reserve"  # the extender's default (scheduler.extender.config.PolicyConfig)


@dataclass(frozen=True, slots=True)
class Options:
    threshold_pct: float = 50.0
    headroom_pct: float = 20.0
    granularity_mib: int = 1024
    policy: str = DEFAULT_POLICY

    def check(self) -> Options:
        """Itself, or a UsageError naming the option and what is accepted."""
        if not 0 < self.threshold_pct <= 100:
            raise UsageError(f"--threshold-pct: {self.threshold_pct:g}; accepted: a percent in (0, 100]")
        if not 0 <= self.headroom_pct <= 1000:
            raise UsageError(f"--headroom-pct: {self.headroom_pct:g}; accepted: a percent in [0, 1000]")
        if not 1 <= self.granularity_mib <= 1 << 20:
            raise UsageError(f"--granularity-mib: {self.granularity_mib}; accepted: a whole number of MiB >= 1")
        if self.policy not in REGISTRY:
            raise UsageError(f"--policy: {self.policy!r}; accepted: {', '.join(sorted(REGISTRY))}")
        return self


@dataclass(frozen=True, slots=True)
class Advice:
    pod: str
    uuid: str
    node: str
    gpu: str
    mode: str
    allocated_mib: int
    peak_mib: int
    suggested_mib: int
    suggested_profile: str = ""  # MIG: the profile that would fit


@dataclass(frozen=True, slots=True)
class Packing:
    gpus_now: int  # GPUs holding a share in the cluster file
    gpus_packed: int  # the running pods packed as they are
    gpus_resized: int  # ... and with the advised pods resized
    failed_packed: int
    failed_resized: int
    resized_pods: int
    not_in_cluster: tuple[str, ...]  # advised pods the cluster file does not hold

    @property
    def freed(self) -> int:
        return self.gpus_packed - self.gpus_resized


@dataclass(frozen=True, slots=True)
class Report:
    options: Options
    shares: int  # shares with a peak and an allocation
    unknown: tuple[str, ...]  # shares with a peak but no allocation anywhere
    advice: tuple[Advice, ...]
    packing: Packing | None


def round_up(value: int, step: int) -> int:
    return -(-value // step) * step


def _needed(peak: int, options: Options) -> int:
    """The peak with its headroom, in whole MiB (rounded up)."""
    return math.ceil(peak * (100 + options.headroom_pct) / 100)


def _mig_fit(model: str, needed: int) -> MigProfile | None:
    known = CATALOG.get(canonical_model_name(model)) if model else None
    layout = known.mig if known is not None else None
    if layout is None:
        return None
    fitting = [p for p in layout.profiles if p.memory_mib >= needed]
    return min(fitting, key=lambda p: (p.memory_mib, p.compute_slices), default=None)


def advise_share(record: ShareRecord, allocated: int, options: Options) -> Advice | None:
    """The advice for one share, or None if its peak is not far below its allocation."""
    peak = record.peak_mib or 0
    if allocated <= 0 or peak * 100 > allocated * options.threshold_pct:
        return None
    needed = _needed(peak, options)
    if record.mode == "mig" or record.mig_profile:
        profile = _mig_fit(record.model, needed)
        if profile is None or profile.memory_mib >= allocated:
            return None
        return Advice(
            record.pod, record.uuid, record.node, record.gpu, "mig", allocated, peak, profile.memory_mib, profile.name
        )
    suggested = max(options.granularity_mib, round_up(needed, options.granularity_mib))
    if suggested >= allocated:
        return None
    return Advice(record.pod, record.uuid, record.node, record.gpu, record.mode, allocated, peak, suggested)


def _allocations(bound: Sequence[BoundPod]) -> dict[tuple[str, str], int]:
    return {(b.name, s.uuid): s.memory_mib for b in bound if b.allocation for s in b.allocation.shares}


def _resized(demand: Demand, advice: Sequence[Advice]) -> Demand:
    gpu = demand.gpu
    largest = max(advice, key=lambda a: a.suggested_mib)
    if gpu.kind is GpuKind.MIG and largest.suggested_profile:
        return replace(demand, gpu=replace(gpu, profile=ProfileSpec.parse(largest.suggested_profile)))
    memory = largest.suggested_mib
    compute = (gpu.fraction_milli or gpu.compute_milli) if gpu.kind is GpuKind.SHARE else 0
    share = GpuRequest(
        GpuKind.SHARE,
        max(1, gpu.count),
        memory_mib=memory,
        compute_milli=compute,
        sharing=gpu.sharing,
        models=gpu.models,
    )
    return replace(demand, gpu=share)


def _gpus_now(nodes: Sequence[Node], bound: Sequence[BoundPod]) -> int:
    held = {(b.node, s.index) for b in bound if b.allocation for s in b.allocation.shares}
    return len(held & {(n.name, d.index) for n in nodes for d in n.devices})


def pack(trace: Trace, advice: Sequence[Advice], policy: str) -> Packing:
    """The freed GPUs: the running pods packed as they are, then resized (see the module)."""
    by_pod: dict[str, list[Advice]] = {}
    for item in advice:
        by_pod.setdefault(item.pod, []).append(item)
    running = {b.name for b in trace.bound}
    shares_of = {b.name: len(b.allocation.shares) if b.allocation else 1 for b in trace.bound}
    resize = {p: a for p, a in by_pod.items() if p in running and len(a) >= shares_of[p]}
    as_is = tuple(SimPod(b.name, b.demand) for b in trace.bound)
    resized = tuple(SimPod(p.name, _resized(p.demand, resize[p.name]) if p.name in resize else p.demand) for p in as_is)

    def run(pods: tuple[SimPod, ...]) -> tuple[int, int]:
        plain = Trace(trace.name, trace.nodes, pods, replay=ARRIVALS, inflate=0.0, shuffle=False)
        result = simulate(plain, policy, 0, replay=ARRIVALS, inflate=0.0, shuffle=False)
        return result.gpus_used, result.failed

    (packed, failed), (smaller, failed_small) = run(as_is), run(resized)
    return Packing(
        _gpus_now(trace.nodes, trace.bound),
        packed,
        smaller,
        failed,
        failed_small,
        len(resize),
        tuple(sorted(set(by_pod) - running)),
    )


def advise(metrics: Sequence[Path], cluster: Path | None, options: Options) -> Report:
    """Read the files, advise each share, and with a cluster file pack it (see the module)."""
    options.check()
    if not metrics:
        raise UsageError("give at least one metrics file (a Prometheus query's JSON or a /metrics snapshot)")
    records = read(metrics)
    trace = read_kube_list(cluster) if cluster is not None else None
    recorded_allocations = _allocations(trace.bound) if trace is not None else {}
    advice: list[Advice] = []
    unknown: list[str] = []
    counted = 0
    for key, record in sorted(records.items()):
        if record.peak_mib is None:
            continue
        allocated = record.allocated_mib if record.allocated_mib is not None else recorded_allocations.get(key)
        if allocated is None:
            unknown.append(f"{record.pod} on {record.uuid}")
            continue
        counted += 1
        found = advise_share(record, allocated, options)
        if found is not None:
            advice.append(found)
    packing = pack(trace, advice, options.policy) if trace is not None else None
    return Report(options, counted, tuple(unknown), tuple(advice), packing)


def as_json(report: Report) -> Mapping[str, object]:
    """The report as ``-o json`` prints it."""
    out: dict[str, object] = {
        "thresholdPct": report.options.threshold_pct,
        "headroomPct": report.options.headroom_pct,
        "granularityMiB": report.options.granularity_mib,
        "shares": report.shares,
        "withoutAllocation": list(report.unknown),
        "advice": [
            {
                "pod": a.pod,
                "uuid": a.uuid,
                "node": a.node,
                "gpu": a.gpu,
                "mode": a.mode,
                "allocatedMiB": a.allocated_mib,
                "peakMiB": a.peak_mib,
                "suggestedMiB": a.suggested_mib,
                **({"suggestedProfile": a.suggested_profile} if a.suggested_profile else {}),
            }
            for a in report.advice
        ],
    }
    if report.packing is not None:
        p = report.packing
        out["packing"] = {
            "policy": report.options.policy,
            "gpusNow": p.gpus_now,
            "gpusPacked": p.gpus_packed,
            "gpusResized": p.gpus_resized,
            "freedGpus": p.freed,
            "failedPacked": p.failed_packed,
            "failedResized": p.failed_resized,
            "resizedPods": p.resized_pods,
            "notInCluster": list(p.not_in_cluster),
        }
    return out


def render(report: Report) -> list[str]:
    """The report as plain lines (``-o table``): a table of the advice, then the packing."""
    o = report.options
    lines = [
        f"{report.shares} shares measured; {len(report.advice)} with a peak at most {o.threshold_pct:g} percent of "
        f"their memory (suggested: peak + {o.headroom_pct:g} percent, rounded up to {o.granularity_mib} MiB; "
        "MIG: the smallest profile that holds it)"
    ]
    if report.advice:
        rows = [("POD", "NODE", "GPU", "MODE", "ALLOCATED MiB", "PEAK MiB", "SUGGESTED")]
        for a in report.advice:
            suggested = a.suggested_profile or f"{a.suggested_mib} MiB"
            rows.append((a.pod, a.node, a.gpu, a.mode, str(a.allocated_mib), str(a.peak_mib), suggested))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    for share in report.unknown:
        lines.append(f"no allocation figure for {share} (give --cluster, or record {ALLOCATED} too)")
    p = report.packing
    if p is None:
        lines.append("freed GPUs: give --cluster (kubectl get nodes,pods -A -o yaml) to pack the resized requests")
        return lines
    lines.append(
        f"packing the running pods ({o.policy}): {p.gpus_packed} GPUs as they are, {p.gpus_resized} with "
        f"{p.resized_pods} pods resized: freed {p.freed} (GPUs in use now: {p.gpus_now})"
    )
    if p.failed_packed or p.failed_resized:
        lines.append(f"pods that did not fit: {p.failed_packed} as they are, {p.failed_resized} resized")
    if p.not_in_cluster:
        lines.append(f"advised but not in the cluster file (not packed): {', '.join(p.not_in_cluster)}")
    return lines
