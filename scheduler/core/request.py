"""One parser from a pod's JSON dict to a typed GPU request.

Forms, under the annotation prefix (default ``gpuslice.io/``):

* ``gpu-fraction: "0.5"``            half of one GPU's memory and compute
* ``gpu-memory: "20Gi"`` / ``gpu-compute: "30"``   absolute memory (bare integer = MiB)
  and/or percent of SMs; the one not given is taken in proportion to the other
* ``gpu-count: "2"``                 whole GPUs, or with a fraction/memory: that many shared GPUs
* ``mig-profile: "3g.40gb"``         one MIG instance, matched by slices and memory
* selectors ``sharing``, ``gpu-model``, ``policy``; ``nvlink: required`` (whole GPUs or shares
  on several GPUs, every pair of them joined by NVLink; ``preferred``, the default, only prefers it)
* container resources ``nvidia.com/gpu: N`` and ``nvidia.com/mig-<profile>: 1``

Anything malformed or contradictory raises :class:`RequestError` naming the key, the
value and the accepted forms; nothing is silently ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from fractions import Fraction
from typing import Any

from .catalog import MIG_PROFILE_FORMS, ProfileSpec, canonical_model_name, known_profile
from .errors import RequestError
from .inventory import Device, SharingMode
from .pods import pod_key
from .quantity import MEMORY_FORMS, QUANTITY_FORMS, bytes_to_mib, ceil_fraction, cpu_milli, memory_mib

DEFAULT_PREFIX = "gpuslice.io/"
MAX_GPU_COUNT = 64
MILLI = 1000


# Keys gpuslice writes itself; the request parser leaves them alone.
OUTPUT_KEYS = frozenset(
    {
        "allocation",
        "bind-phase",
        "bound-at",
        "visible-devices",
        "mps-thread-percentage",
        "mps-memory-limit",
        "inventory",
    }
)
REQUEST_KEYS = ("gpu-fraction", "gpu-memory", "gpu-compute", "gpu-count", "mig-profile")
SELECTOR_KEYS = ("sharing", "gpu-model", "policy", "nvlink")
SHARING_FORMS = "one of mig, mps, time-slicing, exclusive, any (or several joined by |)"
NVLINK_FORMS = "required (every pair of the pod's GPUs joined by NVLink) or preferred (the default)"


class GpuKind(StrEnum):
    NONE = "none"
    SHARE = "share"  # part of a GPU (fraction, memory and/or compute), possibly on several GPUs
    WHOLE = "whole"  # whole GPUs
    MIG = "mig"  # one MIG instance of a profile


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """What a pod needs of GPUs, per GPU (all integer units)."""

    kind: GpuKind = GpuKind.NONE
    count: int = 0
    fraction_milli: int = 0
    memory_mib: int = 0
    compute_milli: int = 0
    profile: ProfileSpec | None = None
    sharing: frozenset[SharingMode] = frozenset()  # empty: any mode
    models: tuple[str, ...] = ()  # canonical names; empty: any model
    nvlink: bool = False  # True: every pair of the GPUs given must be joined by NVLink

    def allows_mode(self, mode: SharingMode) -> bool:
        return not self.sharing or mode in self.sharing

    def allows_model(self, model_name: str) -> bool:
        return not self.models or model_name in self.models

    def share_on(self, device: Device) -> tuple[int, int]:
        """(memory MiB, compute milli) this request takes of one ``device``.

        Fractions round memory down so that shares summing to one GPU never exceed it.
        """
        total = device.memory_mib
        if self.kind is GpuKind.WHOLE:
            return total, MILLI
        if self.fraction_milli:
            return self.fraction_milli * total // MILLI, self.fraction_milli
        mem, compute = self.memory_mib, self.compute_milli
        if not compute:
            compute = min(MILLI, -(-mem * MILLI // total))
        if not mem:
            mem = compute * total // MILLI
        return mem, compute

    def per_gpu_milli(self, reference_memory_mib: int) -> int:
        """This request's size on one GPU in milli-GPU, wherever it lands: a whole GPU 1000,
        a fraction its share, a compute share its compute, a MIG profile its compute slices out
        of 7, a memory-only share its memory as a share of ``reference_memory_mib`` (rounded up;
        0 without a reference); 0 without a GPU request."""
        if self.kind is GpuKind.NONE:
            return 0
        if self.kind is GpuKind.WHOLE:
            return MILLI
        if self.kind is GpuKind.MIG:
            assert self.profile is not None
            return self.profile.compute_slices * MILLI // 7
        per = self.fraction_milli or self.compute_milli
        if not per and self.memory_mib and reference_memory_mib:
            per = min(MILLI, -(-self.memory_mib * MILLI // reference_memory_mib))
        return per

    def total_milli(self, reference_memory_mib: int) -> int:
        """:meth:`per_gpu_milli` over all the GPUs asked for."""
        return self.per_gpu_milli(reference_memory_mib) * max(1, self.count)

    @property
    def share_milli(self) -> int:
        """Per-GPU share in milli-GPU when it does not depend on the device (else 0)."""
        if self.kind is GpuKind.WHOLE:
            return MILLI
        return self.fraction_milli or (self.compute_milli if not self.memory_mib else 0)

    def describe(self) -> str:
        if self.kind is GpuKind.NONE:
            return "no GPU"
        linked = " joined by NVLink" if self.nvlink and self.count > 1 else ""
        if self.kind is GpuKind.WHOLE:
            return f"{self.count} whole GPU" + ("s" if self.count > 1 else "") + linked
        if self.kind is GpuKind.MIG:
            assert self.profile is not None
            return f"MIG {self.profile.text}"
        parts = []
        if self.fraction_milli:
            parts.append(f"{self.fraction_milli / MILLI:g} GPU")
        if self.memory_mib:
            parts.append(f"{self.memory_mib} MiB")
        if self.compute_milli:
            parts.append(f"{self.compute_milli / 10:g} percent compute")  # no "%": see capacity
        each = " each" if self.count > 1 else ""
        return f"{self.count} x " * (self.count > 1) + " + ".join(parts) + each + linked


@dataclass(frozen=True, slots=True)
class Demand:
    """Everything placement depends on, without the pod's identity (hashable, cacheable)."""

    cpu_milli: int = 0
    memory_mib: int = 0
    gpu: GpuRequest = GpuRequest()


