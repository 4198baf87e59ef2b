"""Kubernetes Events (``v1``) about a Node, as ``kubectl describe node`` lists them.

A Node is cluster-scoped, so its Events live in the ``default`` namespace, and their
``involvedObject.uid`` is the node's name, as kubelet's own are (``kubectl describe node``
matches either).
"""

from __future__ import annotations

import socket
import uuid
from datetime import datetime
from typing import Any

from .clock import rfc3339

COMPONENT = "gpuslice"
NODE_EVENTS_NAMESPACE = "default"
MAX_MESSAGE = 1024  # the API server refuses longer messages


def node_event(node: str, kind: str, reason: str, message: str, now: datetime) -> dict[str, Any]:
    """An Event of ``kind`` (Warning or Normal) about ``node``, ready to create."""
    stamp = rfc3339(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{node}.{uuid.uuid4().hex[:12]}", "namespace": NODE_EVENTS_NAMESPACE},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "type": kind,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": socket.gethostname(),
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
