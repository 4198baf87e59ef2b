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


@pytest.mark.parametrize("strategy", ["time-slicing", "mps"])
def test_gfd_sharing_without_a_gpu_count_reads_allocatable_as_gpus_times_replicas(strategy: str) -> None:
    # no nvidia.com/gpu.count label: 8 GPUs x 4 replicas = 32 advertised, 32 / 4 = 8 GPUs (not 32,
    # which would offer 32 x 4 = 128 replicas of 8 real GPUs)
    labels = {
        "nvidia.com/gpu.product": "Tesla-T4",
        "nvidia.com/gpu.sharing-strategy": strategy,
        "nvidia.com/gpu.replicas": "4",
    }
    parsed = parse_node(node(labels=labels, allocatable={"nvidia.com/gpu": "32"}))
    assert [d.index for d in parsed.devices] == list(range(8))
    assert {d.replicas for d in parsed.devices} == {4}
    # 30 is no multiple of 4: not a count of replicas, so the node is not served (one clear line)
    with pytest.raises(InventoryError, match=r"allocatable nvidia.com/gpu 30 is not a multiple of .*replicas 4"):
        parse_node(node(labels=labels, allocatable={"nvidia.com/gpu": "30"}))


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


def inventory(devices: list[dict[str, Any]], **node_keys: Any) -> dict[str, Any]:
    return node(annotations={"gpuslice.io/inventory": json.dumps({"devices": devices, **node_keys})})


H100 = {"uuid": "GPU-a", "index": 0, "model": "H100-80GB"}
DEVICE_KEYS_TEXT = (
    "accepted keys: uuid, index, model, memoryMiB, smCount, mode, migInstances, migProfiles, mpsClientLimit, "
    "replicas, nvlinkPeers, healthy, unhealthyReason, migTaken, migManaged, strayMemoryMiB"
)