@dataclass(frozen=True, slots=True)
class PodRequest:
    namespace: str
    name: str
    uid: str
    demand: Demand
    policy: str | None = None

    @property
    def key(self) -> str:
        return pod_key(self.namespace, self.name)


# ---------------------------------------------------------------- parsing helpers


def _decimal(key: str, value: object, accepted: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise RequestError(key, value, accepted)
    try:
        number = Decimal(str(value).strip().removesuffix("%").strip())
    except InvalidOperation as exc:
        raise RequestError(key, value, accepted) from exc
    if not number.is_finite():
        raise RequestError(key, value, accepted)
    return number


def _fraction_milli(key: str, value: object) -> int:
    accepted = "a number in (0, 1], such as 0.25 or 0.5"
    number = _decimal(key, value, accepted)
    if number <= 0 or number > 1:
        raise RequestError(key, value, accepted)
    return max(1, ceil_fraction(Fraction(number) * MILLI))


def _compute_milli(key: str, value: object) -> int:
    accepted = "a percentage of the GPU's SMs in (0, 100], such as 30 or 12.5"
    number = _decimal(key, value, accepted)
    if number <= 0 or number > 100:
        raise RequestError(key, value, accepted)
    return ceil_fraction(Fraction(number) * 10)


def _count(key: str, value: object) -> int:
    accepted = f"a whole number of GPUs from 1 to {MAX_GPU_COUNT}"
    number = _decimal(key, value, accepted)
    if number != number.to_integral_value() or not 1 <= number <= MAX_GPU_COUNT:
        raise RequestError(key, value, accepted)
    return int(number)


def _memory(key: str, value: object) -> int:
    try:
        mib = memory_mib(value)
    except ValueError as exc:
        raise RequestError(key, value, MEMORY_FORMS) from exc
    if mib <= 0:
        raise RequestError(key, value, MEMORY_FORMS + " (greater than zero)")
    return mib


def _sharing(key: str, value: object) -> frozenset[SharingMode]:
    if not isinstance(value, str) or not value.strip():
        raise RequestError(key, value, SHARING_FORMS)
    modes: set[SharingMode] = set()
    for part in value.split("|"):
        word = part.strip().lower()
        if word == "any":
            return frozenset()
        try:
            modes.add(SharingMode(word))
        except ValueError as exc:
            raise RequestError(key, value, SHARING_FORMS) from exc
    return frozenset(modes)


def _nvlink(key: str, value: object) -> bool:
    word = value.strip().lower() if isinstance(value, str) else None
    if word not in ("required", "preferred"):
        raise RequestError(key, value, NVLINK_FORMS)
    return word == "required"


def _models(key: str, value: object) -> tuple[str, ...]:
    accepted = "GPU model names joined by |, such as H100-80GB|A100-80GB"
    if not isinstance(value, str) or not value.strip():
        raise RequestError(key, value, accepted)
    parts = [p.strip() for p in value.split("|")]
    if any(not p for p in parts):
        raise RequestError(key, value, accepted)
    return tuple(dict.fromkeys(canonical_model_name(p) for p in parts))


def _as_mapping(value: object, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise RequestError(where, value, "a JSON object")
    return value


def _as_list(value: object, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise RequestError(where, value, "a JSON array")
    return value


# ---------------------------------------------------------------- resources


@dataclass(slots=True)
class _Resources:
    cpu_milli: int = 0
    memory_mib: int = 0
    gpus: int = 0
    mig: dict[str, int] | None = None


def _container_resources(container: Mapping[str, Any], where: str) -> _Resources:
    resources = _as_mapping(container.get("resources"), f"{where}.resources")
    requests = _as_mapping(resources.get("requests"), f"{where}.resources.requests")
    limits = _as_mapping(resources.get("limits"), f"{where}.resources.limits")
    out = _Resources(mig={})
    for name in ("cpu", "memory"):
        value = requests.get(name, limits.get(name))
        if value is None:
            continue
        try:
            if name == "cpu":
                out.cpu_milli = cpu_milli(value)
            else:
                out.memory_mib = bytes_to_mib(value)
        except ValueError as exc:
            raise RequestError(f"{where}.resources {name}", value, QUANTITY_FORMS) from exc
        if (out.cpu_milli if name == "cpu" else out.memory_mib) < 0:
            raise RequestError(f"{where}.resources {name}", value, QUANTITY_FORMS + " (not negative)")
    names = set(limits) | set(requests)
    for name in sorted(names):
        if not isinstance(name, str) or not name.startswith("nvidia.com/"):
            continue
        value = limits.get(name, requests.get(name))
        resource = name.removeprefix("nvidia.com/")
        if resource == "gpu":
            out.gpus = _resource_count(f"{where}.resources {name}", value)
        elif resource.startswith("mig-"):
            profile = resource.removeprefix("mig-")
            assert out.mig is not None
            out.mig[profile] = _resource_count(f"{where}.resources {name}", value)
    return out


def _resource_count(key: str, value: object) -> int:
    accepted = "a non-negative whole number"
    number = _decimal(key, value, accepted)
    if number != number.to_integral_value() or number < 0 or number > MAX_GPU_COUNT:
        raise RequestError(key, value, accepted + f" up to {MAX_GPU_COUNT}")
    return int(number)


def _pod_resources(spec: Mapping[str, Any]) -> _Resources:
    """Effective pod resources: max(sum of containers, largest init container), as kubelet does."""
    total = _Resources(mig={})
    for i, c in enumerate(_as_list(spec.get("containers"), "spec.containers")):
        r = _container_resources(_as_mapping(c, f"spec.containers[{i}]"), f"spec.containers[{i}]")
        total.cpu_milli += r.cpu_milli
        total.memory_mib += r.memory_mib
        total.gpus += r.gpus
        assert total.mig is not None and r.mig is not None
        for k, v in r.mig.items():
            total.mig[k] = total.mig.get(k, 0) + v
    for i, c in enumerate(_as_list(spec.get("initContainers"), "spec.initContainers")):
        r = _container_resources(_as_mapping(c, f"spec.initContainers[{i}]"), f"spec.initContainers[{i}]")
        total.cpu_milli = max(total.cpu_milli, r.cpu_milli)
        total.memory_mib = max(total.memory_mib, r.memory_mib)
        total.gpus = max(total.gpus, r.gpus)
        assert total.mig is not None and r.mig is not None
        for k, v in r.mig.items():
            total.mig[k] = max(total.mig.get(k, 0), v)
    return total


# ---------------------------------------------------------------- the parser


def parse_gpu_request(
    annotations: Mapping[str, object],
    prefix: str = DEFAULT_PREFIX,
    gpus: int = 0,
    mig: Mapping[str, int] | None = None,
) -> GpuRequest:
    """The GPU request of a pod's annotations plus its ``nvidia.com/*`` resource counts."""
    ours: dict[str, object] = {}
    for key, value in annotations.items():
        if isinstance(key, str) and key.startswith(prefix):
            short = key[len(prefix) :]
            if short in OUTPUT_KEYS:
                continue
            if short not in REQUEST_KEYS and short not in SELECTOR_KEYS:
                raise RequestError(
                    key, value, "one of the keys " + ", ".join(prefix + k for k in REQUEST_KEYS + SELECTOR_KEYS)
                )
            ours[short] = value

    def k(short: str) -> str:
        return prefix + short

    sharing = _sharing(k("sharing"), ours["sharing"]) if "sharing" in ours else frozenset()
    models = _models(k("gpu-model"), ours["gpu-model"]) if "gpu-model" in ours else ()
    nvlink = _nvlink(k("nvlink"), ours["nvlink"]) if "nvlink" in ours else False
    fraction = _fraction_milli(k("gpu-fraction"), ours["gpu-fraction"]) if "gpu-fraction" in ours else 0
    mem = _memory(k("gpu-memory"), ours["gpu-memory"]) if "gpu-memory" in ours else 0
    compute = _compute_milli(k("gpu-compute"), ours["gpu-compute"]) if "gpu-compute" in ours else 0
    count = _count(k("gpu-count"), ours["gpu-count"]) if "gpu-count" in ours else 0
    profile = ProfileSpec.parse(str(ours["mig-profile"]), k("mig-profile")) if "mig-profile" in ours else None
    if profile is not None and not isinstance(ours["mig-profile"], str):
        raise RequestError(k("mig-profile"), ours["mig-profile"], MIG_PROFILE_FORMS)

    mig_resources = {p: n for p, n in (mig or {}).items() if n}
    annotated = bool(fraction or mem or compute or count or profile)
    if annotated and (gpus or mig_resources):
        resource = "nvidia.com/gpu" if gpus else "nvidia.com/mig-" + next(iter(mig_resources))
        raise RequestError(
            resource,
            gpus or next(iter(mig_resources.values())),
            f"either the resource or the {prefix} request annotations, not both",
        )
    if gpus and mig_resources:
        raise RequestError("nvidia.com/gpu", gpus, "either nvidia.com/gpu or one nvidia.com/mig-<profile>, not both")
    if len(mig_resources) > 1:
        raise RequestError("nvidia.com/mig-*", sorted(mig_resources), "a single nvidia.com/mig-<profile> resource")
    if mig_resources:
        name, n = next(iter(mig_resources.items()))
        if n != 1:
            raise RequestError(f"nvidia.com/mig-{name}", n, "1 (one MIG instance per pod)")
        profile = ProfileSpec.parse(name, f"nvidia.com/mig-{name}")
        if not known_profile(profile):
            raise RequestError(f"nvidia.com/mig-{name}", 1, "a profile some MIG-capable model offers")
    if gpus:
        count = gpus

    if fraction and (mem or compute):
        raise RequestError(
            k("gpu-fraction"),
            ours["gpu-fraction"],
            f"either {k('gpu-fraction')} or {k('gpu-memory')}/{k('gpu-compute')}, not both",
        )
    if profile is not None:
        if profile_key := next(
            (x for x in ("gpu-fraction", "gpu-memory", "gpu-compute", "gpu-count") if x in ours), None
        ):
            raise RequestError(
                k(profile_key),
                ours[profile_key],
                f"nothing beside {k('mig-profile')}: a MIG profile fixes memory and compute",
            )
        if not known_profile(profile):
            raise RequestError(
                k("mig-profile"),
                profile.text,
                "a profile some MIG-capable model offers, such as 1g.10gb, 2g.20gb, 3g.40gb, 7g.80gb",
            )
        if sharing and SharingMode.MIG not in sharing:
            raise RequestError(k("sharing"), ours["sharing"], "mig or any, with a MIG profile")
        if nvlink:
            raise RequestError(
                k("nvlink"), ours["nvlink"], "preferred (or no key) with a MIG profile: one instance, one GPU"
            )
        return GpuRequest(GpuKind.MIG, 1, profile=profile, sharing=frozenset({SharingMode.MIG}), models=models)

    if fraction or mem or compute:
        if sharing == frozenset({SharingMode.EXCLUSIVE}) and fraction != MILLI:
            raise RequestError(k("sharing"), ours["sharing"], "a sharing mode other than exclusive for part of a GPU")
        return GpuRequest(
            GpuKind.SHARE, count or 1, fraction, mem, compute, sharing=sharing, models=models, nvlink=nvlink
        )
    if count:
        return GpuRequest(GpuKind.WHOLE, count, sharing=sharing, models=models, nvlink=nvlink)
    for selector in ("sharing", "gpu-model", "nvlink"):
        if selector in ours:
            raise RequestError(
                k(selector),
                ours[selector],
                f"a selector only beside a GPU request ({', '.join(k(x) for x in REQUEST_KEYS)} or nvidia.com/gpu)",
            )
    return GpuRequest()


def parse_pod(
    pod: Mapping[str, Any], prefix: str = DEFAULT_PREFIX, policies: Iterable[str] | None = None
) -> PodRequest:
    """Parse a pod (Kubernetes JSON as a dict) into a :class:`PodRequest`.

    ``policies``, when given, is the set of policy names a per-pod override may use.
    """
    if not isinstance(pod, Mapping):
        raise RequestError("pod", type(pod).__name__, "a Pod as a JSON object")
    meta = _as_mapping(pod.get("metadata"), "metadata")
    spec = _as_mapping(pod.get("spec"), "spec")
    annotations = _as_mapping(meta.get("annotations"), "metadata.annotations")
    resources = _pod_resources(spec)
    gpu = parse_gpu_request(annotations, prefix, resources.gpus, resources.mig)
    policy = annotations.get(prefix + "policy")
    if policy is not None:
        names = sorted(policies) if policies is not None else None
        if not isinstance(policy, str) or not policy.strip() or (names is not None and policy not in names):
            raise RequestError(prefix + "policy", policy, "one of " + ", ".join(names) if names else "a policy name")
    name = meta.get("name") or ""
    namespace = meta.get("namespace") or "default"
    uid = meta.get("uid") or ""
    for field_name, value in (("metadata.name", name), ("metadata.namespace", namespace), ("metadata.uid", uid)):
        if not isinstance(value, str):
            raise RequestError(field_name, value, "a string")
    demand = Demand(resources.cpu_milli, resources.memory_mib, gpu)
    return PodRequest(str(namespace), str(name), str(uid), demand, policy if isinstance(policy, str) else None)
