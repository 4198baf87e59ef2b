"""Node inventory from a Kubernetes Node: annotation, then GFD labels, then allocatable."""

from __future__ import annotations

import json
from typing import Any

import pytest

from scheduler.core.errors import InventoryError
from scheduler.core.inventory import SharingMode
from scheduler.core.k8s import parse_node


def node(
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    allocatable: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {"name": "gpu-1", "labels": labels or {}, "annotations": annotations or {}},
        "status": {"allocatable": {"cpu": "31500m", "memory": "128Gi", "pods": "110", **(allocatable or {})}},
    }


def test_inventory_annotation_wins_over_labels() -> None:
    inventory = {
        "devices": [
            {
                "uuid": "GPU-a",
                "index": 0,
                "model": "H100-80GB",
                "mode": "mps",
                "mpsClientLimit": 16,
                "nvlinkPeers": [1],
            },
            {
                "uuid": "GPU-b",
                "index": 1,
                "model": "NVIDIA-H100-80GB-HBM3",
                "mode": "mig",
                "migInstances": [{"profile": "3g.40gb", "start": 4, "uuid": "MIG-b-3g"}],
            },
            {
                "uuid": "GPU-c",
                "index": 2,
                "model": "Custom-X",
                "memoryMiB": 49152,
                "smCount": 100,
                "mode": "time-slicing",
                "replicas": 4,
            },
        ],
        "mpsComputeOversubscriptionPct": 150,
    }
    parsed = parse_node(
        node(labels={"nvidia.com/gpu.count": "8"}, annotations={"gpuslice.io/inventory": json.dumps(inventory)})
    )
    assert (parsed.cpu_milli, parsed.memory_mib, parsed.max_pods) == (31500, 131072, 110)
    a, b, c = parsed.devices
    assert (a.mode, a.mps_client_limit, a.model.name) == (SharingMode.MPS, 16, "H100-80GB")
    assert b.model.name == "H100-80GB" and b.mig_static and b.mig_instances[0].uuid == "MIG-b-3g"
    assert (c.model.name, c.memory_mib, c.replicas) == ("CUSTOM-X", 49152, 4)
    assert parsed.linked(0, 1) and not parsed.linked(0, 2)
    assert parsed.mps_compute_oversub_pct == 150


def test_gfd_labels_time_slicing() -> None:
    # the device plugin advertises 2 GPUs x 4 replicas = 8 in allocatable; the labels say 2 GPUs
    parsed = parse_node(
        node(
            labels={
                "nvidia.com/gpu.product": "Tesla-T4",
                "nvidia.com/gpu.count": "2",
                "nvidia.com/gpu.sharing-strategy": "time-slicing",
                "nvidia.com/gpu.replicas": "4",
            },
            allocatable={"nvidia.com/gpu": "8"},
        )
    )
    assert [(d.uuid, d.mode, d.replicas, d.model.name) for d in parsed.devices] == [
        ("0", SharingMode.TIME_SLICING, 4, "T4"),
        ("1", SharingMode.TIME_SLICING, 4, "T4"),
    ]


def test_gfd_mig_labels_lay_out_a_legal_static_geometry() -> None:
    # 2 GPUs; per GPU 3g (3 slices) + 2g (2) + 2 x 1g (1 each) = 7 slices and 4 + 2 + 1 + 1 = 8 slots
    parsed = parse_node(
        node(
            labels={
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                "nvidia.com/gpu.count": "2",
                "nvidia.com/mig.strategy": "mixed",
                "nvidia.com/mig-3g.40gb.count": "2",
                "nvidia.com/mig-2g.20gb.count": "2",
                "nvidia.com/mig-1g.10gb.count": "4",
                "nvidia.com/mig-1g.10gb.memory": "9728",
            }
        )
    )
    for device in parsed.devices:
        assert sorted(i.profile.name for i in device.mig_instances) == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]


def test_allocatable_only() -> None:
    parsed = parse_node(node(allocatable={"nvidia.com/gpu": "4"}))
    assert [d.mode for d in parsed.devices] == [SharingMode.EXCLUSIVE] * 4
    assert parse_node(node()).devices == ()


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (node(annotations={"gpuslice.io/inventory": "{"}), "inventory annotation is not JSON"),
        (node(annotations={"gpuslice.io/inventory": '{"devices": 3}'}), "'devices' list"),
        (node(annotations={"gpuslice.io/inventory": '[{"model": "H100", "mode": "warp"}]'}), "mode must be one of"),
        (node(annotations={"gpuslice.io/inventory": '[{"model": "Mystery"}]'}), "needs its memory"),
        (node(annotations={"gpuslice.io/inventory": '[{"model": "T4", "mode": "mig"}]'}), "cannot run MIG"),
        (
            node(
                annotations={
                    "gpuslice.io/inventory": '[{"model": "H100", "mode": "mig", "migInstances": '
                    '[{"profile": "3g.40gb", "start": 2}]}]'
                }
            ),
            "MIG geometry is illegal",
        ),
        (node(annotations={"gpuslice.io/inventory": '[{"index": 1, "model": "H100"}]'}), "without gaps"),
        (node(labels={"nvidia.com/gpu.count": "two"}), "must be a whole number"),
        (node(labels={"nvidia.com/gpu.product": "T4", "nvidia.com/mig-1g.10gb.count": "1"}), "no MIG layout"),
        (
            node(labels={"nvidia.com/gpu.sharing-strategy": "magic", "nvidia.com/gpu.count": "1"}),
            "sharing-strategy must be",
        ),
        ({"metadata": {}}, "no metadata.name"),
        (node(allocatable={"cpu": "many"}), "malformed quantity"),
    ],
)
def test_malformed_inventory_names_the_node_and_field(raw: dict[str, Any], fragment: str) -> None:
    with pytest.raises(InventoryError, match=None) as caught:
        parse_node(raw)
    assert fragment in str(caught.value)