# An inventory is never served with defaults guessed around a mistake: each of these is an error
# naming the node, the device, the key and what is accepted.
@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            inventory([{**H100, "mdoe": "mps"}]),
            f"node gpu-1: inventory device 0: unknown key 'mdoe' (did you mean 'mode'?); {DEVICE_KEYS_TEXT}",
        ),
        (
            inventory([{**H100, "nvlink": [1]}]),
            f"node gpu-1: inventory device 0: unknown key 'nvlink' (did you mean 'nvlinkPeers'?); {DEVICE_KEYS_TEXT}",
        ),
        (
            inventory([H100], mpsOversubscriptionPct=150),
            "node gpu-1: inventory: unknown key 'mpsOversubscriptionPct' (did you mean "
            "'mpsComputeOversubscriptionPct'?); accepted keys: devices, mpsComputeOversubscriptionPct, "
            "timeSlicingMemoryOversubscriptionPct",
        ),
        (
            inventory([{**H100, "mode": "mig", "migInstances": [{"profile": "3g.40gb", "start": 4, "uid": "x"}]}]),
            "node gpu-1: inventory device 0: migInstances[0]: unknown key 'uid' (did you mean 'uuid'?); "
            "accepted keys: profile, start, uuid",
        ),
        (
            inventory([{**H100, "index": "0"}]),
            "node gpu-1: inventory device 0: key 'index' must be a whole number >= 0, got '0'",
        ),
        (
            inventory([{**H100, "model": "Custom", "memoryMiB": "80Gi"}]),
            "node gpu-1: inventory device 0: key 'memoryMiB' must be a whole number >= 1, got '80Gi'",
        ),
        (
            inventory([{**H100, "model": 100}]),
            "node gpu-1: inventory device 0: key 'model' must be a GPU model name such as H100-80GB, got 100",
        ),
        (
            inventory([{**H100, "uuid": ""}]),
            "node gpu-1: inventory device 0: key 'uuid' must be a non-empty string (nvidia-smi -L), default the "
            "index, got ''",
        ),
        (
            inventory([{**H100, "mode": "mps", "mpsClientLimit": True}]),
            "node gpu-1: inventory device 0: key 'mpsClientLimit' must be a whole number >= 1, got True",
        ),
        (
            inventory([{**H100, "nvlinkPeers": "1,2"}]),
            "node gpu-1: inventory device 0: key 'nvlinkPeers' must be a list of the indices of the node's other "
            "GPUs, got '1,2'",
        ),
        (
            inventory([{**H100, "nvlinkPeers": [1]}, {**H100, "uuid": "GPU-b", "index": 1, "nvlinkPeers": [0, 2]}]),
            "node gpu-1: inventory device 1: key 'nvlinkPeers' names 2, a GPU the node does not have; accepted: "
            "the indices of the node's other GPUs (0)",
        ),
        (
            inventory([{**H100, "nvlinkPeers": [0]}]),
            "node gpu-1: inventory device 0: key 'nvlinkPeers' names 0, the GPU itself; accepted: the indices of "
            "the node's other GPUs (none)",
        ),
        (
            inventory([{**H100, "mode": "exclusive", "migInstances": [{"profile": "3g.40gb", "start": 4}]}]),
            "node gpu-1: inventory device 0: key 'migInstances' describes MIG, but the GPU's mode is 'exclusive'; "
            "accepted: mode 'mig'",
        ),
        (
            inventory([{**H100, "mode": "mps", "migProfiles": ["1g.10gb"]}]),
            "node gpu-1: inventory device 0: key 'migProfiles' describes MIG, but the GPU's mode is 'mps'; "
            "accepted: mode 'mig'",
        ),
        (
            inventory([{**H100, "mode": "mig", "migProfiles": "1g.10gb"}]),
            "node gpu-1: inventory device 0: key 'migProfiles' must be a list of MIG profile names gpuslice may "
            "create (mode mig), got '1g.10gb'",
        ),
        (
            inventory([H100, {**H100, "index": 1}]),
            "node gpu-1: inventory devices 0 and 1 have the same uuid 'GPU-a'",
        ),
        (
            inventory([H100], timeSlicingMemoryOversubscriptionPct=5000),
            "node gpu-1: inventory: key 'timeSlicingMemoryOversubscriptionPct' must be a whole number from 100 to "
            "1000, got 5000",
        ),
    ],
)
def test_an_invalid_inventory_is_an_error_naming_node_key_and_accepted_keys(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(InventoryError) as caught:
        parse_node(raw)
    assert str(caught.value) == message


def test_every_accepted_key_is_read() -> None:
    # The accepted keys are the parser's: a device using all of them parses, and each one counts.
    from scheduler.core.k8s import DEVICE_KEYS, INVENTORY_KEYS, MIG_INSTANCE_KEYS

    mig = {
        "uuid": "GPU-m",
        "index": 1,
        "model": "A100-80GB",
        "memoryMiB": 81920,
        "smCount": 108,
        "mode": "mig",
        "migInstances": [{"profile": "3g.40gb", "start": 4, "uuid": "MIG-m-3g"}],
        "migProfiles": ["3g.40gb"],
        "mpsClientLimit": 8,
        "replicas": 1,
        "nvlinkPeers": [0],
        "healthy": False,
        "unhealthyReason": "XID 79",
        "migTaken": [],
        "migManaged": [],
        "strayMemoryMiB": 512,
    }
    assert set(mig) == set(DEVICE_KEYS) and set(mig["migInstances"][0]) == set(MIG_INSTANCE_KEYS)
    body = {"devices": [{**H100, "nvlinkPeers": [1]}, mig], "mpsComputeOversubscriptionPct": 150}
    body["timeSlicingMemoryOversubscriptionPct"] = 200
    assert set(body) == set(INVENTORY_KEYS)
    parsed = parse_node(node(annotations={"gpuslice.io/inventory": json.dumps(body)}))
    device = parsed.devices[1]
    assert (device.uuid, device.model.name, device.mode, device.mps_client_limit) == ("GPU-m", "A100-80GB", "mig", 8)
    assert device.mig_instances[0].uuid == "MIG-m-3g" and device.mig_allowed == ("3g.40gb",)
    assert (device.healthy, device.unhealthy_reason, device.stray_memory_mib) == (False, "XID 79", 512)
    assert parsed.linked(0, 1) and (parsed.mps_compute_oversub_pct, parsed.ts_memory_oversub_pct) == (150, 200)


def single_strategy_node(slices: int = 56, product: str = "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb") -> dict[str, Any]:
    """An 8-GPU A100-80GB node as GPU Feature Discovery labels it under the MIG ``single``
    strategy: every 1g.10gb instance presented as a GPU (8 GPUs x 7 instances = 56)."""
    return node(
        labels={
            "nvidia.com/mig.strategy": "single",
            "nvidia.com/gpu.product": product,
            "nvidia.com/gpu.count": str(slices),
            "nvidia.com/gpu.memory": "9728",
        },
        allocatable={"nvidia.com/gpu": str(slices)},
    )


def test_gfd_single_strategy_slices_are_mig_instances_not_whole_gpus() -> None:
    parsed = parse_node(single_strategy_node())
    # 56 instances of 1g.10gb, at most 7 per A100-80GB: 56 / 7 = 8 GPUs in MIG mode
    assert len(parsed.devices) == 8
    assert {d.mode for d in parsed.devices} == {SharingMode.MIG}
    assert {d.model.name for d in parsed.devices} == {"A100-80GB"}
    assert [len(d.mig_instances) for d in parsed.devices] == [7] * 8
    assert {i.profile.name for d in parsed.devices for i in d.mig_instances} == {"1g.10gb"}


def test_gfd_single_strategy_without_a_profile_in_the_product_is_an_error() -> None:
    with pytest.raises(InventoryError, match=r"mig\.strategy is single, but nvidia\.com/gpu\.product"):
        parse_node(single_strategy_node(product="NVIDIA-A100-SXM4-80GB"))


@pytest.mark.parametrize(
    "container",
    [
        {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "16"}}},  # the device plugin's plain request
        {"name": "c"},  # with the annotation below
    ],
)
def test_whole_gpus_never_land_on_single_strategy_slices(container: dict[str, Any]) -> None:
    from scheduler.core.fit import fit
    from scheduler.core.request import parse_pod
    from scheduler.core.state import NodeState

    state = NodeState.empty(parse_node(single_strategy_node()))
    annotations = {} if "resources" in container else {"gpuslice.io/gpu-count": "16"}
    demand = parse_pod({"metadata": {"name": "p", "annotations": annotations}, "spec": {"containers": [container]}})
    found = fit(demand.demand, state)
    # before: 16 "GPUs" taken from the 56 slices; now whole GPUs need a GPU not partitioned by MIG
    assert not found and "partitioned by MIG" in found.reason
    # a slice asked for as one still fits there
    slice_pod = {
        "metadata": {"name": "q", "annotations": {"gpuslice.io/mig-profile": "1g.10gb"}},
        "spec": {"containers": [{"name": "c"}]},
    }
    assert fit(parse_pod(slice_pod).demand, state)


