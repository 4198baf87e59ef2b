"""The FGD authors' published per-seed curves (``fgd_expected_results/analysis_allo_discrete.csv``
and ``analysis_frag_ratio_discrete.csv``), keyed by our trace and policy names."""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from .errors import TraceError

ALLOCATION_FILE = "analysis_allo_discrete.csv"
FRAG_RATE_FILE = "analysis_frag_ratio_discrete.csv"


def policy_name(authors: str) -> str:
    """``06-FGD`` -> ``fgd``, ``03-GpuClustering`` -> ``gpuclustering``."""
    return re.sub(r"^\d+-", "", authors.strip()).lower()


def trace_name(workload: str) -> str:
    """``openb_pod_list_default`` -> ``default``."""
    return workload.strip().removeprefix("openb_pod_list_")


@dataclass
class Reference:
    """Per (trace, policy): per seed, {arrived %: allocated GPU %} and {arrived %: frag rate %}."""

    allocation: dict[tuple[str, str], list[dict[int, float]]] = field(default_factory=dict)
    frag_rate: dict[tuple[str, str], list[dict[int, float]]] = field(default_factory=dict)

    def unallocated_at(self, trace: str, policy: str, pct: int = 100) -> list[float]:
        return [100 - c[pct] for c in self.allocation.get((trace, policy), []) if pct in c]

    def mean_unallocated(self, trace: str, policy: str, pct: int = 100) -> float:
        values = self.unallocated_at(trace, policy, pct)
        return sum(values) / len(values) if values else math.nan


def _read(path: Path) -> dict[tuple[str, str], list[dict[int, float]]]:
    out: dict[tuple[str, str], list[dict[int, float]]] = {}
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise TraceError(path, "", f"cannot be read: {exc.strerror or exc}") from exc
    with handle:
        reader = csv.DictReader(handle)
        for column in ("workload", "sc_policy"):
            if column not in (reader.fieldnames or []):
                raise TraceError(path, "header", f"missing column {column} (the authors' result format)")
        for i, row in enumerate(reader, start=1):
            curve: dict[int, float] = {}
            for key, value in row.items():
                if key is not None and key.isdigit() and value not in (None, ""):
                    try:
                        curve[int(key)] = float(value)
                    except ValueError:
                        raise TraceError(path, f"row {i}", f"column {key} {value!r} is not a number") from None
            out.setdefault((trace_name(row["workload"]), policy_name(row["sc_policy"])), []).append(curve)
    return out


def load(directory: str | Path) -> Reference:
    directory = Path(directory)
    if not (directory / ALLOCATION_FILE).exists():
        raise TraceError(directory, "", f"has no {ALLOCATION_FILE} (expected the authors' fgd_expected_results)")
    reference = Reference(allocation=_read(directory / ALLOCATION_FILE))
    if (directory / FRAG_RATE_FILE).exists():
        reference.frag_rate = _read(directory / FRAG_RATE_FILE)
    return reference
