"""Readers for the Alibaba ``openb`` trace (cluster-trace-gpu-v2023, the FGD paper's data).

Node list: ``sn,cpu_milli,memory_mib,gpu,model``. Pod list:
``name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,qos,pod_phase,creation_time,deletion_time,...]``
(the ``multigpu*`` files stop after ``gpu_milli``).

How the trace maps onto the core. ``gpu_milli`` is a share of one GPU's memory *and*
compute, so every GPU becomes an MPS device whose client limit never binds (the finest
share in the trace is 50 milli-GPU, 20 per GPU; the limit is 1000):

* ``num_gpu == 0``                  -> no GPU
* ``gpu_milli < 1000``              -> ``GpuRequest(SHARE, num_gpu, fraction_milli=gpu_milli)``
* ``gpu_milli == 1000``             -> ``GpuRequest(WHOLE, num_gpu)``
* ``gpu_spec`` (``|``-separated)    -> the allowed models

The undisclosed models G1, G2 and G3 get an assumed memory size: a fraction takes that
fraction of the memory and of the compute, so memory never binds before compute and its
absolute size does not change any placement.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator, Mapping
from pathlib import Path

from scheduler.core.catalog import CATALOG, canonical_model_name, lookup_model
from scheduler.core.inventory import Device, Node, SharingMode
from scheduler.core.request import MILLI, Demand, GpuKind, GpuRequest

from .errors import TraceError
from .model import ARRIVALS, SimPod, Trace

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
ASSUMED_MEMORY_MIB = 16384  # for models the catalogue does not know (G1, G2, G3)
MPS_CLIENTS = 1000  # never binds: at least 50 milli-GPU per pod
MAX_PODS = 1001  # the authors' per-node pod limit; never binds either
DEFAULT_INFLATE = 1.3
NODE_LIST_NAME = "openb_node_list_gpu_node.csv"


def _rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, Mapping[str, str]]]:
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise TraceError(path, "", f"cannot be read: {exc.strerror or exc}") from exc
    with handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames or []
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceError(
                path, "header", f"missing column(s) {', '.join(missing)}; expected at least: {','.join(required)}"
            )
        try:
            for i, row in enumerate(reader, start=1):
                if None in row or any(row.get(c) is None for c in required):
                    raise TraceError(
                        path, f"row {i}", f"has {len(header)} columns in the header but a different number in this row"
                    )
                yield i, row
        except csv.Error as exc:
            raise TraceError(path, f"line {reader.line_num}", f"is not valid CSV: {exc}") from exc


def _int(path: Path, row: int, field: str, text: str, low: int = 0, high: int | None = None) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise TraceError(path, f"row {row}", f"{field} {text!r} is not an integer") from None
    if value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f">= {low}"
        raise TraceError(path, f"row {row}", f"{field} {value} is out of range (accepted: {bound})")
    return value


def _time(path: Path, row: int, field: str, text: str | None) -> float | None:
    if text is None or not text.strip():
        return None
    try:
        value = float(text)
    except ValueError:
        raise TraceError(path, f"row {row}", f"{field} {text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise TraceError(path, f"row {row}", f"{field} {text!r} is not a non-negative number of seconds")
    return value


def read_nodes(path: str | Path) -> tuple[Node, ...]:
    """The cluster of an openb node list (GPU-less rows become CPU-only nodes)."""
    path = Path(path)
    nodes: list[Node] = []
    seen: set[str] = set()
    for i, row in _rows(path, NODE_COLUMNS):
        name = row["sn"].strip()
        if not name:
            raise TraceError(path, f"row {i}", "sn is empty (accepted: a node name)")
        if name in seen:
            raise TraceError(path, f"row {i}", f"sn {name!r} appears twice")
        seen.add(name)
        cpu = _int(path, i, "cpu_milli", row["cpu_milli"], 1)
        memory = _int(path, i, "memory_mib", row["memory_mib"], 0)
        count = _int(path, i, "gpu", row["gpu"], 0, 64)
        model_name = row["model"].strip()
        devices: tuple[Device, ...] = ()
        if count:
            if not model_name:
                raise TraceError(path, f"row {i}", f"model is empty but gpu is {count} (accepted: a GPU model)")
            known = canonical_model_name(model_name) in CATALOG
            model = lookup_model(model_name, None if known else ASSUMED_MEMORY_MIB)
            devices = tuple(
                Device(f"{name}-gpu{g}", g, model, SharingMode.MPS, mps_client_limit=MPS_CLIENTS) for g in range(count)
            )
        nodes.append(Node(name, cpu, memory, devices, max_pods=MAX_PODS))
    if not nodes:
        raise TraceError(path, "", "has no nodes")
    return tuple(nodes)


def pod_demand(path: Path, row: int, fields: Mapping[str, str | None]) -> Demand:
    cpu = _int(path, row, "cpu_milli", fields["cpu_milli"] or "", 0)
    memory = _int(path, row, "memory_mib", fields["memory_mib"] or "", 0)
    count = _int(path, row, "num_gpu", fields["num_gpu"] or "", 0, 64)
    milli = _int(path, row, "gpu_milli", fields["gpu_milli"] or "", 0, MILLI)
    spec = (fields.get("gpu_spec") or "").strip()
    models = tuple(dict.fromkeys(canonical_model_name(m) for m in spec.split("|") if m.strip()))
    if count == 0:
        if milli:
            raise TraceError(
                path, f"row {row}", f"gpu_milli {milli} with num_gpu 0 (accepted: gpu_milli 0 for a pod without GPUs)"
            )
        return Demand(cpu, memory, GpuRequest())
    if milli == 0:
        raise TraceError(path, f"row {row}", f"gpu_milli 0 with num_gpu {count} (accepted: 1 to 1000 per GPU)")
    if milli == MILLI:
        return Demand(cpu, memory, GpuRequest(GpuKind.WHOLE, count, models=models))
    return Demand(cpu, memory, GpuRequest(GpuKind.SHARE, count, fraction_milli=milli, models=models))


def read_pods(path: str | Path) -> tuple[SimPod, ...]:
    path = Path(path)
    pods: list[SimPod] = []
    names: set[str] = set()
    # Equal requests share one Demand: a trace's 8,000 pods have about 150 shapes, and a trace
    # shipped to sweep workers then pickles to two thirds of the bytes in half the time.
    shapes: dict[Demand, Demand] = {}
    for i, row in _rows(path, POD_COLUMNS):
        name = (row["name"] or "").strip() or f"pod-{i}"
        if name in names:
            raise TraceError(path, f"row {i}", f"name {name!r} appears twice (accepted: unique pod names)")
        names.add(name)
        demand = pod_demand(path, i, row)
        demand = shapes.setdefault(demand, demand)
        created = _time(path, i, "creation_time", row.get("creation_time"))
        deleted = _time(path, i, "deletion_time", row.get("deletion_time"))
        if created is not None and deleted is not None and deleted < created:
            raise TraceError(path, f"row {i}", f"deletion_time {deleted:g} is before creation_time {created:g}")
        pods.append(SimPod(name, demand, created, deleted))
    if not pods:
        raise TraceError(path, "", "has no pods")
    return tuple(pods)


def default_node_list(pod_list: Path) -> Path:
    return pod_list.with_name(NODE_LIST_NAME)


def read_trace(pod_list: str | Path, node_list: str | Path | None = None) -> Trace:
    """An openb pod list on its node list (by default the GPU node list beside it)."""
    pods_path = Path(pod_list)
    nodes_path = Path(node_list) if node_list is not None else default_node_list(pods_path)
    if not nodes_path.exists():
        raise TraceError(
            pods_path, "", f"needs a node list: {nodes_path.name} was not found beside it (give one with --nodes)"
        )
    nodes = read_nodes(nodes_path)
    pods = read_pods(pods_path)
    name = pods_path.stem.removeprefix("openb_pod_list_")
    return Trace(name, nodes, pods, replay=ARRIVALS, inflate=DEFAULT_INFLATE, shuffle=True, source=str(pods_path))
