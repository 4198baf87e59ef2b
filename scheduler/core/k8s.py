"""A Kubernetes Node (its JSON as a dict) to the core's :class:`Node`.

Inventory, in order of precedence:
1. the ``<prefix>inventory`` annotation (written by an agent or by hand), JSON:
   ``{"devices": [{"uuid", "index", "model", "memoryMiB", "smCount", "mode",
   "migInstances": [{"profile", "start", "uuid"}], "migProfiles": [...], "mpsClientLimit",
   "replicas", "nvlinkPeers": [...], "healthy", "unhealthyReason", "migTaken", "migManaged",
   "strayMemoryMiB"}],
   "mpsComputeOversubscriptionPct",
   "timeSlicingMemoryOversubscriptionPct"}`` (a bare list of devices is accepted too).
   ``healthy: false`` with ``unhealthyReason`` keeps new pods off a GPU; on a dynamic-MIG
   GPU ``migTaken`` lists instances made by hand (their slots are occupied) and
   ``migManaged`` those the node agent created for records; ``strayMemoryMiB`` is memory
   held by processes no record on the GPU accounts for (measured by the node agent).
   :func:`inventory_annotation` writes this form;
2. NVIDIA GPU feature discovery labels (``nvidia.com/gpu.product``, ``gpu.memory``,
   ``gpu.count``, ``gpu.sharing-strategy``, ``gpu.replicas``, ``mig.strategy`` and the
   ``nvidia.com/mig-<profile>.count`` family);
3. ``status.allocatable`` of ``nvidia.com/gpu`` and ``nvidia.com/mig-*``.
Label- and allocatable-derived devices have no UUIDs: they are named by index (``"0"``;
MIG instances ``"0:1"``), which ``NVIDIA_VISIBLE_DEVICES`` accepts as well.

The annotation is read strictly: a key not in :data:`INVENTORY_KEYS`, :data:`DEVICE_KEYS` or
:data:`MIG_INSTANCE_KEYS` (a misspelt ``"mdoe"``), a value of the wrong type, and an
impossible value (an NVLink peer the node does not have, MIG instances on a GPU not in MIG
mode) are errors (:class:`InventoryError`) naming the node, the device, the key and what is
accepted. A node is never served with defaults guessed around a mistake.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from typing import Any

from . import mig, modes
from .allocation import MigSlot
from .catalog import GpuModel, MigProfile, ProfileSpec, lookup_model
from .errors import InventoryError, RequestError
from .inventory import DEFAULT_MPS_CLIENTS, Device, MigInstance, Node, SharingMode
from .quantity import bytes_to_mib, cpu_milli
from .request import DEFAULT_PREFIX

DEFAULT_MAX_PODS = 110
UNKNOWN_MODEL = "UNKNOWN"
MAX_OVERSUB_PCT = 1000  # as the service's own default (ServeConfig)

# The inventory annotation's keys, per object, with what each accepts. Any other key is an
# error that lists these: add a key here when the parser learns it. The node agent writes
# every one of them (inventory_annotation).
INVENTORY_KEYS: dict[str, str] = {
    "devices": "a list of GPU objects",
    "mpsComputeOversubscriptionPct": f"a whole number from 100 to {MAX_OVERSUB_PCT}",
    "timeSlicingMemoryOversubscriptionPct": f"a whole number from 100 to {MAX_OVERSUB_PCT}",
}
DEVICE_KEYS: dict[str, str] = {
    "uuid": "a non-empty string (nvidia-smi -L), default the index",
    "index": "a whole number >= 0, default the position in the list",
    "model": "a GPU model name such as H100-80GB",
    "memoryMiB": "a whole number >= 1 (needed for a model gpuslice does not know)",
    "smCount": "a whole number >= 1",
    "mode": "exclusive (default), mps, time-slicing or mig",
    "migInstances": "a list of {profile, start, uuid} objects (a static MIG geometry, mode mig)",
    "migProfiles": "a list of MIG profile names gpuslice may create (mode mig)",
    "mpsClientLimit": "a whole number >= 1",
    "replicas": "a whole number >= 1 (time-slicing)",
    "nvlinkPeers": "a list of the indices of the node's other GPUs",
    "healthy": "true or false (default true): no new pod on an unhealthy GPU",
    "unhealthyReason": "a string, beside healthy: false",
    "migTaken": "a list of {profile, start, uuid} objects made by hand (dynamic MIG, mode mig)",
    "migManaged": "a list of {profile, start, uuid} objects the node agent made (dynamic MIG, mode mig)",
    "strayMemoryMiB": "a whole number >= 0: memory held by processes no record accounts for",
}
MIG_INSTANCE_KEYS: dict[str, str] = {
    "profile": "a MIG profile of the model, such as 3g.40gb",
    "start": "a whole number >= 0, the first memory slot",
    "uuid": "a string (MIG-..., from nvidia-smi -L)",
}
MIG_LISTS = ("migInstances", "migProfiles", "migTaken", "migManaged")


def _problem(node: str, what: str) -> InventoryError:
    return InventoryError(f"node {node}: {what}")


def _known(node: str, where: str, raw: Mapping[str, Any], keys: Mapping[str, str]) -> None:
    """Refuse a key of ``raw`` that is not one of ``keys``, naming the closest and all of them."""
    for key in raw:
        if key not in keys:
            near = difflib.get_close_matches(str(key), list(keys), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise _problem(node, f"{where}: unknown key {key!r}{hint}; accepted keys: {', '.join(keys)}")


def _int(
    node: str,
    raw: Mapping[str, Any],
    key: str,
    default: int | None = None,
    low: int = 0,
    high: int | None = None,
    where: str = "inventory",
) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        accepted = f"a whole number from {low} to {high}" if high is not None else f"a whole number >= {low}"
        raise _problem(node, f"{where}: key {key!r} must be {accepted}, got {value!r}")
    return value


def _list(node: str, where: str, raw: Mapping[str, Any], key: str, item: type, accepted: str) -> list[Any]:
    """``raw[key]`` as a list whose items are all ``item`` (absent or null: empty)."""
    value = raw.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, item) for v in value):
        raise _problem(node, f"{where}: key {key!r} must be {accepted}, got {value!r}")
    return value


def _model(node: str, name: object, memory: int | None, sms: int | None) -> GpuModel:
    if not isinstance(name, str) or not name.strip():
        name = UNKNOWN_MODEL
    try:
        return lookup_model(name, memory, sms)
    except ValueError as exc:
        raise _problem(node, str(exc)) from exc


def _profile(node: str, model: GpuModel, text: object) -> MigProfile:
    if model.mig is None:
        raise _problem(node, f"model {model.name} has no MIG layout, but MIG profile {text!r} is listed")
    try:
        spec = ProfileSpec.parse(str(text), "inventory MIG profile")
    except RequestError as exc:
        raise _problem(node, str(exc)) from exc
    profile = model.mig.match(spec)
    if profile is None:
        raise _problem(node, f"model {model.name} has no MIG profile {text!r}")
    return profile


def _check_static(node: str, device: Device, instances: tuple[MigInstance, ...]) -> None:
    layout = device.model.mig
    assert layout is not None
    used: tuple[MigSlot, ...] = ()
    for inst in sorted(instances, key=lambda i: i.start):
        problem = mig.why_not(layout, used, inst.profile, inst.start)
        if problem is not None:
            raise _problem(node, f"GPU {device.index}: MIG geometry is illegal: {problem}")
        used = (*used, mig.slot_of(inst.profile, inst.start))


def _instances(node: str, index: int, model: GpuModel, raw: Mapping[str, Any], key: str) -> tuple[MigInstance, ...]:
    """A device's list of MIG instances under ``key``: ``[{"profile", "start", "uuid"}]``."""
    where = f"inventory device {index}"
    out = []
    for k, inst in enumerate(_list(node, where, raw, key, dict, DEVICE_KEYS[key])):
        _known(node, f"{where}: {key}[{k}]", inst, MIG_INSTANCE_KEYS)
        profile = _profile(node, model, inst.get("profile"))
        out.append(
            MigInstance(profile, _int(node, inst, "start", where=f"{where}: {key}[{k}]"), str(inst.get("uuid") or ""))
        )
    return tuple(out)


