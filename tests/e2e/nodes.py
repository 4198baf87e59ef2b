"""Nodes as API objects for the control plane tier (no kubelet registers them): the examples'
companion nodes, and generated GPU nodes labelled as NVIDIA's GPU feature discovery labels them."""

from __future__ import annotations

import copy
from typing import Any

from tests.deploy.manifests import MANIFESTS, documents

TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def example_nodes() -> list[dict[str, Any]]:
    """The nodes of manifests/examples/nodes, with GPU feature discovery's gpu.present label."""
    nodes = [d.obj for d in documents(MANIFESTS / "examples" / "nodes") if d.kind == "Node"]
    for node in nodes:
        node["metadata"]["labels"]["nvidia.com/gpu.present"] = "true"
    return nodes


def gpu_node(
    name: str,
    gpus: int = 8,
    product: str = "NVIDIA-H100-80GB-HBM3",
    memory_mib: int = 81559,
    cpu: int = 192,
    sharing: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A GPU node of ``gpus`` whole GPUs (``sharing``: extra GFD labels, such as time-slicing's)."""
    labels = {
        "kubernetes.io/hostname": name,
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.memory": str(memory_mib),
        **(sharing or {}),
    }
    replicas = int((sharing or {}).get("nvidia.com/gpu.replicas", "1"))
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": [copy.deepcopy(TAINT)]},
        "status": {
            "allocatable": {"cpu": str(cpu), "memory": "1536Gi", "pods": "110", "nvidia.com/gpu": str(gpus * replicas)},
            "capacity": {"cpu": str(cpu), "memory": "1536Gi", "pods": "110", "nvidia.com/gpu": str(gpus * replicas)},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "e2e"}],
        },
    }
