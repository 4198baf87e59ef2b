"""GPU models and their MIG layouts (from NVIDIA's MIG user guide).

A MIG layout is a set of profile *shapes* (memory slots, compute slices, max count,
legal start slots); each model names those shapes by its own memory size. A request
for ``3g.40gb`` is matched by slice count and memory, not by the string, so an
A100-40GB's ``1g.10gb`` (two memory slots) and an A100-80GB's ``1g.10gb`` (one slot)
are each found on their own model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import RequestError

MIG_PROFILE_FORMS = "a MIG profile such as 1g.10gb, 3g.40gb or 7g.80gb (optionally with +me)"
_PROFILE = re.compile(r"^(\d+)g\.(\d+)gb(\+me)?$")


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One MIG profile of one model: ``memory_slots`` starting at one of ``starts``."""

    name: str
    compute_slices: int
    memory_slots: int
    memory_gb: int
    max_count: int
    starts: tuple[int, ...]

    @property
    def memory_mib(self) -> int:
        return self.memory_gb * 1024


@dataclass(frozen=True, slots=True)
class MigLayout:
    memory_slots: int
    compute_slices: int
    profiles: tuple[MigProfile, ...]

    def profile(self, name: str) -> MigProfile | None:
        spec = ProfileSpec.parse(name)
        return self.match(spec)

    def match(self, spec: ProfileSpec) -> MigProfile | None:
        """The profile with the requested slices and (within 1 GB) memory, if any."""
        best: MigProfile | None = None
        for p in self.profiles:
            if (
                p.compute_slices == spec.compute_slices
                and abs(p.memory_gb - spec.memory_gb) <= 1
                and (best is None or abs(p.memory_gb - spec.memory_gb) < abs(best.memory_gb - spec.memory_gb))
            ):
                best = p
        return best


@dataclass(frozen=True, slots=True)
class ProfileSpec:
    """A requested MIG profile, by slices and memory (``3g.40gb`` -> 3, 40)."""

    text: str
    compute_slices: int
    memory_gb: int

    @staticmethod
    def parse(text: str, key: str = "mig-profile") -> ProfileSpec:
        match = _PROFILE.match(text.strip().lower()) if isinstance(text, str) else None
        if match is None:
            raise RequestError(key, text, MIG_PROFILE_FORMS)
        slices, gb = int(match.group(1)), int(match.group(2))
        if slices == 0 or gb == 0:
            raise RequestError(key, text, MIG_PROFILE_FORMS)
        return ProfileSpec(text=text.strip().lower().removesuffix("+me"), compute_slices=slices, memory_gb=gb)


@dataclass(frozen=True, slots=True)
class GpuModel:
    """A GPU model: its memory, SM count and MIG layout (``None`` if it cannot do MIG)."""

    name: str
    memory_mib: int
    sm_count: int
    mig: MigLayout | None = None


# (memory slots, compute slices, max count, legal starts) of the GA100/GH100 8-slot layout.
_GH100_SHAPES = (
    (1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
    (2, 1, 4, (0, 2, 4, 6)),
    (2, 2, 3, (0, 2, 4)),
    (4, 3, 2, (0, 4)),
    (4, 4, 1, (0,)),
    (8, 7, 1, (0,)),
)
_A30_SHAPES = (
    (1, 1, 4, (0, 1, 2, 3)),
    (2, 2, 2, (0, 2)),
    (4, 4, 1, (0,)),
)


def _layout(
    memory_slots: int, compute: int, shapes: tuple[tuple[int, int, int, tuple[int, ...]], ...], names: tuple[str, ...]
) -> MigLayout:
    profiles = []
    for (mem, slices, count, starts), name in zip(shapes, names, strict=True):
        spec = ProfileSpec.parse(name)
        profiles.append(MigProfile(name, slices, mem, spec.memory_gb, count, starts))
    return MigLayout(memory_slots, compute, tuple(profiles))


A100_40_MIG = _layout(8, 7, _GH100_SHAPES, ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"))
A100_80_MIG = _layout(8, 7, _GH100_SHAPES, ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"))
H200_MIG = _layout(8, 7, _GH100_SHAPES, ("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"))
A30_MIG = _layout(4, 4, _A30_SHAPES, ("1g.6gb", "2g.12gb", "4g.24gb"))

CATALOG: dict[str, GpuModel] = {
    m.name: m
    for m in (
        GpuModel("A100-40GB", 40960, 108, A100_40_MIG),
        GpuModel("A100-80GB", 81920, 108, A100_80_MIG),
        GpuModel("A30", 24576, 56, A30_MIG),
        GpuModel("H100-80GB", 81920, 132, A100_80_MIG),
        GpuModel("H200-141GB", 144384, 132, H200_MIG),
        GpuModel("L4", 23034, 58),
        GpuModel("T4", 15360, 40),
        GpuModel("V100-16GB", 16384, 80),
        GpuModel("V100-32GB", 32768, 80),
        GpuModel("A10", 23028, 72),
        GpuModel("P100", 16384, 56),
    )
}

# Other spellings: GPU feature discovery's product label, the openb trace's codes.
_ALIASES = {
    "A100": "A100-40GB",
    "A100-SXM4-40GB": "A100-40GB",
    "A100-PCIE-40GB": "A100-40GB",
    "A100-SXM4-80GB": "A100-80GB",
    "A100-PCIE-80GB": "A100-80GB",
    "A100-80GB-PCIE": "A100-80GB",
    "H100": "H100-80GB",
    "H100-80GB-HBM3": "H100-80GB",
    "H100-SXM5-80GB": "H100-80GB",
    "H100-PCIE": "H100-80GB",
    "H200": "H200-141GB",
    "H200-141GB-HBM3E": "H200-141GB",
    "A30-24GB": "A30",
    "L4-24GB": "L4",
    "TESLA-T4": "T4",
    "TESLA-V100-SXM2-16GB": "V100-16GB",
    "TESLA-V100-SXM2-32GB": "V100-32GB",
    "V100M16": "V100-16GB",
    "V100M32": "V100-32GB",
    "TESLA-P100-PCIE-16GB": "P100",
    "A10-24GB": "A10",
}


def canonical_model_name(name: str) -> str:
    """Normalise a model name: case, spaces, an ``NVIDIA-`` prefix and known aliases."""
    key = re.sub(r"[\s_]+", "-", name.strip()).upper()
    key = key.removeprefix("NVIDIA-")
    for known in CATALOG:
        if known.upper() == key:
            return known
    return _ALIASES.get(key, key)


def lookup_model(name: str, memory_mib: int | None = None, sm_count: int | None = None) -> GpuModel:
    """The catalogue's model for ``name``, or an unknown model described by memory and SMs.

    An unknown model without a memory size cannot be scheduled on by memory, so it is
    an error; the caller names where the model came from.
    """
    canonical = canonical_model_name(name)
    model = CATALOG.get(canonical)
    if model is not None:
        if memory_mib is not None and memory_mib != model.memory_mib:
            return GpuModel(model.name, memory_mib, sm_count or model.sm_count, model.mig)
        return model
    if memory_mib is None or memory_mib <= 0:
        raise ValueError(f"unknown GPU model {name!r} needs its memory in MiB")
    return GpuModel(canonical, memory_mib, sm_count or 0, None)


def known_profile(spec: ProfileSpec) -> bool:
    """Whether any catalogue model offers this profile."""
    return any(m.mig is not None and m.mig.match(spec) is not None for m in CATALOG.values())