def _health(node: str, index: int, raw: Mapping[str, Any]) -> tuple[bool, str]:
    """(healthy, unhealthy reason) from ``healthy`` and ``unhealthyReason``."""
    healthy = raw.get("healthy", True)
    reason = raw.get("unhealthyReason")
    if not isinstance(healthy, bool):
        raise _problem(node, f"device {index}: healthy must be true or false, got {healthy!r}")
    if reason is not None and (healthy or not isinstance(reason, str)):
        raise _problem(node, f"device {index}: unhealthyReason must be a string, and only beside healthy: false")
    return healthy, "" if healthy else (reason or "reported unhealthy")


def _from_annotation(
    name: str, text: object, defaults: tuple[int, int]
) -> tuple[list[Device], set[tuple[int, int]], tuple[int, int]]:
    try:
        body = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError) as exc:
        raise _problem(name, f"inventory annotation is not JSON: {exc}") from exc
    if isinstance(body, list):
        body = {"devices": body}
    if not isinstance(body, dict) or not isinstance(body.get("devices"), list):
        raise _problem(name, "inventory annotation must be an object with a 'devices' list, or a list")
    _known(name, "inventory", body, INVENTORY_KEYS)
    devices: list[Device] = []
    peers: dict[int, list[int]] = {}
    for position, raw in enumerate(body["devices"]):
        where = f"inventory device {position}"
        if not isinstance(raw, dict):
            raise _problem(name, f"{where} must be an object with the keys {', '.join(DEVICE_KEYS)}")
        _known(name, where, raw, DEVICE_KEYS)
        index = _int(name, raw, "index", position, where=where)
        where = f"inventory device {index}"
        memory = raw.get("memoryMiB")
        if "model" in raw and (not isinstance(raw["model"], str) or not raw["model"].strip()):
            raise _problem(name, f"{where}: key 'model' must be {DEVICE_KEYS['model']}, got {raw['model']!r}")
        model = _model(
            name,
            raw.get("model"),
            _int(name, raw, "memoryMiB", low=1, where=where) if memory is not None else None,
            _int(name, raw, "smCount", low=1, where=where) if raw.get("smCount") is not None else None,
        )
        given = raw.get("mode", "exclusive")
        found = modes.parse(given) if isinstance(given, str) else None
        if found is None:
            accepted = [str(m.name) for m in modes.registered()]
            raise _problem(name, f"device {index}: mode must be one of {accepted}, got {raw.get('mode')!r}")
        mode = found
        if model.memory_mib <= 0:
            raise _problem(name, f"device {index}: model {model.name} needs memoryMiB")
        profiles = _list(name, where, raw, "migProfiles", str, DEVICE_KEYS["migProfiles"])
        described = next((key for key in MIG_LISTS if raw.get(key)), None)
        if described is not None and mode is not SharingMode.MIG:
            raise _problem(
                name,
                f"{where}: key {described!r} describes MIG, but the GPU's mode is {mode.value!r}; accepted: mode 'mig'",
            )
        instances: tuple[MigInstance, ...] = ()
        taken: tuple[MigInstance, ...] = ()
        managed: tuple[MigInstance, ...] = ()
        allowed: tuple[str, ...] = ()
        if mode is SharingMode.MIG:
            instances = _instances(name, index, model, raw, "migInstances")
            taken = _instances(name, index, model, raw, "migTaken")
            managed = _instances(name, index, model, raw, "migManaged")
            if instances and (taken or managed):
                raise _problem(
                    name,
                    f"device {index}: migTaken and migManaged describe dynamic MIG; a static geometry "
                    "lists every instance in migInstances",
                )
            allowed = tuple(_profile(name, model, p).name for p in profiles)
            if model.mig is None:
                raise _problem(name, f"device {index}: model {model.name} cannot run MIG")
        uuid = raw.get("uuid", str(index))
        if not isinstance(uuid, str) or not uuid:
            raise _problem(name, f"{where}: key 'uuid' must be {DEVICE_KEYS['uuid']}, got {uuid!r}")
        healthy, reason = _health(name, index, raw)
        device = Device(
            uuid,
            index,
            model,
            mode,
            _int(name, raw, "mpsClientLimit", DEFAULT_MPS_CLIENTS, 1, where=where),
            _int(name, raw, "replicas", 1, 1, where=where),
            instances,
            allowed,
            healthy,
            reason,
            taken,
            managed,
            _int(name, raw, "strayMemoryMiB", 0, where=where),
        )
        if instances:
            _check_static(name, device, device.mig_instances)
        if taken:
            _check_static(name, device, device.mig_taken)
        devices.append(device)
        peers[index] = _list(name, where, raw, "nvlinkPeers", int, DEVICE_KEYS["nvlinkPeers"])
    oversubscription = (
        _int(name, body, "mpsComputeOversubscriptionPct", defaults[0], 100, MAX_OVERSUB_PCT),
        _int(name, body, "timeSlicingMemoryOversubscriptionPct", defaults[1], 100, MAX_OVERSUB_PCT),
    )
    return devices, _links(name, peers, devices), oversubscription


