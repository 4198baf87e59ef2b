"""What the node agent measured on a node, as the ``<prefix>usage`` annotation of its Node.

The agent writes it (at most every ``measure.publishSeconds``, and only when a figure
changed); the extender reads it for ``gpuslice inspect`` and ``/debug/nodes`` only: placement
never reads it. The memory that stray processes hold, which placement must see, is in the
inventory annotation (``strayMemoryMiB`` per device), where a change is a change of the node.
Keeping the two apart means a pod's use changing every few seconds never makes the extender
rebuild a node's state.

    {"at": "2026-01-01T00:00:00Z",
     "pods": {"team-a/train": [{"index": 0, "usedMiB": 3072, "usedComputeMilli": 410, "overrun": true}]},
     "stray": [{"index": 1, "pid": 4242, "memoryMiB": 2048, "why": "host process python3"}],
     "strayOmitted": 0}

``usedComputeMilli`` is left out where NVML gives no per-process utilisation (MIG instances);
``overrun`` is there only while the share has been above its memory past the grace period;
``stray`` lists at most :data:`MAX_STRAY` processes, ``strayOmitted`` counts the rest.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import InventoryError

MAX_STRAY = 20
USAGE_KEYS = frozenset({"at", "pods", "stray", "strayOmitted"})
SHARE_KEYS = frozenset({"index", "usedMiB", "usedComputeMilli", "overrun"})
STRAY_KEYS = frozenset({"index", "pid", "memoryMiB", "why"})


@dataclass(frozen=True, slots=True)
class MeasuredShare:
    """One share's measured use on one GPU (the sum over the pod's processes there)."""

    index: int
    used_memory_mib: int
    used_compute_milli: int | None = None  # None: NVML gives no per-process utilisation here
    overrun: bool = False


@dataclass(frozen=True, slots=True)
class StrayUse:
    """A process on a GPU that no allocation record on that GPU accounts for."""

    index: int
    pid: int
    memory_mib: int
    why: str  # whose it is, as far as the agent can tell ("host process nvidia-smi", ...)


@dataclass(frozen=True, slots=True)
class Measured:
    at: str = ""  # when the agent sampled (RFC 3339)
    pods: Mapping[str, tuple[MeasuredShare, ...]] = field(default_factory=dict)
    stray: tuple[StrayUse, ...] = ()
    stray_omitted: int = 0


def _problem(node: str, what: str) -> InventoryError:
    return InventoryError(f"node {node}: usage annotation: {what}")


def _int(node: str, raw: Mapping[str, Any], key: str, where: str) -> int:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _problem(node, f"{where}.{key} must be an integer >= 0, got {value!r}")
    return value


def _object(node: str, raw: object, keys: frozenset[str], where: str) -> Mapping[str, Any]:
    if not isinstance(raw, dict):
        raise _problem(node, f"{where} must be an object")
    unknown = sorted(set(raw) - keys)
    if unknown:
        raise _problem(node, f"{where}.{unknown[0]}: unknown key; accepted: {', '.join(sorted(keys))}")
    return raw


def parse_usage(node: str, text: object) -> Measured:
    """The annotation's figures; :class:`InventoryError` names the node and the field."""
    try:
        body = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError) as exc:
        raise _problem(node, f"not JSON: {exc}") from exc
    top = _object(node, body, USAGE_KEYS, "usage")
    at = top.get("at", "")
    if not isinstance(at, str):
        raise _problem(node, f"at must be a timestamp string, got {at!r}")
    pods_raw = top.get("pods", {})
    if not isinstance(pods_raw, dict):
        raise _problem(node, "pods must be an object of pod -> shares")
    pods: dict[str, tuple[MeasuredShare, ...]] = {}
    for key, shares in pods_raw.items():
        if not isinstance(shares, list):
            raise _problem(node, f"pods[{key!r}] must be a list of shares")
        out = []
        for k, raw in enumerate(shares):
            where = f"pods[{key!r}][{k}]"
            share = _object(node, raw, SHARE_KEYS, where)
            compute = share.get("usedComputeMilli")
            overrun = share.get("overrun", False)
            if not isinstance(overrun, bool):
                raise _problem(node, f"{where}.overrun must be true or false")
            out.append(
                MeasuredShare(
                    _int(node, share, "index", where),
                    _int(node, share, "usedMiB", where),
                    None if compute is None else _int(node, share, "usedComputeMilli", where),
                    overrun,
                )
            )
        pods[str(key)] = tuple(out)
    stray_raw = top.get("stray", [])
    if not isinstance(stray_raw, list):
        raise _problem(node, "stray must be a list of processes")
    strays = []
    for k, raw in enumerate(stray_raw):
        where = f"stray[{k}]"
        one = _object(node, raw, STRAY_KEYS, where)
        why = one.get("why", "")
        if not isinstance(why, str):
            raise _problem(node, f"{where}.why must be a string")
        strays.append(
            StrayUse(
                _int(node, one, "index", where), _int(node, one, "pid", where), _int(node, one, "memoryMiB", where), why
            )
        )
    omitted = _int(node, top, "strayOmitted", "usage") if "strayOmitted" in top else 0
    return Measured(at, pods, tuple(strays), omitted)


def usage_annotation(measured: Measured) -> str:
    """The annotation text of ``measured``, which :func:`parse_usage` reads back to the same figures.

    Strays past :data:`MAX_STRAY` are counted in ``strayOmitted``, largest memory kept first."""
    pods = {}
    for key, shares in sorted(measured.pods.items()):
        rows = []
        for s in shares:
            row: dict[str, Any] = {"index": s.index, "usedMiB": s.used_memory_mib}
            if s.used_compute_milli is not None:
                row["usedComputeMilli"] = s.used_compute_milli
            if s.overrun:
                row["overrun"] = True
            rows.append(row)
        pods[key] = rows
    ordered = sorted(measured.stray, key=lambda s: (-s.memory_mib, s.index, s.pid))
    kept = ordered[:MAX_STRAY]
    body: dict[str, Any] = {
        "at": measured.at,
        "pods": pods,
        "stray": [{"index": s.index, "pid": s.pid, "memoryMiB": s.memory_mib, "why": s.why} for s in kept],
        "strayOmitted": measured.stray_omitted + len(ordered) - len(kept),
    }
    return json.dumps(body, separators=(",", ":"), sort_keys=True)
