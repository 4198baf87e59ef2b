"""The agent's view of a pod on its node: does gpuslice's record count, and how many of its
containers ask kubelet for a share.

A record counts on the node exactly as it does for the extender: the pod is live (not
Succeeded or Failed), bound to this node, its ``bind-phase`` is ``bound`` (written by
gpuslice's Binding) and the record names this node.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.core.allocation import Allocation, decode_record
from scheduler.core.errors import RecordError

TERMINAL = frozenset({"Succeeded", "Failed"})
BOUND = "bound"


@dataclass(frozen=True, slots=True)
class PodInfo:
    key: str  # namespace/name
    uid: str
    node: str
    live: bool
    allocation: Allocation | None  # the record, if it counts here
    problem: str  # why a record of gpuslice's does not count ("" if none or it counts)
    share_containers: tuple[str, ...]  # containers and init containers requesting the resource
    started: bool  # kubelet has reported a container status: admitted long ago
    order: tuple[str, str, str]  # (record timestamp, creation timestamp, key): kubelet's likely order
    containers: tuple[tuple[str, str], ...] = ()  # (container ID, name) from the container statuses

    def container_name(self, container_id: str) -> str:
        """The name of the container with that runtime ID ("" if the statuses do not list it)."""
        return next((name for cid, name in self.containers if cid == container_id), "") if container_id else ""

    @property
    def namespace(self) -> str:
        return self.key.split("/", 1)[0]

    @property
    def name(self) -> str:
        return self.key.split("/", 1)[1]


def _map(obj: object, key: str) -> Mapping[str, Any]:
    value = obj.get(key) if isinstance(obj, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def share_containers(pod: Mapping[str, Any], resource: str) -> tuple[str, ...]:
    """Names of the containers (init containers first, as kubelet allocates) that request ``resource``."""
    spec = _map(pod, "spec")
    names = []
    for section in ("initContainers", "containers"):
        for container in spec.get(section) or []:
            resources = _map(container, "resources")
            wanted = _map(resources, "limits").get(resource) or _map(resources, "requests").get(resource)
            if wanted is not None and str(wanted).strip() not in ("", "0"):
                names.append(str(container.get("name") or ""))
    return tuple(names)


def pod_info(key: str, pod: Mapping[str, Any], node: str, prefix: str, resource: str) -> PodInfo:
    meta = _map(pod, "metadata")
    annotations = _map(meta, "annotations")
    status = _map(pod, "status")
    bound_to = str(_map(pod, "spec").get("nodeName") or "")
    live = status.get("phase") not in TERMINAL
    text = annotations.get(prefix + "allocation")
    allocation: Allocation | None = None
    problem = ""
    timestamp = ""
    if isinstance(text, str):
        try:
            decoded = decode_record(text, key)
        except RecordError as exc:
            problem = str(exc)
        else:
            if annotations.get(prefix + "bind-phase") != BOUND:
                problem = f"pod {key}: bind-phase is {annotations.get(prefix + 'bind-phase')!r}, not bound"
            elif decoded.node != node or bound_to != node:
                problem = f"pod {key}: record is for node {decoded.node!r}, pod is on {bound_to!r}"
            else:
                allocation = decoded
        try:
            body = json.loads(text)
            timestamp = str(body.get("timestamp") or "") if isinstance(body, dict) else ""
        except ValueError:
            timestamp = ""
    statuses = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    started = any(
        isinstance(s, Mapping) and ("running" in _map(s, "state") or "terminated" in _map(s, "state")) for s in statuses
    )
    # containerID is "<runtime>://<id>" (containerd://, cri-o://, docker://)
    containers = tuple(
        (str(s.get("containerID")).rsplit("://", 1)[-1], str(s.get("name") or ""))
        for s in statuses
        if isinstance(s, Mapping) and s.get("containerID")
    )
    return PodInfo(
        key,
        str(meta.get("uid") or ""),
        bound_to,
        live,
        allocation if live else None,
        problem,
        share_containers(pod, resource),
        started,
        (timestamp, str(meta.get("creationTimestamp") or ""), key),
        containers,
    )
