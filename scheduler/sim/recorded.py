"""Recorded measurements for ``gpuslice advise``: each share's allocated memory and measured peak.

A file is either a Prometheus HTTP API response (``/api/v1/query_range``: ``resultType: matrix``,
``values`` per series; or an instant query's ``vector``, one ``value``) or a snapshot of a node
agent's ``/metrics`` in the Prometheus text format. Series of
``gpuslice_share_memory_used_mib`` give the peak (the largest value in any file), series of
``gpuslice_share_memory_allocated_mib`` the allocation; other series are skipped. A share is
(``namespace``/``pod``, ``uuid``); its other labels (``node``, ``gpu``, ``model``, ``mode``,
``mig_profile``) are kept for the advice. Every problem names the file and the series.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from .errors import TraceError

USED = "gpuslice_share_memory_used_mib"
ALLOCATED = "gpuslice_share_memory_allocated_mib"
KEY_LABELS = ("namespace", "pod", "uuid")


@dataclass(frozen=True, slots=True)
class ShareRecord:
    pod: str  # namespace/name
    uuid: str
    node: str = ""
    gpu: str = ""
    model: str = ""
    mode: str = ""
    mig_profile: str = ""
    allocated_mib: int | None = None
    peak_mib: int | None = None
    samples: int = 0


def _number(path: Path, where: str, raw: object) -> float | None:
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TraceError(path, where, f"value {raw!r} is not a number") from None
    return None if math.isnan(value) or math.isinf(value) else value


def _series_of_json(path: Path, body: object) -> Iterable[tuple[str, Mapping[str, str], list[float]]]:
    if not isinstance(body, dict) or "data" not in body:
        raise TraceError(path, "", "is not a Prometheus API response (an object with status and data)")
    if body.get("status") != "success":
        raise TraceError(path, "", f"the query did not succeed: {body.get('error') or body.get('status')!r}")
    data = body["data"]
    kind = data.get("resultType") if isinstance(data, dict) else None
    if kind not in ("matrix", "vector"):
        raise TraceError(path, "data.resultType", f"{kind!r}; accepted: matrix (query_range), vector (query)")
    result = data.get("result")
    if not isinstance(result, list):
        raise TraceError(path, "data.result", "must be a list of series")
    for i, series in enumerate(result):
        where = f"data.result[{i}]"
        labels = series.get("metric") if isinstance(series, dict) else None
        if not isinstance(labels, dict):
            raise TraceError(path, where, "must have a 'metric' object of labels")
        name = labels.get("__name__")
        if not isinstance(name, str):
            raise TraceError(
                path,
                where,
                "has no __name__: query the series themselves, such as "
                '{__name__=~"gpuslice_share_memory_(used|allocated)_mib"}',
            )
        points = series.get("values") if kind == "matrix" else [series.get("value")]
        if not isinstance(points, list) or not all(isinstance(p, list) and len(p) == 2 for p in points):
            raise TraceError(path, where, f"{'values' if kind == 'matrix' else 'value'} must be [time, value] pairs")
        values = [_number(path, where, p[1]) for p in points]
        yield name, labels, [v for v in values if v is not None]


def _series_of_text(path: Path, text: str) -> Iterable[tuple[str, Mapping[str, str], list[float]]]:
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as exc:
        raise TraceError(path, "", f"is neither a Prometheus API response (JSON) nor metrics text: {exc}") from None
    for family in families:
        for sample in family.samples:
            value = _number(path, sample.name, sample.value)
            yield sample.name, sample.labels, [] if value is None else [value]


def read(paths: Iterable[Path]) -> dict[tuple[str, str], ShareRecord]:
    """(pod, GPU UUID) -> the share's figures over every file."""
    out: dict[tuple[str, str], ShareRecord] = {}
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise TraceError(path, "", f"cannot be read: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise TraceError(path, "", "is not UTF-8 text") from None
        series: Iterable[tuple[str, Mapping[str, str], list[float]]]
        if text.lstrip().startswith("{"):
            try:
                body: Any = json.loads(text)
            except ValueError as exc:
                raise TraceError(path, "", f"is not valid JSON: {exc}") from None
            series = _series_of_json(path, body)
        else:
            series = _series_of_text(path, text)
        found = 0
        for name, labels, values in series:
            if name not in (USED, ALLOCATED):
                continue
            missing = [k for k in KEY_LABELS if not labels.get(k)]
            if missing:
                raise TraceError(path, name, f"a series without the label {missing[0]!r} (labels: {dict(labels)})")
            found += 1
            key = (f"{labels['namespace']}/{labels['pod']}", labels["uuid"])
            record = out.get(key) or ShareRecord(
                key[0],
                key[1],
                node=str(labels.get("node", "")),
                gpu=str(labels.get("gpu", "")),
                model=str(labels.get("model", "")),
                mode=str(labels.get("mode", "")),
                mig_profile=str(labels.get("mig_profile", "")),
            )
            if values and name == USED:
                peak = max(values) if record.peak_mib is None else max(record.peak_mib, *values)
                record = replace(record, peak_mib=math.ceil(peak), samples=record.samples + len(values))
            elif values:
                record = replace(record, allocated_mib=int(max(values)))
            out[key] = record
        if not found:
            raise TraceError(path, "", f"has no {USED} or {ALLOCATED} series")
    return out