def _links(name: str, peers: Mapping[int, list[int]], devices: list[Device]) -> set[tuple[int, int]]:
    """The NVLink pairs, each peer checked against the node's GPUs; two GPUs sharing a uuid refused."""
    indices = sorted(peers)
    uuids: dict[str, int] = {}
    for device in devices:
        if device.uuid in uuids:
            raise _problem(
                name, f"inventory devices {uuids[device.uuid]} and {device.index} have the same uuid {device.uuid!r}"
            )
        uuids[device.uuid] = device.index
    links: set[tuple[int, int]] = set()
    for index, listed in peers.items():
        for peer in listed:
            if peer == index or peer not in peers:
                what = "the GPU itself" if peer == index else "a GPU the node does not have"
                raise _problem(
                    name,
                    f"inventory device {index}: key 'nvlinkPeers' names {peer}, {what}; accepted: the indices of "
                    f"the node's other GPUs ({', '.join(str(i) for i in indices if i != index) or 'none'})",
                )
            links.add((min(index, peer), max(index, peer)))
    return links


def _static_layout(name: str, model: GpuModel, count: int, profiles: dict[str, int]) -> list[list[MigInstance]]:
    """Spread labelled MIG instance counts over ``count`` GPUs: largest profiles first, each
    on the GPU with the most free compute slices (the labels do not say which GPU holds what)."""
    per_gpu: list[list[MigInstance]] = [[] for _ in range(count)]
    used: list[tuple[MigSlot, ...]] = [() for _ in range(count)]
    wanted = sorted(
        ((_profile(name, model, p), n) for p, n in profiles.items()),
        key=lambda pn: (-pn[0].memory_slots, -pn[0].compute_slices),
    )
    layout = model.mig
    assert layout is not None
    for profile, n in wanted:
        for _ in range(n):
            for g in sorted(range(count), key=lambda g: (sum(s.slices for s in used[g]), g)):
                start = mig.best_start(layout, used[g], profile)
                if start is not None:
                    used[g] = (*used[g], mig.slot_of(profile, start))
                    per_gpu[g].append(MigInstance(profile, start, f"{g}:{len(per_gpu[g])}"))
                    break
            else:
                raise _problem(name, f"{n} x {profile.name} do not fit on {count} {model.name} GPUs")
    return per_gpu


