"""The agent's ``/metrics``: allocated against used per share, stray use and overruns.

Everything is read from the last sample when Prometheus scrapes (a collector, not gauges
kept up to date), so a pod that is gone has no series at the next scrape: cardinality is
bounded by the shares and GPUs there are now. Per share, the labels an operator filters by:
``namespace``, ``pod``, ``node``, ``gpu`` (index), ``uuid``, ``model``, ``mode`` and
``mig_profile`` ("" unless MIG). ``pod`` is the pod's UID unless ``metrics.podNames`` is true:
the endpoint names no pod unless the operator says so.

======================================  =====================================================
gpuslice_share_memory_allocated_mib     memory the share's record gives
gpuslice_share_memory_used_mib          memory its processes use (NVML)
gpuslice_share_compute_allocated_milli  compute the record gives, thousandths of a GPU
gpuslice_share_compute_used_milli       its processes' SM utilisation, thousandths of a GPU
                                        (not on MIG, where NVML samples none)
gpuslice_share_processes                its processes on that GPU
gpuslice_share_overrun                  1 while above its memory past the grace period
gpuslice_gpu_memory_used_mib            per GPU: memory of every process on it
gpuslice_stray_memory_mib               per GPU: memory of processes no record accounts for
gpuslice_stray_processes                per GPU: how many such processes
gpuslice_agent_overruns_total           episodes past the grace period, by ``action``:
                                        reported, evicted, eviction_failed
gpuslice_agent_stray_events_total       Warning Events about stray use sent
gpuslice_agent_allocate_refused_total   Allocate calls refused, by ``reason``: no-record (a pod
                                        asks for the share without a record the agent honours,
                                        so it cannot tell whom it serves), no-pod, record-refused
                                        (the record fails the checks against the GPUs and the
                                        other records), no-mps-daemon
======================================  =====================================================
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .guard import EVICTED, EVICTION_FAILED, REPORTED
from .sampling import Sample

SHARE_LABELS = ["namespace", "pod", "node", "gpu", "uuid", "model", "mode", "mig_profile"]
GPU_LABELS = ["node", "gpu", "uuid"]


@dataclass(frozen=True, slots=True)
class View:
    """What a scrape reads: the last sample and the guard's state when it was taken."""

    node: str
    sample: Sample = field(default_factory=Sample)
    overrunning: frozenset[tuple[str, int]] = frozenset()
    actions: tuple[tuple[str, int], ...] = ()
    stray_events: int = 0
    refusals: tuple[tuple[str, int], ...] = ()
    pod_names: bool = False  # the pod label: the pod's name, else its UID (``metrics.podNames``)


class _Collector(Collector):
    def __init__(self, view: Callable[[], View]) -> None:
        self._view = view

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        view = self._view()
        node = view.node

        def family(name: str, text: str, labels: list[str] = SHARE_LABELS) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, text, labels=labels)

        mem_alloc = family("gpuslice_share_memory_allocated_mib", "GPU memory the share's allocation record gives.")
        mem_used = family("gpuslice_share_memory_used_mib", "GPU memory the share's processes use (NVML).")
        cpu_alloc = family(
            "gpuslice_share_compute_allocated_milli", "GPU compute the share's record gives, in thousandths of a GPU."
        )
        cpu_used = family(
            "gpuslice_share_compute_used_milli",
            "SM utilisation of the share's processes, in thousandths of a GPU (none on MIG).",
        )
        procs = family("gpuslice_share_processes", "Processes of the share on its GPU.")
        overrun = family(
            "gpuslice_share_overrun", "1 while the share uses more memory than it was given, past the grace period."
        )
        for share in view.sample.shares:
            labels = [
                share.namespace,
                share.name if view.pod_names else share.uid,
                node,
                str(share.gpu_index),
                share.gpu_uuid,
                share.model,
                share.mode.value,
                share.mig_profile,
            ]
            mem_alloc.add_metric(labels, share.allocated_memory_mib)
            cpu_alloc.add_metric(labels, share.allocated_compute_milli)
            overrun.add_metric(labels, 1 if share.key in view.overrunning else 0)
            if not share.measured:
                continue  # its GPU could not be read: no figure rather than a 0 that reads as idle
            mem_used.add_metric(labels, share.used_memory_mib)
            if share.used_compute_milli is not None:
                cpu_used.add_metric(labels, share.used_compute_milli)
            procs.add_metric(labels, len(share.processes))
        gpu_used = family("gpuslice_gpu_memory_used_mib", "GPU memory of every process on the GPU (NVML).", GPU_LABELS)
        stray_mem = family(
            "gpuslice_stray_memory_mib", "GPU memory of processes no allocation record accounts for.", GPU_LABELS
        )
        stray_count = family("gpuslice_stray_processes", "Processes no allocation record accounts for.", GPU_LABELS)
        used = view.sample.used_mib or {}
        for gpu in view.sample.gpus:
            labels = [node, str(gpu.index), gpu.uuid]
            mine = [s for s in view.sample.strays if s.gpu_uuid == gpu.uuid]
            if gpu.uuid in used:
                gpu_used.add_metric(labels, used[gpu.uuid])
            stray_mem.add_metric(labels, sum(s.memory_mib for s in mine))
            stray_count.add_metric(labels, len(mine))
        actions = CounterMetricFamily(
            "gpuslice_agent_overruns",
            "Overrun episodes past the grace period, by what was done.",
            labels=["node", "action"],
        )
        counted = dict(view.actions)
        for action in (REPORTED, EVICTED, EVICTION_FAILED):
            actions.add_metric([node, action], counted.get(action, 0))
        events = CounterMetricFamily(
            "gpuslice_agent_stray_events", "Warning Events sent about stray GPU use.", labels=["node"]
        )
        events.add_metric([node], view.stray_events)
        yield from (mem_alloc, mem_used, cpu_alloc, cpu_used, procs, overrun, gpu_used, stray_mem, stray_count)
        refused = CounterMetricFamily(
            "gpuslice_agent_allocate_refused", "Allocate calls refused, by reason.", labels=["node", "reason"]
        )
        for reason, count in view.refusals:
            refused.add_metric([node, reason], count)
        yield actions
        yield events
        yield refused


def registry(view: Callable[[], View]) -> CollectorRegistry:
    """A registry of its own (several agents can live in one test process)."""
    out = CollectorRegistry()
    out.register(_Collector(view))
    return out
