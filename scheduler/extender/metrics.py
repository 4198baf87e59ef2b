"""Prometheus metrics: one registry per service, so several services can live in one process."""

from __future__ import annotations

import re
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from scheduler.core.quota import Amount, Charge, Limits, Quota, over_quota

from .debug import DeviceRow

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_NUMBER = re.compile(r"\d+(\.\d+)?")


def reason_class(reason: str) -> str:
    """A reason with its numbers blanked, so the label set stays small:
    "needs 20480 MiB on one GPU, more than is free" -> "needs N MiB on one GPU, more than is free"."""
    return _NUMBER.sub("N", reason)[:120]


class Metrics:
    def __init__(
        self,
        devices: Callable[[], Iterable[tuple[str, DeviceRow]]] | None = None,
        invalid: Callable[[], Mapping[str, str]] | None = None,
        quotas: Callable[[], Iterable[tuple[Quota, Charge]]] | None = None,
        rejected: Callable[[], Mapping[str, Mapping[str, str]]] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "gpuslice_extender_request_seconds",
            "Time to answer one extender call, by verb.",
            ["verb"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.binds = Counter("gpuslice_binds", "Binds by outcome.", ["outcome"], registry=self.registry)
        self.rejections = Counter(
            "gpuslice_filter_rejections", "Nodes a filter call rejected, by reason.", ["reason"], registry=self.registry
        )
        self.bad_requests = Counter(
            "gpuslice_bad_requests", "Calls answered with an error, by verb.", ["verb"], registry=self.registry
        )
        self.quota_refusals = Counter(
            "gpuslice_quota_refusals",
            "Filter calls in which a namespace's GPUQuota held its pod back on some node, by namespace.",
            ["namespace"],
            registry=self.registry,
        )
        self._classes: dict[str, str] = {}
        if quotas is not None:
            self.registry.register(_Quotas(quotas))
        if devices is not None:
            self.registry.register(_DeviceCollector(devices))
        if invalid is not None:
            self.registry.register(
                _NodeGauge(
                    "gpuslice_node_inventory_invalid",
                    "1 for each node gpuslice does not serve because its GPU inventory is invalid.",
                    lambda: dict.fromkeys(invalid(), 1.0),
                )
            )
        if rejected is not None:
            self.registry.register(
                _NodeGauge(
                    "gpuslice_records_rejected",
                    "Allocation records on the node that gpuslice does not count, reasons in the Node's events.",
                    lambda: {node: float(len(pods)) for node, pods in rejected().items()},
                )
            )

    def reject(self, reasons: Iterable[str]) -> None:
        self.reject_counts(Tally(reasons))

    def reject_counts(self, tally: Mapping[str, int]) -> None:
        """Count ``tally[reason]`` rejections for each reason."""
        classes = self._classes
        per_class: dict[str, int] = {}  # reasons name numbers: many texts, few classes
        for reason, n in tally.items():
            label = classes.get(reason)
            if label is None:
                if len(classes) > 10_000:
                    classes.clear()
                label = classes[reason] = reason_class(reason)
            per_class[label] = per_class.get(label, 0) + n
        for label, n in per_class.items():
            self.rejections.labels(label).inc(n)


class _DeviceCollector(Collector):
    """Allocated and free GPU memory and compute per node and sharing mode, computed at scrape time."""

    def __init__(self, devices: Callable[[], Iterable[tuple[str, DeviceRow]]]) -> None:
        self._devices = devices

    def collect(self) -> Iterator[GaugeMetricFamily]:
        memory = GaugeMetricFamily(
            "gpuslice_gpu_memory_mib",
            "GPU memory per node and sharing mode: allocated, free, and stray (held by processes no record "
            "accounts for, as the node agent measured it).",
            labels=["node", "mode", "state"],
        )
        compute = GaugeMetricFamily(
            "gpuslice_gpu_compute_milli",
            "GPU compute (thousandths of a GPU) per node and sharing mode.",
            labels=["node", "mode", "state"],
        )
        unhealthy = GaugeMetricFamily(
            "gpuslice_gpu_unhealthy",
            "1 for each GPU the node agent marked unhealthy (fatal XID, off the bus), with the reason.",
            labels=["node", "gpu", "uuid", "reason"],
        )
        totals: dict[tuple[str, str], list[int]] = {}
        for node, row in self._devices():
            if not row.healthy:
                unhealthy.add_metric([node, str(row.index), row.uuid, row.unhealthy_reason], 1)
            t = totals.setdefault((node, row.mode), [0, 0, 0, 0, 0])
            t[0] += row.memory_allocated_mib
            t[1] += row.memory_free_mib
            t[2] += row.compute_allocated_milli
            t[3] += row.compute_free_milli
            t[4] += row.stray_memory_mib
        for (node, mode), (mem_used, mem_free, cpu_used, cpu_free, stray) in sorted(totals.items()):
            memory.add_metric([node, mode, "allocated"], mem_used)
            memory.add_metric([node, mode, "free"], mem_free)
            memory.add_metric([node, mode, "stray"], stray)
            compute.add_metric([node, mode, "allocated"], cpu_used)
            compute.add_metric([node, mode, "free"], cpu_free)
        yield memory
        yield compute
        yield unhealthy


class _NodeGauge(Collector):
    """One gauge with a ``node`` label, computed at scrape time from ``values`` (node -> value):
    ``gpuslice_node_inventory_invalid`` (1 for each node whose GPU inventory cannot be read: no pods
    are placed there until it is fixed) and ``gpuslice_records_rejected`` (the allocation records on a
    node that gpuslice does not count). The reasons are in the log, the Node's events and ``/debug/nodes``."""

    def __init__(self, name: str, text: str, values: Callable[[], Mapping[str, float]]) -> None:
        self._name, self._text, self._values = name, text, values

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gauge = GaugeMetricFamily(self._name, self._text, labels=["node"])
        for node, value in sorted(self._values().items()):
            gauge.add_metric([node], value)
        yield gauge


class _Quotas(Collector):
    """Per GPUQuota and measure (``gpu_memory_mib``, ``gpu_compute_milli``, ``gpus``), what it
    allows and what its namespace holds, in all (``model=""``) and per GPU model it limits;
    and ``gpuslice_quota_over`` = 1 for a quota its namespace holds more than (lowered)."""

    def __init__(self, quotas: Callable[[], Iterable[tuple[Quota, Charge]]]) -> None:
        self._quotas = quotas

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["namespace", "quota", "model", "resource"]
        limit = GaugeMetricFamily("gpuslice_quota_limit", "What a GPUQuota allows, per measure.", labels=labels)
        used = GaugeMetricFamily(
            "gpuslice_quota_used", "What a GPUQuota's namespace holds, per measure.", labels=labels
        )
        over = GaugeMetricFamily(
            "gpuslice_quota_over",
            "1 for a GPUQuota its namespace holds more than (it was lowered: running pods keep running).",
            labels=["namespace", "quota"],
        )
        for quota, held in self._quotas():
            scopes: list[tuple[str, Limits, Amount]] = [("", quota.limits, held.total)]
            scopes += [(m, lim, held.model(m)) for m, lim in quota.models]
            for model, limits, amount in scopes:
                for resource, allowed, value in (
                    ("gpu_memory_mib", limits.memory_mib, amount.memory_mib),
                    ("gpu_compute_milli", limits.compute_milli, amount.compute_milli),
                    ("gpus", limits.gpus, amount.gpus),
                ):
                    names = [quota.namespace, quota.name, model, resource]
                    used.add_metric(names, value)
                    if allowed is not None:
                        limit.add_metric(names, allowed)
            over.add_metric([quota.namespace, quota.name], 1.0 if over_quota(quota, held) else 0.0)
        yield limit
        yield used
        yield over
