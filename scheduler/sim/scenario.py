"""The scenario format (YAML): node groups, explicit pods and pod generators.

See ``simulations/README.md`` for the full format. In short::

    name: small
    replay: arrivals | timed      # default arrivals
    inflate: 0                    # arrivals: grow the workload to this x GPU capacity (0: as given)
    shuffle: true                 # arrivals: seeded shuffle of the pods
    nodes:
      - name: h100                # nodes h100-0, h100-1, ...
        count: 2
        cpu: 96                   # cores (or "96000m")
        memory: 1Ti               # Kubernetes quantity, or MiB as a bare integer
        max_pods: 110
        nvlink: all | none
        mps_compute_oversub_pct: 100
        ts_memory_oversub_pct: 100
        gpus: {model: H100-80GB, count: 8, mode: mig, mig: {allowed: [1g.10gb, 3g.40gb]}}
        #   mode mig, static geometry: mig: {instances: [3g.40gb, 2g.20gb, {profile: 1g.10gb, start: 6}]}
        #   mode mps: mps_clients: 48;  mode time-slicing: replicas: 4;  unknown model: memory: 24Gi
    pods:
      - {name: train, count: 2, cpu: 16, memory: 128Gi, gpu: {count: 4}, arrive: 0, duration: 7200}
    quotas:                       # GPU quotas per namespace, as a GPUQuota's limits
      - {namespace: team-a, gpuMemory: 320Gi, gpuCompute: 4, gpus: 2, models: {H100-80GB: {gpus: 1}}}
    workloads:
      - name: inference
        namespace: team-a         # pods and workloads: whose quota they count against (default: default)
        pods: 500
        rate: 0.05                # arrivals per second (Poisson); 0: all at start
        start: 0
        duration: {distribution: exponential, mean: 3600}   # or fixed / uniform {low, high}
        shapes:
          - {weight: 3, cpu: 4, memory: 16Gi, gpu: {fraction: 0.25}}
          - {weight: 1, cpu: 8, memory: 32Gi, gpu: {mig: 3g.40gb}}

A pod's ``gpu`` uses the same keys as the pod annotations (``fraction``, ``memory``,
``compute``, ``count``, ``mig``, ``sharing``, ``models``, ``nvlink``) and is parsed by the core's
request parser, so a scenario accepts exactly what the extender accepts. Every error
names the file, the line and the field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from scheduler.core import mig as mig_slots
from scheduler.core import modes
from scheduler.core.catalog import lookup_model
from scheduler.core.errors import QuotaError, RequestError
from scheduler.core.inventory import DEFAULT_MPS_CLIENTS, Device, MigInstance, Node, SharingMode
from scheduler.core.quantity import bytes_to_mib, cpu_milli, memory_mib
from scheduler.core.quota import Quota, parse_quota
from scheduler.core.request import DEFAULT_PREFIX, Demand, GpuRequest, parse_gpu_request

from .errors import TraceError
from .limits import MAX_INFLATE
from .model import REPLAY_MODES, Duration, Generator, Shape, SimPod, Trace

DURATIONS = ("fixed", "exponential", "uniform")
GPU_KEYS = {
    "fraction": "gpu-fraction",
    "memory": "gpu-memory",
    "compute": "gpu-compute",
    "count": "gpu-count",
    "mig": "mig-profile",
    "sharing": "sharing",
    "models": "gpu-model",
    "nvlink": "nvlink",
}


class _Map(dict[str, Any]):
    """A YAML mapping that remembers its line."""

    line = 0


class _Loader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> _Map:
    out = _Map({str(k): v for k, v in loader.construct_mapping(node, deep=True).items()})
    out.line = node.start_mark.line + 1
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


class _Reader:
    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, where: Mapping[str, Any] | None, field: str, problem: str) -> TraceError:
        line = getattr(where, "line", 0)
        return TraceError(self.path, f"line {line}" if line else "", f"{field}: {problem}")

    def mapping(self, value: object, where: Mapping[str, Any] | None, field: str) -> _Map:
        if value is None:
            return _Map()
        if not isinstance(value, Mapping):
            raise self.fail(where, field, f"expected a mapping, got {type(value).__name__}")
        return value if isinstance(value, _Map) else _Map(value)

    def seq(self, value: object, where: Mapping[str, Any], field: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(where, field, f"expected a list, got {type(value).__name__}")
        return value

    def known(self, raw: Mapping[str, Any], field: str, keys: set[str]) -> None:
        extra = sorted(str(k) for k in raw if k not in keys)
        if extra:
            raise self.fail(raw, f"{field}.{extra[0]}", f"unknown key (accepted: {', '.join(sorted(keys))})")

    def number(
        self, raw: Mapping[str, Any], key: str, field: str, default: float, low: float = 0, high: float = math.inf
    ) -> float:
        value = raw.get(key, default)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or not low <= value <= high
        ):
            bounds = f">= {low:g}" if math.isinf(high) else f"from {low:g} to {high:g}"
            raise self.fail(raw, f"{field}.{key}", f"{value!r} is not a number {bounds}")
        return float(value)

    def integer(self, raw: Mapping[str, Any], key: str, field: str, default: int, low: int = 0) -> int:
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise self.fail(raw, f"{field}.{key}", f"{value!r} is not a whole number >= {low}")
        return value

    def text(self, raw: Mapping[str, Any], key: str, field: str, default: str | None = None) -> str:
        value = raw.get(key, default)
        if not isinstance(value, str) or not value.strip():
            raise self.fail(raw, f"{field}.{key}", f"{value!r} is not a non-empty string")
        return value.strip()

    def cpu(self, raw: Mapping[str, Any], field: str, default: object) -> int:
        value = raw.get("cpu", default)
        try:
            result = cpu_milli(value)
        except ValueError:
            raise self.fail(raw, f"{field}.cpu", f"{value!r} is not a CPU quantity (cores, or like 500m)") from None
        if result < 0:
            raise self.fail(raw, f"{field}.cpu", f"{value!r} is negative")
        return result

    def memory(self, raw: Mapping[str, Any], key: str, field: str, default: object) -> int:
        value = raw.get(key, default)
        try:
            result = memory_mib(value) if isinstance(value, int) else bytes_to_mib(value)
        except ValueError:
            raise self.fail(
                raw, f"{field}.{key}", f"{value!r} is not a memory size (like 64Gi, or MiB as an integer)"
            ) from None
        if result < 0:
            raise self.fail(raw, f"{field}.{key}", f"{value!r} is negative")
        return result

    # ------------------------------------------------------------ nodes

    def nodes(self, raw: Mapping[str, Any]) -> tuple[Node, ...]:
        groups = self.seq(raw.get("nodes"), raw, "nodes")
        if not groups:
            raise self.fail(raw, "nodes", "at least one node group is needed")
        out: list[Node] = []
        seen: set[str] = set()
        for g, item in enumerate(groups):
            field = f"nodes[{g}]"
            group = self.mapping(item, raw, field)
            self.known(
                group,
                field,
                {
                    "name",
                    "count",
                    "cpu",
                    "memory",
                    "max_pods",
                    "gpus",
                    "nvlink",
                    "mps_compute_oversub_pct",
                    "ts_memory_oversub_pct",
                },
            )
            name = self.text(group, "name", field)
            count = self.integer(group, "count", field, 1, 1)
            cpu = self.cpu(group, field, 64)
            memory = self.memory(group, "memory", field, "256Gi")
            max_pods = self.integer(group, "max_pods", field, 110, 1)
            mps_oversub = self.integer(group, "mps_compute_oversub_pct", field, 100, 1)
            ts_oversub = self.integer(group, "ts_memory_oversub_pct", field, 100, 1)
            nvlink = group.get("nvlink", "none")
            if nvlink not in ("all", "none"):
                raise self.fail(group, f"{field}.nvlink", f"{nvlink!r} (accepted: all, none)")
            for k in range(count):
                node_name = f"{name}-{k}" if count > 1 else name
                if node_name in seen:
                    raise self.fail(group, f"{field}.name", f"node {node_name!r} is defined twice")
                seen.add(node_name)
                devices = self.devices(group.get("gpus"), group, f"{field}.gpus", node_name)
                links = (
                    frozenset((i, j) for i in range(len(devices)) for j in range(i + 1, len(devices)))
                    if nvlink == "all"
                    else frozenset()
                )
                out.append(Node(node_name, cpu, memory, devices, max_pods, links, mps_oversub, ts_oversub))
        return tuple(out)

    def devices(self, value: object, where: Mapping[str, Any], field: str, node: str) -> tuple[Device, ...]:
        if value is None:
            return ()
        raw = self.mapping(value, where, field)
        self.known(raw, field, {"model", "count", "mode", "memory", "mig", "mps_clients", "replicas"})
        count = self.integer(raw, "count", field, 1, 0)
        model_name = self.text(raw, "model", field)
        memory = self.memory(raw, "memory", field, None) if "memory" in raw else None
        try:
            model = lookup_model(model_name, memory)
        except ValueError as exc:
            raise self.fail(raw, f"{field}.model", f"{exc} (give gpus.memory)") from None
        found = modes.parse(str(raw.get("mode", "exclusive")).strip().lower())
        if found is None:
            raise self.fail(raw, f"{field}.mode", f"{raw.get('mode')!r} (accepted: {modes.accepted()})")
        mode = found
        clients = self.integer(raw, "mps_clients", field, DEFAULT_MPS_CLIENTS, 1)
        replicas = self.integer(raw, "replicas", field, 1, 1)
        instances: tuple[tuple[str, int | None], ...] = ()
        allowed: tuple[str, ...] = ()
        mig = _Map()
        if mode is SharingMode.MIG:
            if model.mig is None:
                raise self.fail(raw, f"{field}.mode", f"model {model.name} cannot do MIG")
            mig = self.mapping(raw.get("mig"), raw, f"{field}.mig")
            self.known(mig, f"{field}.mig", {"instances", "allowed"})
            for i, entry in enumerate(self.seq(mig.get("instances"), mig, f"{field}.mig.instances")):
                if isinstance(entry, str):
                    instances += ((entry, None),)
                else:
                    spec = self.mapping(entry, mig, f"{field}.mig.instances[{i}]")
                    start = spec.get("start")
                    if start is not None and (isinstance(start, bool) or not isinstance(start, int)):
                        raise self.fail(spec, f"{field}.mig.instances[{i}].start", f"{start!r} is not a slot")
                    instances += ((self.text(spec, "profile", f"{field}.mig.instances[{i}]"), start),)
            allowed = tuple(str(a) for a in self.seq(mig.get("allowed"), mig, f"{field}.mig.allowed"))
            for name in allowed:
                if model.mig.profile(name) is None:
                    raise self.fail(
                        mig,
                        f"{field}.mig.allowed",
                        f"{name!r} is not a MIG profile of {model.name} "
                        f"(accepted: {', '.join(p.name for p in model.mig.profiles)})",
                    )
        out = []
        for i in range(count):
            uuid = f"{node}-gpu{i}"
            placed = self.static_geometry(mig, field, model, instances, uuid) if instances else ()
            out.append(Device(uuid, i, model, mode, clients, replicas, placed, allowed))
        return tuple(out)

    def static_geometry(
        self, raw: Mapping[str, Any], field: str, model: Any, instances: tuple[tuple[str, int | None], ...], uuid: str
    ) -> tuple[MigInstance, ...]:
        """Instances with a given start first, then the others where they leave most room."""
        layout = model.mig
        used: tuple[Any, ...] = ()
        placed: list[MigInstance] = []
        order = sorted(range(len(instances)), key=lambda k: instances[k][1] is None)
        for k in order:
            name, start = instances[k]
            try:
                profile = layout.profile(name)
            except RequestError:
                profile = None
            if profile is None:
                raise self.fail(
                    raw,
                    f"{field}.mig.instances[{k}]",
                    f"{name!r} is not a MIG profile of {model.name} "
                    f"(accepted: {', '.join(p.name for p in layout.profiles)})",
                )
            slot = mig_slots.best_start(layout, used, profile) if start is None else start
            problem = "no legal slot left" if slot is None else mig_slots.why_not(layout, used, profile, slot)
            if problem is not None or slot is None:
                raise self.fail(raw, f"{field}.mig.instances[{k}]", f"{name}: {problem}")
            used = tuple(sorted((*used, mig_slots.slot_of(profile, slot))))
            placed.append(MigInstance(profile, slot, f"MIG-{uuid}-{profile.name}-{slot}"))
        return tuple(sorted(placed, key=lambda i: i.start))

    # ------------------------------------------------------------ pods

    def demand(self, raw: Mapping[str, Any], field: str) -> Demand:
        cpu = self.cpu(raw, field, 1)
        memory = self.memory(raw, "memory", field, "1Gi")
        gpu = GpuRequest()
        if raw.get("gpu") is not None:
            spec = self.mapping(raw.get("gpu"), raw, f"{field}.gpu")
            self.known(spec, f"{field}.gpu", set(GPU_KEYS))
            annotations: dict[str, object] = {}
            for key, value in spec.items():
                if key == "models" and isinstance(value, list):
                    value = "|".join(str(v) for v in value)
                annotations[DEFAULT_PREFIX + GPU_KEYS[key]] = value if isinstance(value, str) else str(value)
            try:
                gpu = parse_gpu_request(annotations)
            except RequestError as exc:
                key = next((k for k, v in GPU_KEYS.items() if exc.key.endswith(v)), exc.key)
                raise self.fail(
                    spec, f"{field}.gpu.{key}", f"invalid value {exc.value!r}; accepted: {exc.accepted}"
                ) from None
        return Demand(cpu, memory, gpu)

    def pods(self, raw: Mapping[str, Any]) -> tuple[SimPod, ...]:
        out: list[SimPod] = []
        names: set[str] = set()
        for i, item in enumerate(self.seq(raw.get("pods"), raw, "pods")):
            field = f"pods[{i}]"
            spec = self.mapping(item, raw, field)
            self.known(spec, field, {"name", "count", "cpu", "memory", "gpu", "arrive", "duration", "namespace"})
            name = self.text(spec, "name", field, f"pod-{i}")
            namespace = self.text(spec, "namespace", field, "default")
            count = self.integer(spec, "count", field, 1, 1)
            demand = self.demand(spec, field)
            arrive = self.number(spec, "arrive", field, 0.0)
            duration = self.number(spec, "duration", field, 0.0) if spec.get("duration") is not None else None
            for k in range(count):
                pod_name = f"{name}-{k}" if count > 1 else name
                if pod_name in names:
                    raise self.fail(spec, f"{field}.name", f"pod {pod_name!r} is defined twice")
                names.add(pod_name)
                deleted = None if duration is None else arrive + duration
                out.append(SimPod(pod_name, demand, arrive, deleted, namespace))
        return tuple(out)

    def generators(self, raw: Mapping[str, Any]) -> tuple[Generator, ...]:
        out = []
        for i, item in enumerate(self.seq(raw.get("workloads"), raw, "workloads")):
            field = f"workloads[{i}]"
            spec = self.mapping(item, raw, field)
            self.known(spec, field, {"name", "pods", "rate", "start", "duration", "shapes", "namespace"})
            shapes = []
            for j, entry in enumerate(self.seq(spec.get("shapes"), spec, f"{field}.shapes")):
                shape = self.mapping(entry, spec, f"{field}.shapes[{j}]")
                self.known(shape, f"{field}.shapes[{j}]", {"weight", "cpu", "memory", "gpu"})
                weight = self.number(shape, "weight", f"{field}.shapes[{j}]", 1.0)
                shapes.append(Shape(self.demand(shape, f"{field}.shapes[{j}]"), weight))
            if not shapes or sum(s.weight for s in shapes) <= 0:
                raise self.fail(spec, f"{field}.shapes", "at least one shape with a positive weight is needed")
            duration = None
            if spec.get("duration") is not None:
                d = spec["duration"]
                if isinstance(d, int | float) and not isinstance(d, bool):
                    duration = Duration("fixed", float(d))
                else:
                    dm = self.mapping(d, spec, f"{field}.duration")
                    self.known(dm, f"{field}.duration", {"distribution", "mean", "low", "high"})
                    kind = str(dm.get("distribution", "fixed"))
                    if kind not in DURATIONS:
                        raise self.fail(
                            dm, f"{field}.duration.distribution", f"{kind!r} (accepted: {', '.join(DURATIONS)})"
                        )
                    low = self.number(dm, "low", f"{field}.duration", 0.0)
                    high = self.number(dm, "high", f"{field}.duration", low)
                    if high < low:
                        raise self.fail(dm, f"{field}.duration.high", f"{high:g} is below low {low:g}")
                    duration = Duration(kind, self.number(dm, "mean", f"{field}.duration", 0.0), low, high)
            out.append(
                Generator(
                    self.text(spec, "name", field, f"workload-{i}"),
                    self.integer(spec, "pods", field, 1, 0),
                    tuple(shapes),
                    self.number(spec, "rate", field, 0.0),
                    self.number(spec, "start", field, 0.0),
                    duration,
                    self.text(spec, "namespace", field, "default"),
                )
            )
        return tuple(out)

    def quotas(self, raw: Mapping[str, Any]) -> tuple[Quota, ...]:
        """``quotas: [{namespace, name, gpuMemory, gpuCompute, gpus, models}]``: a GPUQuota's
        limits per namespace, read as the extender reads a GPUQuota object."""
        out: list[Quota] = []
        for i, item in enumerate(self.seq(raw.get("quotas"), raw, "quotas")):
            field = f"quotas[{i}]"
            spec = self.mapping(item, raw, field)
            self.known(spec, field, {"namespace", "name", "gpuMemory", "gpuCompute", "gpus", "models"})
            namespace = self.text(spec, "namespace", field, "default")
            name = self.text(spec, "name", field, "quota")
            limits = {k: v for k, v in spec.items() if k not in ("namespace", "name")}
            obj = {"metadata": {"name": name, "namespace": namespace}, "spec": {"limits": limits}}
            try:
                out.append(parse_quota(obj))
            except QuotaError as exc:  # "GPUQuota ns/name spec.limits.<path>: <problem>"
                where, _, problem = str(exc).split(" spec.limits.", 1)[-1].partition(": ")
                raise self.fail(spec, f"{field}.{where}", problem) from None
            if sum(q.namespace == namespace and q.name == name for q in out) > 1:
                raise self.fail(spec, f"{field}.name", f"quota {namespace}/{name} is defined twice")
        return tuple(out)


def parse(raw: object, path: str | Path, default_name: str | None = None) -> Trace:
    """A scenario from its parsed YAML document."""
    reader = _Reader(Path(path))
    doc = reader.mapping(raw, None, "scenario")
    reader.known(
        doc, "scenario", {"name", "description", "replay", "inflate", "shuffle", "nodes", "pods", "workloads", "quotas"}
    )
    replay = str(doc.get("replay", "arrivals"))
    if replay not in REPLAY_MODES:
        raise reader.fail(doc, "replay", f"{replay!r} (accepted: {', '.join(REPLAY_MODES)})")
    shuffle = doc.get("shuffle", True)
    if not isinstance(shuffle, bool):
        raise reader.fail(doc, "shuffle", f"{shuffle!r} (accepted: true, false)")
    nodes = reader.nodes(doc)
    pods = reader.pods(doc)
    generators = reader.generators(doc)
    if not pods and not any(g.count for g in generators):
        raise reader.fail(doc, "pods", "the scenario has no pods (give pods or workloads)")
    name = str(doc.get("name") or default_name or Path(path).stem)
    return Trace(
        name,
        nodes,
        pods,
        replay=replay,
        inflate=reader.number(doc, "inflate", "scenario", 0.0, high=MAX_INFLATE),
        shuffle=shuffle,
        source=str(path),
        generators=generators,
        quotas=reader.quotas(doc),
    )


def load_text(text: str, path: str | Path) -> Trace:
    try:
        raw = yaml.load(text, Loader=_Loader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        raise TraceError(path, where, f"is not valid YAML: {getattr(exc, 'problem', exc)}") from None
    return parse(raw, path)


def read_scenario(path: str | Path) -> Trace:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(path, "", f"cannot be read: {exc.strerror or exc}") from exc
    return load_text(text, path)