_MIG_PRODUCT = "-MIG-"


def _single_strategy(
    name: str, labels: Mapping[str, str], count: int | None, allocatable: object
) -> list[Device] | None:
    """GPU Feature Discovery's MIG ``single`` strategy presents every MIG instance as a GPU: the
    product label is ``<GPU>-MIG-<profile>``, ``gpu.count`` and ``nvidia.com/gpu`` count the
    instances, ``gpu.memory`` is one instance's. Those are MIG slices, not whole GPUs: they are
    read as static MIG GPUs of that geometry (the fewest GPUs that hold them), so a request for
    whole GPUs never lands on them. None when the node is not labelled so."""
    product = labels.get("nvidia.com/gpu.product")
    text = product if isinstance(product, str) else ""
    if _MIG_PRODUCT not in text:
        if labels.get("nvidia.com/mig.strategy") == "single" and text:
            raise _problem(
                name,
                f"label nvidia.com/mig.strategy is single, but nvidia.com/gpu.product {text!r} names no "
                "MIG profile (<GPU>-MIG-<profile>, as GPU Feature Discovery writes it)",
            )
        return None
    base, _, profile_text = text.rpartition(_MIG_PRODUCT)
    model = _model(name, base, None, None)
    profile = _profile(name, model, profile_text)
    slices = count
    if slices is None and allocatable is not None:
        if not str(allocatable).isdigit():
            raise _problem(name, f"allocatable nvidia.com/gpu must be a whole number, got {allocatable!r}")
        slices = int(str(allocatable))
    if not slices:
        return []
    gpus = -(-slices // profile.max_count)
    per_gpu = _static_layout(name, model, gpus, {profile.name: slices})
    return [
        Device(str(g), g, model, SharingMode.MIG, mig_instances=tuple(per_gpu[g])) for g in range(gpus) if per_gpu[g]
    ]


def _from_labels(name: str, labels: Mapping[str, str], allocatable: Mapping[str, Any]) -> list[Device]:
    def label_int(key: str) -> int | None:
        value = labels.get(key)
        if value is None:
            return None
        if not str(value).strip().isdigit():
            raise _problem(name, f"label {key} must be a whole number, got {value!r}")
        return int(value)

    memory = label_int("nvidia.com/gpu.memory")
    product = labels.get("nvidia.com/gpu.product")
    single = _single_strategy(name, labels, label_int("nvidia.com/gpu.count"), allocatable.get("nvidia.com/gpu"))
    if single is not None:
        return single
    model = _model(name, product, memory, None) if product or memory else None
    count = label_int("nvidia.com/gpu.count")
    mig_counts: dict[str, int] = {}
    for key, value in list(labels.items()) + [(k, v) for k, v in allocatable.items()]:
        if key.startswith("nvidia.com/mig-"):
            profile = key.removeprefix("nvidia.com/mig-").removesuffix(".count")
            if key.endswith((".count",)) or key in allocatable:
                if any(
                    key.endswith(s)
                    for s in (
                        ".memory",
                        ".product",
                        ".engines.copy",
                        ".engines.decoder",
                        ".engines.encoder",
                        ".engines.jpeg",
                        ".engines.ofa",
                        ".multiprocessors",
                        ".replicas",
                        ".slices.ci",
                        ".slices.gi",
                    )
                ):
                    continue
                n = int(str(value)) if str(value).isdigit() else None
                if n is None:
                    raise _problem(name, f"{key} must be a whole number, got {value!r}")
                mig_counts[profile] = max(mig_counts.get(profile, 0), n)
    gpus_alloc = allocatable.get("nvidia.com/gpu")
    counted_from_allocatable = count is None and gpus_alloc is not None
    if count is None and gpus_alloc is not None:
        if not str(gpus_alloc).isdigit():
            raise _problem(name, f"allocatable nvidia.com/gpu must be a whole number, got {gpus_alloc!r}")
        count = int(str(gpus_alloc))
    if model is None:
        model = _model(name, UNKNOWN_MODEL, 1, None)
    if mig_counts:
        if model.mig is None:
            raise _problem(
                name,
                f"MIG instances are advertised but model {model.name} has no MIG layout "
                "(label nvidia.com/gpu.product must name a MIG-capable model)",
            )
        gpus = max(1, count or 1)
        per_gpu = _static_layout(name, model, gpus, {p: n for p, n in mig_counts.items() if n})
        return [
            Device(str(g), g, model, SharingMode.MIG, mig_instances=tuple(per_gpu[g]))
            for g in range(gpus)
            if per_gpu[g]
        ]
    strategy = labels.get("nvidia.com/gpu.sharing-strategy", "none")
    replicas = label_int("nvidia.com/gpu.replicas") or 1
    if strategy not in ("none", "mps", "time-slicing"):
        raise _problem(
            name, f"label nvidia.com/gpu.sharing-strategy must be none, mps or time-slicing, got {strategy!r}"
        )
    mode = {"none": SharingMode.EXCLUSIVE, "mps": SharingMode.MPS, "time-slicing": SharingMode.TIME_SLICING}[strategy]
    if counted_from_allocatable and count and mode is not SharingMode.EXCLUSIVE and replicas > 1:
        # Under the device plugin's sharing, allocatable counts replicas (GPUs x replicas): 8 GPUs
        # of 4 replicas advertise 32. Without a gpu.count label that is all there is to go on.
        if count % replicas:
            raise _problem(
                name,
                f"allocatable nvidia.com/gpu {count} is not a multiple of label nvidia.com/gpu.replicas "
                f"{replicas}: under {strategy} the device plugin advertises GPUs x replicas; "
                "label nvidia.com/gpu.count says how many GPUs",
            )
        count //= replicas
    return [
        Device(
            str(i),
            i,
            model,
            mode,
            mps_client_limit=max(replicas, DEFAULT_MPS_CLIENTS) if mode is SharingMode.MPS else DEFAULT_MPS_CLIENTS,
            replicas=replicas,
        )
        for i in range(count or 0)
    ]


def parse_node(
    node: Mapping[str, Any], prefix: str = DEFAULT_PREFIX, oversubscription: tuple[int, int] = (100, 100)
) -> Node:
    """The core's view of a Kubernetes Node; :class:`InventoryError` names the node and the field.

    ``oversubscription`` is the (MPS compute, time-slicing memory) oversubscription in percent
    for a node whose inventory sets none.
    """
    if not isinstance(node, Mapping):
        raise InventoryError("node must be a JSON object")
    meta = node.get("metadata") or {}
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name:
        raise InventoryError("node has no metadata.name")
    status = node.get("status") or {}
    allocatable = status.get("allocatable") or {} if isinstance(status, Mapping) else {}
    if not isinstance(allocatable, Mapping):
        raise _problem(name, "status.allocatable must be an object")
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    if not isinstance(annotations, Mapping) or not isinstance(labels, Mapping):
        raise _problem(name, "metadata.labels and metadata.annotations must be objects")
    try:
        cpu = cpu_milli(allocatable.get("cpu", 0))
        memory = bytes_to_mib(allocatable.get("memory", 0))
        pods = int(str(allocatable.get("pods", DEFAULT_MAX_PODS)))
    except ValueError as exc:
        raise _problem(name, f"status.allocatable has a malformed quantity: {exc}") from exc
    links: set[tuple[int, int]] = set()
    options = oversubscription
    if prefix + "inventory" in annotations:
        devices, links, options = _from_annotation(name, annotations[prefix + "inventory"], oversubscription)
    else:
        devices = _from_labels(name, labels, allocatable)
    indices = [d.index for d in devices]
    if sorted(indices) != list(range(len(devices))):
        raise _problem(name, f"GPU indices must be 0..{len(devices) - 1} without gaps, got {sorted(indices)}")
    devices.sort(key=lambda d: d.index)
    return Node(name, cpu, memory, tuple(devices), pods, frozenset(links), options[0], options[1])


def _instance_json(instances: tuple[MigInstance, ...]) -> list[dict[str, Any]]:
    return [{"profile": i.profile.name, "start": i.start, "uuid": i.uuid} for i in instances]


def inventory_annotation(node: Node) -> str:
    """The ``<prefix>inventory`` annotation of ``node``'s GPUs, which :func:`parse_node` reads
    back to the same devices, NVLink and oversubscription (the node agent writes it)."""
    devices = []
    for d in node.devices:
        raw: dict[str, Any] = {
            "uuid": d.uuid,
            "index": d.index,
            "model": d.model.name,
            "memoryMiB": d.model.memory_mib,
            "smCount": d.model.sm_count,
            "mode": d.mode.value,
            "mpsClientLimit": d.mps_client_limit,
            "replicas": d.replicas,
            "nvlinkPeers": sorted({b if a == d.index else a for a, b in node.nvlink if d.index in (a, b)}),
            "healthy": d.healthy,
        }
        if not d.healthy:
            raw["unhealthyReason"] = d.unhealthy_reason
        if d.stray_memory_mib:
            raw["strayMemoryMiB"] = d.stray_memory_mib
        if d.mode is SharingMode.MIG:
            raw["migInstances"] = _instance_json(d.mig_instances)
            raw["migProfiles"] = list(d.mig_allowed)
            raw["migTaken"] = _instance_json(d.mig_taken)
            raw["migManaged"] = _instance_json(d.mig_managed)
        devices.append(raw)
    body = {
        "devices": devices,
        "mpsComputeOversubscriptionPct": node.mps_compute_oversub_pct,
        "timeSlicingMemoryOversubscriptionPct": node.ts_memory_oversub_pct,
    }
    return json.dumps(body, separators=(",", ":"), sort_keys=True)
