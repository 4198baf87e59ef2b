"""GPU quotas per namespace: what a placement holds, what a ``GPUQuota`` allows, and whether
one more placement stays within it.

What an allocation holds is read from its record alone (the same values the capacity model
counts), per GPU it takes:

* GPU memory: the share's ``memory_mib``. A fraction holds its part of the GPU's memory, an
  MPS share its memory cap, a MIG instance its profile's memory, a whole GPU all of it.
* GPU compute, in milli-GPU (half a GPU is 500): the share's ``compute_milli``. A fraction
  holds its fraction, an MPS share its thread percentage, a MIG instance its compute slices
  out of the layout's (3g of 7: 3 x 1000 // 7 = 428), a whole GPU 1000.
* whole GPUs: 1 for a share that holds all of a GPU's compute (1000 milli): a whole exclusive
  GPU, a whole GPU of a shared GPU, a MIG instance of every slice. Anything less counts 0.

A time-slicing replica counts the memory and compute the pod asked for, as recorded: its
memory is really set aside on the GPU, and its compute is the share it was promised, even
though time-slicing interleaves compute rather than dividing it. Counting a replica as
``1 / replicas`` of the GPU instead would charge a namespace for the operator's replica
setting rather than for what its pods asked, and would differ between two GPUs serving the
same pod. NVLink multi-GPU placements count each of their GPUs (the link is free).

Per GPU model, the same three measures count the shares on GPUs of that model only. A
namespace may have several quotas; a placement must stay within every one of them. A
limit not given does not limit. Quotas never evict: :func:`over_quota` only reports a
namespace that holds more than a (lowered) quota allows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from .allocation import Allocation
from .capacity import Refusal
from .errors import QuotaError
from .fit import device_share
from .inventory import Node
from .quantity import parse_quantity
from .request import MILLI, GpuKind, GpuRequest
from .state import taken_usage

KIND = "GPUQuota"
GROUP = "gpuslice.io"
VERSION = "v1alpha1"
MEMORY_FORMS = "a Kubernetes memory quantity such as 320Gi, 40960Mi or 80G"
COMPUTE_FORMS = "a number of GPUs' worth of compute such as 4, 0.5 or 2500m"
GPUS_FORMS = "a whole number of GPUs >= 0"


@dataclass(frozen=True, slots=True)
class Amount:
    """GPU memory (MiB), GPU compute (milli-GPU) and whole GPUs held."""

    memory_mib: int = 0
    compute_milli: int = 0
    gpus: int = 0

    def __add__(self, other: Amount) -> Amount:
        return Amount(
            self.memory_mib + other.memory_mib, self.compute_milli + other.compute_milli, self.gpus + other.gpus
        )

    def __sub__(self, other: Amount) -> Amount:
        return Amount(
            self.memory_mib - other.memory_mib, self.compute_milli - other.compute_milli, self.gpus - other.gpus
        )

    def __bool__(self) -> bool:
        return bool(self.memory_mib or self.compute_milli or self.gpus)


ZERO = Amount()


@dataclass(frozen=True, slots=True)
class Charge:
    """What one or more placements hold: in all, and per GPU model (sorted by model name)."""

    total: Amount = ZERO
    models: tuple[tuple[str, Amount], ...] = ()

    def model(self, name: str) -> Amount:
        return next((a for m, a in self.models if m == name), ZERO)

    def __add__(self, other: Charge) -> Charge:
        merged = dict(self.models)
        for name, amount in other.models:
            merged[name] = merged.get(name, ZERO) + amount
        return Charge(self.total + other.total, tuple(sorted(merged.items())))

    def __sub__(self, other: Charge) -> Charge:
        merged = dict(self.models)
        for name, amount in other.models:
            merged[name] = merged.get(name, ZERO) - amount
        return Charge(self.total - other.total, tuple(sorted((m, a) for m, a in merged.items() if a)))


NOTHING = Charge()
UNKNOWN_MODEL = "unknown"


def charge(alloc: Allocation, node: Node | None) -> Charge:
    """What ``alloc`` holds on ``node`` (the node names each GPU's model; a GPU of a node not
    known, or not known yet, counts under the model ``unknown``)."""
    total = ZERO
    models: dict[str, Amount] = {}
    for share in alloc.shares:
        amount = Amount(share.memory_mib, share.compute_milli, 1 if share.compute_milli >= MILLI else 0)
        total += amount
        known = node is not None and 0 <= share.index < len(node.devices)
        model = node.devices[share.index].model.name if node is not None and known else UNKNOWN_MODEL
        models[model] = models.get(model, ZERO) + amount
    return Charge(total, tuple(sorted(models.items())))


def namespace_of(pod: str) -> str:
    """The namespace of a pod key ``namespace/name``."""
    return pod.partition("/")[0]


def use_by_namespace(placed: Iterable[tuple[str, Allocation, Node]]) -> dict[str, Charge]:
    """What each namespace holds, from ``(pod key, allocation, node)`` triples."""
    out: dict[str, Charge] = {}
    for pod, alloc, node in placed:
        ns = namespace_of(pod)
        out[ns] = out.get(ns, NOTHING) + charge(alloc, node)
    return out


_LEAST: dict[tuple[GpuRequest, int], Charge | None] = {}
_LEAST_LIMIT = 1 << 14


def least_charge(gpu: GpuRequest, node: Node) -> Charge | None:
    """A lower bound, measure by measure, of what ``gpu`` holds wherever it lands on ``node``
    (None where no GPU of the node could ever take it): the least share any of its GPUs would
    give, times the GPUs asked. Filter refuses a node for a quota only when even this goes
    over, so no pod is refused for a quota it would fit; bind charges the exact allocation.
    Per model only where every GPU that could take it is of one model."""
    key = (gpu, node.kind)
    found = _LEAST.get(key, False)
    if found is not False:
        assert found is None or isinstance(found, Charge)
        return found
    least: Amount | None = None
    models = set()
    for device in node.devices:
        if not (gpu.allows_model(device.model.name) and gpu.allows_mode(device.mode)):
            continue
        share = device_share(gpu, node, device, taken_usage(device))
        if isinstance(share, Refusal):
            continue
        whole = 1 if share.compute_milli >= MILLI else 0
        models.add(device.model.name)
        if least is None:
            least = Amount(share.memory_mib, share.compute_milli, whole)
        else:
            least = Amount(
                min(least.memory_mib, share.memory_mib),
                min(least.compute_milli, share.compute_milli),
                min(least.gpus, whole),
            )
    result = None
    if least is not None:
        count = max(1, gpu.count) if gpu.kind is not GpuKind.MIG else 1
        total = Amount(least.memory_mib * count, least.compute_milli * count, least.gpus * count)
        result = Charge(total, ((models.pop(), total),) if len(models) == 1 else ())
    if len(_LEAST) > _LEAST_LIMIT:
        _LEAST.clear()
    _LEAST[key] = result
    return result


# ---------------------------------------------------------------- limits


@dataclass(frozen=True, slots=True)
class Limits:
    """What a quota allows; None: that measure is not limited."""

    memory_mib: int | None = None
    compute_milli: int | None = None
    gpus: int | None = None

    def excess(self, used: Amount, adding: Amount | None = None) -> str | None:
        """The first measure ``used`` goes over, as ``"<field> allows X"``; None if within.
        With ``adding``, only the measures it adds to are asked: a pod is not held back by a
        limit it takes nothing of (a fraction by the whole-GPU count of a lowered quota)."""
        grows = used if adding is None else adding
        if self.memory_mib is not None and grows.memory_mib > 0 and used.memory_mib > self.memory_mib:
            return f"gpuMemory allows {self.memory_mib} MiB"
        if self.compute_milli is not None and grows.compute_milli > 0 and used.compute_milli > self.compute_milli:
            return f"gpuCompute allows {_gpus_text(self.compute_milli)} GPUs"
        if self.gpus is not None and grows.gpus > 0 and used.gpus > self.gpus:
            return f"gpus allows {self.gpus}"
        return None

    def describe(self) -> str:
        """What these limits allow, such as ``gpuMemory 81920 MiB, gpus 1`` (the limits given)."""
        parts = []
        if self.memory_mib is not None:
            parts.append(f"gpuMemory {self.memory_mib} MiB")
        if self.compute_milli is not None:
            parts.append(f"gpuCompute {_gpus_text(self.compute_milli)} GPUs")
        if self.gpus is not None:
            parts.append(f"gpus {self.gpus}")
        return ", ".join(parts) or "anything"


def _gpus_text(milli: int) -> str:
    return f"{milli / MILLI:g}"


def used_text(used: Amount) -> str:
    return f"(used: {used.memory_mib} MiB, {_gpus_text(used.compute_milli)} GPUs of compute, {used.gpus} whole GPUs)"


@dataclass(frozen=True, slots=True)
class Quota:
    namespace: str
    name: str
    limits: Limits = Limits()
    models: tuple[tuple[str, Limits], ...] = ()

    def exceeded(self, used: Charge, adding: Charge | None = None) -> tuple[str, str | None] | None:
        """The first limit ``used`` goes over (``"<field> allows X"``) and the GPU model it is
        for (None: the namespace's total), or None where ``used`` is within this quota. With
        ``adding``, only the limits that it adds to (see :meth:`Limits.excess`)."""
        problem = self.limits.excess(used.total, None if adding is None else adding.total)
        if problem is not None:
            return problem, None
        for model, limits in self.models:
            problem = limits.excess(used.model(model), None if adding is None else adding.model(model))
            if problem is not None:
                return problem, model
        return None

    def text(self, used: Charge) -> str:
        """The quota named, everything it allows and what ``used`` holds of each scope it limits:
        a text that depends on the quota and the namespace's use only, so that the reason is
        the same on every node whatever limit the pod would cross there."""
        parts = []
        if self.limits != Limits():
            parts.append(f"allows {self.limits.describe()} {used_text(used.total)}")
        for model, limits in self.models:
            parts.append(f"{model} allows {limits.describe()} {used_text(used.model(model))}")
        return f"GPUQuota {self.namespace}/{self.name}: " + "; ".join(parts)


def refusal(quotas: Iterable[Quota], used: Charge, adding: Charge) -> str | None:
    """Why ``adding`` to a namespace that holds ``used`` would go over one of its ``quotas``
    (None where every quota admits it). The text names the quota, what it allows and what the
    namespace holds now, not what the pod would add: a pod's share can differ from node to
    node, and the reason must read the same on every node."""
    after = used + adding
    for quota in quotas:
        if quota.exceeded(after, adding) is not None:
            return quota.text(used)
    return None


def over_quota(quota: Quota, used: Charge) -> bool:
    """Whether a namespace already holds more than ``quota`` allows (a lowered quota: its pods
    keep running, and the quota's status says so)."""
    return quota.exceeded(used) is not None


# ---------------------------------------------------------------- the object


def _limit(where: str, raw: Mapping[str, Any], key: str, forms: str, scale: Fraction) -> int | None:
    if key not in raw or raw[key] is None:
        return None
    value = raw[key]
    try:
        number = parse_quantity(value)
    except ValueError:
        number = Fraction(-1)
    if number < 0 or (key == "gpus" and (isinstance(value, bool) or number.denominator != 1)):
        raise QuotaError(f"{where}.{key}: invalid value {value!r}; accepted: {forms}")
    scaled = number * scale
    return scaled.numerator // scaled.denominator  # a limit rounds down: it never admits more than it says


def _limits(where: str, raw: object) -> Limits:
    if not isinstance(raw, Mapping):
        raise QuotaError(f"{where}: must be an object with gpuMemory, gpuCompute and/or gpus")
    unknown = sorted(set(raw) - {"gpuMemory", "gpuCompute", "gpus", "models"})
    if unknown:
        raise QuotaError(f"{where}.{unknown[0]}: unknown field; accepted: gpuMemory, gpuCompute, gpus, models")
    return Limits(
        _limit(where, raw, "gpuMemory", MEMORY_FORMS, Fraction(1, 2**20)),
        _limit(where, raw, "gpuCompute", COMPUTE_FORMS, Fraction(MILLI)),
        _limit(where, raw, "gpus", GPUS_FORMS, Fraction(1)),
    )


def parse_quota(obj: Mapping[str, Any]) -> Quota:
    """A ``GPUQuota`` object (its JSON) to a :class:`Quota`; :class:`QuotaError` names the quota
    and the field path where it is malformed. The API server refuses the same objects by the
    CRD's schema; this check is for the cluster file and for a CRD installed without it."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    name, namespace = meta.get("name"), meta.get("namespace") or "default"
    if not isinstance(name, str) or not name or not isinstance(namespace, str):
        raise QuotaError("GPUQuota metadata.name: must be a non-empty string")
    where = f"GPUQuota {namespace}/{name} spec"
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise QuotaError(f"{where}: must be an object with limits")
    raw = spec.get("limits")
    limits = _limits(f"{where}.limits", raw)
    assert isinstance(raw, Mapping)
    models_raw = raw.get("models") or {}
    if not isinstance(models_raw, Mapping):
        raise QuotaError(f"{where}.limits.models: must be a map from GPU model to limits")
    models = []
    for model, sub in sorted(models_raw.items()):
        if isinstance(sub, Mapping) and "models" in sub:
            raise QuotaError(
                f"{where}.limits.models.{model}.models: unknown field; accepted: gpuMemory, gpuCompute, gpus"
            )
        models.append((str(model), _limits(f"{where}.limits.models.{model}", sub)))
    return Quota(namespace, name, limits, tuple(models))


def limits_json(limits: Limits) -> dict[str, Any]:
    """``limits`` as the CRD writes them (for status and ``gpuslice inspect``)."""
    out: dict[str, Any] = {}
    if limits.memory_mib is not None:
        out["gpuMemory"] = f"{limits.memory_mib}Mi"
    if limits.compute_milli is not None:
        out["gpuCompute"] = f"{limits.compute_milli}m"
    if limits.gpus is not None:
        out["gpus"] = limits.gpus
    return out


def amount_json(amount: Amount) -> dict[str, Any]:
    return {"gpuMemory": f"{amount.memory_mib}Mi", "gpuCompute": f"{amount.compute_milli}m", "gpus": amount.gpus}


def status_json(quota: Quota, used: Charge) -> dict[str, Any]:
    """The ``status`` gpuslice writes on a quota: what its namespace holds, and whether over."""
    body: dict[str, Any] = {"used": amount_json(used.total), "overQuota": over_quota(quota, used)}
    if quota.models:
        body["used"]["models"] = {m: amount_json(used.model(m)) for m, _ in quota.models}
    return body


def quotas_by_namespace(quotas: Iterable[Quota]) -> dict[str, tuple[Quota, ...]]:
    out: dict[str, list[Quota]] = {}
    for q in sorted(quotas, key=lambda q: (q.namespace, q.name)):
        out.setdefault(q.namespace, []).append(q)
    return {ns: tuple(qs) for ns, qs in out.items()}