def test_whole_gpus_listing_mig_take_one_single_strategy_slice_per_gpu() -> None:
    from scheduler.core.fit import fit
    from scheduler.core.request import parse_pod
    from scheduler.core.state import NodeState

    state = NodeState.empty(parse_node(single_strategy_node()))

    def plain(gpus: int) -> Any:
        return parse_pod(
            {
                "metadata": {"name": "p", "annotations": {"gpuslice.io/sharing": "mig"}},
                "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
            }
        ).demand

    # 8 GPUs of seven 1g.10gb each: 8 asked get one slice on each physical GPU, never two of one
    found = fit(plain(8), state)
    shares = found.allocations[0].shares
    assert [s.index for s in shares] == list(range(8))
    assert {(s.mig.profile, s.memory_mib) for s in shares if s.mig is not None} == {("1g.10gb", 10240)}
    # all alike, so the lowest slot: the parser placed each GPU's seven at slots 6, 4, 5, 0, 1, 2, 3
    # (the slot rule's order), naming them <index>:<k>, so slot 0 is the fourth, k = 3
    assert [(s.uuid, s.mig.start if s.mig else None) for s in shares] == [(f"{g}:3", 0) for g in range(8)]
    # 16 asked are more GPUs than the node has, whatever its 56 slices
    sixteen = fit(plain(16), state)
    assert not sixteen and sixteen.reason.startswith("needs 16 GPUs for 16 whole GPUs, not that many available")
