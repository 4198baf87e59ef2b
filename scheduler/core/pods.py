"""What a pod is to gpuslice, read from its Kubernetes JSON: its key and uid, whether it has
ended, its node, and which of its allocation records hold a share.

A record holds a share on a node when gpuslice bound the pod there: the pod has not ended,
it is bound to that node (``spec.nodeName``), its ``bind-phase`` is ``bound`` (the phase
gpuslice's Binding writes in the same API write as ``spec.nodeName``) and the record names
that node. Any other record, on a pending pod or on a pod some other binder placed, claims
nothing and blocks nothing. The extender's cache, the Kubernetes binder and the file
backend all ask :func:`holding_record`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .allocation import record_node

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})

# bind-phase: a bind has reserved the share and written the record; the Binding made it
# hold (written with spec.nodeName); the bind gave up.
ALLOCATING = "allocating"
BOUND = "bound"
FAILED = "failed"


def pod_key(namespace: str, name: str) -> str:
    """``namespace/name``: how gpuslice names a pod everywhere."""
    return f"{namespace or 'default'}/{name}"


def _part(obj: Mapping[str, Any], field: str) -> Mapping[str, Any]:
    value = obj.get(field)
    return value if isinstance(value, Mapping) else {}


def key_of(obj: Mapping[str, Any]) -> str:
    meta = _part(obj, "metadata")
    return pod_key(str(meta.get("namespace") or "default"), str(meta.get("name") or ""))


def uid_of(obj: Mapping[str, Any]) -> str:
    uid = _part(obj, "metadata").get("uid")
    return uid if isinstance(uid, str) else ""


def node_of(obj: Mapping[str, Any]) -> str:
    """``spec.nodeName`` ("" while the pod is pending)."""
    node = _part(obj, "spec").get("nodeName")
    return node if isinstance(node, str) else ""


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return _part(_part(obj, "metadata"), "annotations")


def has_ended(obj: Mapping[str, Any]) -> bool:
    return _part(obj, "status").get("phase") in TERMINAL_PHASES


def record_of(obj: Mapping[str, Any], prefix: str) -> str | None:
    """The pod's allocation record as written, whoever wrote it (None if it has none)."""
    text = annotations_of(obj).get(prefix + "allocation")
    return text if isinstance(text, str) else None


def bind_phase(obj: Mapping[str, Any], prefix: str) -> str:
    phase = annotations_of(obj).get(prefix + "bind-phase")
    return phase if isinstance(phase, str) else ""


def holding_record(obj: Mapping[str, Any], prefix: str) -> str | None:
    """The record by which the pod holds a share on its node, or None (see the module).

    A record whose node cannot be read still holds (and is then reported as unreadable by
    whoever decodes it), so that a damaged record is shown, never silently dropped.
    """
    notes = annotations_of(obj)
    text = notes.get(prefix + "allocation")
    if not isinstance(text, str) or notes.get(prefix + "bind-phase") != BOUND or has_ended(obj):
        return None
    node = node_of(obj)
    if not node:
        return None
    owner = record_node(text)
    return text if owner is None or owner == node else None
