"""A small packing demo: a mixed cluster, a handful of annotated pods, one policy."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from scheduler.core.catalog import CATALOG
from scheduler.core.inventory import Device, MigInstance, Node, SharingMode
from scheduler.core.policies import make_policy
from scheduler.core.request import parse_pod
from scheduler.core.select import Scoreboard
from scheduler.core.state import NodeState


def demo_cluster() -> list[Node]:
    h100, a100, l4, t4 = CATALOG["H100-80GB"], CATALOG["A100-80GB"], CATALOG["L4"], CATALOG["T4"]
    assert a100.mig is not None
    p3g, p1g = a100.mig.profile("3g.40gb"), a100.mig.profile("1g.10gb")
    assert p3g is not None and p1g is not None
    static = (
        MigInstance(p3g, 4, "MIG-a100-0-3g"),
        MigInstance(p1g, 0, "MIG-a100-0-1g-a"),
        MigInstance(p1g, 1, "MIG-a100-0-1g-b"),
    )
    return [
        Node("h100-mig", 64_000, 512_000, tuple(Device(f"GPU-h100-{i}", i, h100, SharingMode.MIG) for i in range(2))),
        Node("a100-static", 64_000, 512_000, (Device("GPU-a100-0", 0, a100, SharingMode.MIG, mig_instances=static),)),
        Node("l4-mps", 32_000, 128_000, tuple(Device(f"GPU-l4-{i}", i, l4, SharingMode.MPS) for i in range(2))),
        Node("t4-ts", 16_000, 64_000, (Device("GPU-t4-0", 0, t4, SharingMode.TIME_SLICING, replicas=4),)),
        Node(
            "h100-x4",
            96_000,
            768_000,
            tuple(Device(f"GPU-x4-{i}", i, h100) for i in range(4)),
            nvlink=frozenset({(0, 1), (2, 3), (1, 2)}),
        ),
    ]


def _pod(name: str, annotations: dict[str, str], gpus: int = 0) -> dict[str, Any]:
    resources = {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"nvidia.com/gpu": gpus} if gpus else {}}
    return {
        "metadata": {"name": name, "namespace": "demo", "annotations": annotations},
        "spec": {"containers": [{"name": "main", "resources": resources}]},
    }


DEMO_PODS = [
    _pod("notebook-half", {"gpuslice.io/gpu-fraction": "0.5"}),
    _pod("mig-3g", {"gpuslice.io/mig-profile": "3g.40gb"}),
    _pod("mig-1g", {"gpuslice.io/mig-profile": "1g.10gb"}),
    _pod("infer-mps", {"gpuslice.io/gpu-memory": "8Gi", "gpuslice.io/gpu-compute": "25", "gpuslice.io/sharing": "mps"}),
    _pod("batch-ts", {"gpuslice.io/gpu-memory": "4Gi", "gpuslice.io/sharing": "time-slicing"}),
    _pod("train-2gpu", {}, gpus=2),
    _pod("too-big", {"gpuslice.io/gpu-memory": "200Gi"}),
]


def run_demo(policy_name: str = "fgd") -> None:
    policy = make_policy(policy_name)
    board = Scoreboard(NodeState.empty(n) for n in demo_cluster())
    table = Table(title=f"gpuslice demo: {len(DEMO_PODS)} pods on {len(board)} nodes, policy {policy_name}")
    for column in ("pod", "request", "node", "score", "share"):
        table.add_column(column)
    for raw in DEMO_PODS:
        pod = parse_pod(raw)
        placement = board.best(policy, pod.demand)
        if placement is None:
            reasons = board.rank(policy, pod.demand).failures
            table.add_row(
                pod.name,
                pod.demand.gpu.describe(),
                "-",
                "-",
                "unschedulable: " + "; ".join(f"{n}: {r}" for n, r in sorted(reasons.items())[:2]),
            )
            continue
        board.put(board.get(placement.node).apply(pod.key, placement.allocation))  # type: ignore[union-attr]
        share = ", ".join(
            f"GPU{s.index} " + (f"{s.mig.profile}@{s.mig.start}" if s.mig else f"{s.memory_mib} MiB/{s.compute_milli}m")
            for s in placement.allocation.shares
        )
        table.add_row(pod.name, pod.demand.gpu.describe(), placement.node, f"{placement.score:.0f}", share)
    Console().print(table)
