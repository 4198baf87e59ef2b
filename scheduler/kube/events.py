"""Kubernetes Events (``v1``), as ``kubectl describe`` lists them under their object.

A Node is cluster-scoped, so its Events live in the ``default`` namespace, and their
``involvedObject.uid`` is the node's name, as kubelet's own are (``kubectl describe node``
matches either).
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from .clock import rfc3339

NODE_EVENTS_NAMESPACE = "default"
MAX_MESSAGE = 1024  # the API server refuses longer messages


def event(
    involved: Mapping[str, str],
    namespace: str,
    kind: str,
    reason: str,
    message: str,
    now: datetime,
    component: str,
    host: str,
) -> dict[str, Any]:
    """An Event of ``kind`` (Warning or Normal) about the object ``involved`` (its apiVersion,
    kind, name and, where it has them, namespace and uid), from ``component`` on ``host``."""
    stamp = rfc3339(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{involved['name']}.{uuid.uuid4().hex[:12]}", "namespace": namespace},
        "involvedObject": dict(involved),
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "type": kind,
        "source": {"component": component, "host": host},
        "reportingComponent": component,
        "reportingInstance": host,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def node_event(node: str, kind: str, reason: str, message: str, now: datetime) -> dict[str, Any]:
    """An Event about ``node`` from gpuslice (this process's host), ready to create."""
    involved = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node}
    return event(involved, NODE_EVENTS_NAMESPACE, kind, reason, message, now, "gpuslice", socket.gethostname())
