"""Builders for the extender tests: Kubernetes JSON nodes and pods, a served cluster file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from scheduler.core.allocation import Allocation, DeviceShare, MigSlot, encode_record
from scheduler.core.inventory import SharingMode

PREFIX = "gpuslice.io/"
H100_MIB = 81920


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


def holding(
    name: str,
    node: str,
    gpu: int,
    milli: int,
    cpu: str = "1",
    priority: int | None = None,
    mig: tuple[str, int, int] | None = None,
    namespace: str = "default",
    owner: str | None = None,
) -> dict[str, Any]:
    """A pod bound to ``node`` by gpuslice, holding ``milli`` of GPU ``gpu`` (MPS, of an
    H100-80GB), or a MIG instance ``(profile, start, size)``; ``owner``: the kind of the
    controller that manages it (``ReplicaSet``, ``DaemonSet``, ...), if any."""
    pod = k8s_pod(name, namespace=namespace, cpu=cpu, node=node, phase="Running")
    if owner is not None:
        pod["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": owner,
                "name": f"{name}-owner",
                "uid": f"owner-{name}",
                "controller": True,
            }
        ]
    if mig is None:
        device = DeviceShare(f"{node}-gpu{gpu}", gpu, SharingMode.MPS, milli * H100_MIB // 1000, milli)
    else:
        profile, start, size = mig
        slices = int(profile[0])
        device = DeviceShare(
            f"{node}-gpu{gpu}",
            gpu,
            SharingMode.MIG,
            size * 10240,
            slices * 1000 // 7,
            MigSlot(start, size, slices, profile),
        )
    cpu_milli = int(float(cpu) * 1000)
    annotations = pod["metadata"]["annotations"]
    annotations[PREFIX + "allocation"] = encode_record(
        Allocation(node, (device,), cpu_milli, 1024), "2025-01-01T00:00:00Z"
    )
    annotations[PREFIX + "bind-phase"] = "bound"
    if priority is not None:
        pod["spec"]["priority"] = priority
    return pod


def fragmented_cluster() -> list[dict[str, Any]]:
    """Two H100s under dynamic MIG on one node, a 3g.40gb pod waiting (DESIGN §4 slots):

    GPU 0: serve/a0 1g@0, serve/a4 1g@4, serve/ds 1g@6 (a DaemonSet's);
    GPU 1: serve/b0 1g@0, serve/lonely 1g@2 (no controller), serve/b4 1g@4.

    A 3g starts at 0 or 4 only, and every start is blocked. The only single move: evict a0 (GPU 0
    slots 0-3 come free; a4 and ds block 4-7 there, and lonely blocks 0-3 of GPU 1); a0 lands
    again on a free slot. ``train/big`` waits for it.
    """
    owned = "ReplicaSet"
    pods = [
        holding("a0", "mig-node", 0, 0, mig=("1g.10gb", 0, 1), namespace="serve", owner=owned),
        holding("a4", "mig-node", 0, 0, mig=("1g.10gb", 4, 1), namespace="serve", owner=owned),
        holding("ds", "mig-node", 0, 0, mig=("1g.10gb", 6, 1), namespace="serve", owner="DaemonSet"),
        holding("b0", "mig-node", 1, 0, mig=("1g.10gb", 0, 1), namespace="serve", owner=owned),
        holding("lonely", "mig-node", 1, 0, mig=("1g.10gb", 2, 1), namespace="serve"),
        holding("b4", "mig-node", 1, 0, mig=("1g.10gb", 4, 1), namespace="serve", owner=owned),
    ]
    for p in pods:
        p["metadata"]["annotations"][PREFIX + "mig-profile"] = "1g.10gb"
    big = k8s_pod("big", namespace="train", mig_profile="3g.40gb")
    return [k8s_node("mig-node", gpus=2, mode="mig"), *pods, big]
