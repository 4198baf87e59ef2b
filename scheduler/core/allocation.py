"""What a pod was given, and its record in the ``gpuslice.io/allocation`` annotation.

An :class:`Allocation` carries no pod identity, so the same value can be cached per
node state and reused for every pod of the same shape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from .errors import RecordError
from .inventory import SharingMode


class MigSlot(NamedTuple):
    """A MIG instance in use: ``size`` memory slots from ``start``, ``slices`` compute slices.
    A named tuple, not a dataclass: usages holding it are hashed, compared and sorted in every
    fit question, and a tuple does all three in C (ordered by start, then size, slices, profile)."""

    start: int
    size: int
    slices: int
    profile: str


@dataclass(frozen=True, slots=True)
class DeviceShare:
    uuid: str
    index: int
    mode: SharingMode
    memory_mib: int
    compute_milli: int
    mig: MigSlot | None = None


@dataclass(frozen=True, slots=True)
class Allocation:
    node: str
    shares: tuple[DeviceShare, ...] = ()
    cpu_milli: int = 0
    memory_mib: int = 0

    @property
    def visible_devices(self) -> str:
        return ",".join(s.uuid for s in self.shares)

    def mps_thread_percentage(self) -> int | None:
        """CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for an MPS share (the smallest over its GPUs)."""
        values = [-(-s.compute_milli // 10) for s in self.shares if s.mode is SharingMode.MPS]
        return min(values) if values else None

    def mps_memory_limit(self) -> str | None:
        """CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: ``index=NNNM`` per MPS GPU, comma-separated."""
        parts = [f"{s.index}={s.memory_mib}M" for s in self.shares if s.mode is SharingMode.MPS]
        return ",".join(parts) if parts else None


# ---------------------------------------------------------------- record codec


def encode_record(alloc: Allocation, timestamp: str | None = None) -> str:
    """The allocation as the compact JSON stored in the pod annotation."""
    body: dict[str, Any] = {
        "node": alloc.node,
        "devices": [
            {
                "uuid": s.uuid,
                "index": s.index,
                "mode": s.mode.value,
                "memoryMiB": s.memory_mib,
                "computeMilli": s.compute_milli,
                "mig": None
                if s.mig is None
                else {"profile": s.mig.profile, "start": s.mig.start, "size": s.mig.size, "slices": s.mig.slices},
            }
            for s in alloc.shares
        ],
        "cpuMilli": alloc.cpu_milli,
        "memoryMiB": alloc.memory_mib,
    }
    if timestamp is not None:
        body["timestamp"] = timestamp
    # json.dumps' compact, sorted, ASCII-escaped text; orjson writes the same bytes five times
    # faster where every character is ASCII below DEL (it writes the others unescaped)
    fast = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    if fast.isascii() and b"\x7f" not in fast:
        return fast.decode()
    return json.dumps(body, separators=(",", ":"), sort_keys=True)


def _int(pod: str, obj: dict[str, Any], key: str, low: int = 0) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < low or value > 2**40:
        raise RecordError(pod, f"field {key!r} must be an integer >= {low}, got {value!r}")
    return value


def _str(pod: str, obj: dict[str, Any], key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        raise RecordError(pod, f"field {key!r} must be a non-empty string, got {value!r}")
    return value


def decode_record(text: object, pod: str) -> Allocation:
    """Decode an allocation annotation; :class:`RecordError` names the pod and the problem."""
    if not isinstance(text, str):
        raise RecordError(pod, f"allocation record must be a JSON string, got {type(text).__name__}")
    try:
        body = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise RecordError(pod, f"allocation record is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise RecordError(pod, "allocation record must be a JSON object")
    devices = body.get("devices")
    if not isinstance(devices, list):
        raise RecordError(pod, "field 'devices' must be a list")
    shares = []
    for raw in devices:
        if not isinstance(raw, dict):
            raise RecordError(pod, "each entry of 'devices' must be an object")
        try:
            mode = SharingMode(str(raw.get("mode")))
        except ValueError as exc:
            raise RecordError(
                pod, f"field 'mode' must be one of {[m.value for m in SharingMode]}, got {raw.get('mode')!r}"
            ) from exc
        mig_raw = raw.get("mig")
        mig = None
        if mig_raw is not None:
            if not isinstance(mig_raw, dict):
                raise RecordError(pod, "field 'mig' must be an object or null")
            mig = MigSlot(
                _int(pod, mig_raw, "start"),
                _int(pod, mig_raw, "size", 1),
                _int(pod, mig_raw, "slices", 1),
                _str(pod, mig_raw, "profile"),
            )
        if (mig is None) == (mode is SharingMode.MIG):
            raise RecordError(pod, "a MIG share needs 'mig' and only a MIG share may have it")
        shares.append(
            DeviceShare(
                _str(pod, raw, "uuid"),
                _int(pod, raw, "index"),
                mode,
                _int(pod, raw, "memoryMiB"),
                _int(pod, raw, "computeMilli"),
                mig,
            )
        )
    if len({s.index for s in shares}) != len(shares):
        raise RecordError(pod, "the same GPU appears twice in one record")
    return Allocation(_str(pod, body, "node"), tuple(shares), _int(pod, body, "cpuMilli"), _int(pod, body, "memoryMiB"))


def record_header(text: str) -> tuple[str | None, str | None]:
    """The ``node`` and ``timestamp`` of a record, without decoding the rest (None where unreadable)."""
    try:
        body = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None, None
    if not isinstance(body, dict):
        return None, None
    node, stamp = body.get("node"), body.get("timestamp")
    return (node if isinstance(node, str) else None), (stamp if isinstance(stamp, str) else None)


def record_node(text: str) -> str | None:
    """The ``node`` of a record (None if unreadable)."""
    return record_header(text)[0]


def record_annotations(alloc: Allocation, prefix: str, phase: str, timestamp: str) -> dict[str, str]:
    """Every annotation a bind writes on the pod: the record, its phase, and the container's
    environment (visible devices, and for MPS the thread percentage and memory limit)."""
    out = {
        prefix + "allocation": encode_record(alloc, timestamp),
        prefix + "bind-phase": phase,
        prefix + "visible-devices": alloc.visible_devices,
    }
    threads = alloc.mps_thread_percentage()
    if threads is not None:
        out[prefix + "mps-thread-percentage"] = str(threads)
    limit = alloc.mps_memory_limit()
    if limit is not None:
        out[prefix + "mps-memory-limit"] = limit
    return out
