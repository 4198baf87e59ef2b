"""AdmissionReview v1 bodies shaped as the API server sends them, and a patch applier."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import jsonpatch

from scheduler.webhook import Reply

GPUSLICE_SA = "system:serviceaccount:gpuslice-system:gpuslice"


def container(
    name: str = "main",
    image: str = "nvcr.io/nvidia/pytorch:24.05-py3",
    env: list[dict[str, Any]] | None = None,
    limits: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A container after the API server's defaulting (terminationMessage*, imagePullPolicy)."""
    out: dict[str, Any] = {
        "name": name,
        "image": image,
        "resources": {"limits": dict(limits or {}), "requests": dict(limits or {})} if limits else {},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
    }
    if env is not None:
        out["env"] = env
    return out


def pod(
    annotations: dict[str, Any] | None = None,
    containers: list[dict[str, Any]] | None = None,
    init_containers: list[dict[str, Any]] | None = None,
    scheduler_name: str | None = "default-scheduler",
    name: str = "",
    generate_name: str = "notebook-7d9f-",
) -> dict[str, Any]:
    """A Pod as a ReplicaSet creates it: generateName, no uid yet, defaults applied."""
    spec: dict[str, Any] = {
        "containers": containers if containers is not None else [container()],
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "securityContext": {},
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
        "priority": 0,
        "tolerations": [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
        ],
    }
    if scheduler_name is not None:
        spec["schedulerName"] = scheduler_name
    if init_containers is not None:
        spec["initContainers"] = init_containers
    metadata: dict[str, Any] = {"generateName": generate_name, "namespace": "team-a", "labels": {"app": "nb"}}
    if name:
        metadata["name"] = name
    if annotations is not None:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def review(
    obj: dict[str, Any] | None,
    operation: str = "CREATE",
    old: dict[str, Any] | None = None,
    username: str = "system:serviceaccount:kube-system:replicaset-controller",
    groups: tuple[str, ...] = ("system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"),
    uid: str = "705ab4f5-6393-11e8-b7cc-42010a800002",
) -> dict[str, Any]:
    """An AdmissionReview v1 request for a pod."""
    options = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}.get(operation)
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": _name_of(obj),
            "namespace": "team-a",
            "operation": operation,
            "userInfo": {"username": username, "uid": "0d3c1e0a", "groups": list(groups)},
            "object": obj,
            "oldObject": old,
            "dryRun": False,
            "options": {"kind": options, "apiVersion": "meta.k8s.io/v1"} if options else None,
        },
    }


def _name_of(obj: Any) -> str:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else ""


def patch_of(reply: Reply) -> list[dict[str, Any]]:
    """The JSON Patch in a reply (empty when there is none), checked to be well formed."""
    response = reply.response
    if "patch" not in response:
        assert "patchType" not in response
        return []
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"], validate=True))
    assert isinstance(ops, list) and ops, "a patch, when present, is a non-empty list of operations"
    return ops


def patched(obj: dict[str, Any], reply: Reply) -> dict[str, Any]:
    """The pod after the API server applies the reply's patch (RFC 6902, via ``jsonpatch``)."""
    result: dict[str, Any] = jsonpatch.JsonPatch(patch_of(reply)).apply(copy.deepcopy(obj))
    return result


def env_of(obj: dict[str, Any], index: int = 0, section: str = "containers") -> dict[str, Any]:
    """name -> value or valueFrom of one container's env (asserting names are unique)."""
    entries = obj["spec"][section][index].get("env") or []
    names = [e["name"] for e in entries]
    assert len(names) == len(set(names)), f"duplicate env names {names}"
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in entries}


def from_annotation(key: str) -> dict[str, Any]:
    return {"fieldRef": {"apiVersion": "v1", "fieldPath": f"metadata.annotations['{key}']"}}


AGENT = "system:serviceaccount:gpuslice-agent:gpuslice-agent"
EVICTION_UID = "a8f3c2e1-0000-4000-8000-00000000e71c"


def eviction_review(
    name: str = "train",
    namespace: str = "team-a",
    nodes: list[str] | None = None,
    username: str = AGENT,
    sub_resource: str = "eviction",
    operation: str = "CREATE",
) -> dict[str, Any]:
    """An AdmissionReview v1 for ``POST .../namespaces/<namespace>/pods/<name>/eviction`` by a
    token bound to a pod on ``nodes`` (the agent's: one node; None: no node-name extra)."""
    extra: dict[str, list[str]] = {
        "authentication.kubernetes.io/pod-name": ["gpuslice-agent-x7k2p"],
        "authentication.kubernetes.io/pod-uid": ["5c1e0b7a-agent"],
    }
    if nodes is not None:
        extra["authentication.kubernetes.io/node-name"] = nodes
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": EVICTION_UID,
            "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": sub_resource,
            "requestKind": {"group": "policy", "version": "v1", "kind": "Eviction"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "requestSubResource": sub_resource,
            "name": name,
            "namespace": namespace,
            "operation": operation,
            "userInfo": {
                "username": username,
                "uid": "9b0e-agent-sa",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:gpuslice", "system:authenticated"],
                "extra": extra,
            },
            "object": {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": name, "namespace": namespace},
            },
            "oldObject": None,
            "dryRun": False,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        },
    }
