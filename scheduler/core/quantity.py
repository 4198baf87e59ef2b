"""Kubernetes quantities in the integer units the core uses (milli-CPU, MiB, milli-GPU).

Rounding always goes towards reserving more (ceil), so a parsed request never
under-states what the pod asked for.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from functools import lru_cache

_SUFFIX = {
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "m": Fraction(1, 1000),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}
_QUANTITY = re.compile(r"^\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([kMGTPE]i?|m)?\s*$")
_MAX_ABS = Fraction(10**24)

QUANTITY_FORMS = "a Kubernetes quantity such as 500m, 2, 1.5, 20Gi, 20480Mi, 16G"
MEMORY_FORMS = "a memory size such as 20Gi, 20480Mi, 16G, or a bare integer number of MiB"


def parse_quantity(text: object) -> Fraction:
    """Parse a Kubernetes quantity to an exact fraction of base units; ValueError if malformed."""
    if type(text) is str:
        return _parse_text(text)
    if isinstance(text, bool):
        raise ValueError(f"not a quantity: {text!r}")
    if isinstance(text, int):
        return Fraction(text)
    if isinstance(text, float):
        if text != text or text in (float("inf"), float("-inf")):
            raise ValueError(f"not a finite quantity: {text!r}")
        return Fraction(Decimal(repr(text)))
    if not isinstance(text, str):
        raise ValueError(f"not a quantity: {text!r}")
    return _parse_text(str(text))


@lru_cache(maxsize=4096)
def _parse_text(text: str) -> Fraction:
    # Pods of one workload repeat the same few quantities ("2", "8Gi"): parsed once each.
    match = _QUANTITY.match(text)
    if match is None:
        raise ValueError(f"not a quantity: {text!r}")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        value = Fraction(Decimal(number)) * _SUFFIX[suffix]
    except (InvalidOperation, OverflowError) as exc:  # pragma: no cover - regex guards this
        raise ValueError(f"not a quantity: {text!r}") from exc
    if abs(value) > _MAX_ABS:
        raise ValueError(f"quantity out of range: {text!r}")
    return value


def ceil_fraction(value: Fraction) -> int:
    return -((-value.numerator) // value.denominator)


def cpu_milli(text: object) -> int:
    """CPU quantity to milli-cores, rounded up ("500m" -> 500, "2" -> 2000)."""
    if type(text) is str:
        return _cpu_text(text)
    return ceil_fraction(parse_quantity(text) * 1000)


def bytes_to_mib(text: object) -> int:
    """Kubernetes memory quantity in bytes ("1Gi", "512Mi", "1e9") to MiB, rounded up."""
    if type(text) is str:
        return _mib_text(text)
    return ceil_fraction(parse_quantity(text) / 2**20)


@lru_cache(maxsize=4096)
def _cpu_text(text: str) -> int:
    return ceil_fraction(parse_quantity(text) * 1000)


@lru_cache(maxsize=4096)
def _mib_text(text: str) -> int:
    return ceil_fraction(parse_quantity(text) / 2**20)


def memory_mib(text: object) -> int:
    """A gpuslice memory annotation to MiB: a bare integer is MiB, anything with a unit is bytes."""
    if isinstance(text, bool):
        raise ValueError(f"not a memory size: {text!r}")
    if isinstance(text, int) or (isinstance(text, str) and text.strip().isdigit()):
        return int(str(text).strip())
    return bytes_to_mib(text)
