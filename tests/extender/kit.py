"""Builders for the extender tests: Kubernetes JSON nodes and pods, a served cluster file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PREFIX = "gpuslice.io/"


def k8s_node(
    name: str,
    gpus: int = 4,
    model: str = "H100-80GB",
    mode: str = "mps",
    cpu: str = "64",
    memory: str = "512Gi",
    **device: Any,
) -> dict[str, Any]:
    """A Node whose GPUs come from the inventory annotation (``gpus=0``: no GPUs at all)."""
    meta: dict[str, Any] = {"name": name, "labels": {"kubernetes.io/hostname": name}}
    if gpus:
        devices = [{"index": i, "uuid": f"{name}-gpu{i}", "model": model, "mode": mode, **device} for i in range(gpus)]
        meta["annotations"] = {PREFIX + "inventory": json.dumps({"devices": devices})}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": meta,
        "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": "110"}},
    }


def k8s_pod(
    name: str,
    namespace: str = "default",
    cpu: str = "1",
    memory: str = "1Gi",
    node: str | None = None,
    phase: str = "Pending",
    version: str = "1",
    **annotations: str,
) -> dict[str, Any]:
    """A Pod; keyword annotations are short keys under the prefix (``gpu_fraction="0.5"``)."""
    spec: dict[str, Any] = {
        "schedulerName": "gpuslice",
        "containers": [{"name": "main", "image": "app:1", "resources": {"requests": {"cpu": cpu, "memory": memory}}}],
    }
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{namespace}-{name}",
            "resourceVersion": version,
            "annotations": {PREFIX + k.replace("_", "-"): v for k, v in annotations.items()},
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def cluster_file(path: Path, *items: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": list(items)}))
    return path


def filter_args(
    pod: dict[str, Any], names: list[str] | None = None, nodes: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    if nodes is not None:
        return {"Pod": pod, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}
    return {"Pod": pod, "Nodes": None, "NodeNames": names}


def binding(pod: dict[str, Any], node: str) -> dict[str, Any]:
    meta = pod["metadata"]
    return {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node}
