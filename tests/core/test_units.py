"""GPU units (scheduler.core.units): a lower bound of each pod's GPU footprint that kube-scheduler's
NodeResourcesFit checks, which must never refuse a placement gpuslice would make."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.core.catalog import CATALOG, GpuModel, ProfileSpec
from scheduler.core.fit import fit
from scheduler.core.inventory import Node, SharingMode
from scheduler.core.request import Demand, GpuKind, GpuRequest
from scheduler.core.state import NodeState
from scheduler.core.units import REFERENCE_MEMORY_MIB, gpu_units, node_units, per_gpu_units, pod_units
from tests.builders import make_device, make_node, static_mig
from tests.core.test_properties import SETTINGS, demands, nodes

MIG = frozenset({SharingMode.MIG})


@pytest.mark.parametrize(
    ("gpu", "units"),
    [
        (GpuRequest(), 0),
        (GpuRequest(GpuKind.WHOLE, 2), 200),  # 100 per whole GPU
        # may be served by a static MIG GPU's 1-slice instance: 100 x 1 // 7 = 14 per GPU
        (GpuRequest(GpuKind.WHOLE, 1, sharing=MIG), 14),
        # 1g.10gb: 1 of 7 slices on an A100-80GB / H100 (100 // 7 = 14); A100-40GB's 1g.10gb is 1 of 7 too
        (GpuRequest(GpuKind.MIG, 1, profile=ProfileSpec.parse("1g.10gb"), sharing=MIG), 14),
        # 1g.6gb is the A30's (1 of 4 slices: 25) but matches the A100-40GB's 1g.5gb too (within 1 GB): 14
        (GpuRequest(GpuKind.MIG, 1, profile=ProfileSpec.parse("1g.6gb"), sharing=MIG), 14),
        # 2g.12gb only on the A30: 2 of 4 slices = 50
        (GpuRequest(GpuKind.MIG, 1, profile=ProfileSpec.parse("2g.12gb"), sharing=MIG), 50),
        (GpuRequest(GpuKind.MIG, 1, profile=ProfileSpec.parse("7g.80gb"), sharing=MIG), 100),
        (GpuRequest(GpuKind.MIG, 1, profile=ProfileSpec.parse("9g.90gb"), sharing=MIG), 0),  # no model offers it
        (GpuRequest(GpuKind.SHARE, 1, fraction_milli=500), 49),  # (500 - 1) // 10
        (GpuRequest(GpuKind.SHARE, 2, fraction_milli=505), 100),  # (505 - 1) // 10 = 50, on 2 GPUs
        (GpuRequest(GpuKind.SHARE, 1, compute_milli=300), 29),  # compute alone is proportional
        # memory named: 100 x 72192 // 144384 (the catalogue's largest GPU) = 50
        (GpuRequest(GpuKind.SHARE, 1, memory_mib=72_192), 50),
        (GpuRequest(GpuKind.SHARE, 1, memory_mib=72_192, compute_milli=200), 20),  # and a tenth of compute
        (GpuRequest(GpuKind.SHARE, 1, fraction_milli=1), 0),
    ],
)
def test_pod_units(gpu: GpuRequest, units: int) -> None:
    assert pod_units(gpu) == units


def test_reference_is_the_largest_catalogue_gpu() -> None:
    assert REFERENCE_MEMORY_MIB == CATALOG["H200-141GB"].memory_mib == 144_384


def test_gpu_units_scale_with_memory_and_time_slicing_oversubscription() -> None:
    # an H100 on a plain node: 100
    assert node_units(make_node(gpus=8)) == 800
    # time-slicing at 200 percent memory: shares' memory may sum to twice the GPU's
    ts = make_node(gpus=2, mode="time-slicing", ts_memory_oversub_pct=200)
    assert [gpu_units(ts, d) for d in ts.devices] == [200, 200]
    # an unknown model with twice the reference memory: ceil(100 x 288768 / 144384) = 200
    big = GpuModel("B-XXL", 2 * REFERENCE_MEMORY_MIB, 0)
    node = Node("big", 1000, 1000, (make_device(0, big, "mps"),))
    assert node_units(node) == 200


def _unit_sums(state: NodeState, requests: dict[str, GpuRequest]) -> dict[int, int]:
    per_gpu: dict[int, int] = {}
    for key, alloc in state.pods:
        for share in alloc.shares:
            per_gpu[share.index] = per_gpu.get(share.index, 0) + per_gpu_units(requests[key])
    return per_gpu


@SETTINGS
@given(nodes(), st.lists(st.tuples(demands(), st.integers(0, 7)), min_size=1, max_size=6), st.integers(1, 3))
def test_units_never_refuse_a_placement_the_core_makes(node: Node, shapes: list[tuple[Demand, int]], big: int) -> None:
    """Random valid placements by the core's fit, packed until no shape fits any more (host room
    unbounded, so the GPUs are what fills): the units on each GPU stay within what it
    advertises, and the node's within its sum, so NodeResourcesFit never refuses what gpuslice places."""
    node = replace(node, cpu_milli=10**9, memory_mib=10**9, max_pods=10**6)
    if big > 1 and node.devices:  # one GPU of a model larger than the catalogue's
        first = node.devices[0]
        model = GpuModel("B-XXL", big * REFERENCE_MEMORY_MIB // 2 + 1, 0)
        mode = first.mode if first.mode is not SharingMode.MIG else SharingMode.TIME_SLICING
        node = replace(node, devices=(replace(first, model=model, mode=mode, mig_instances=()), *node.devices[1:]))
    state = NodeState.empty(node)
    requests: dict[str, GpuRequest] = {}
    placed = True
    while placed and len(requests) < 200:
        placed = False
        for demand, pick in shapes:
            found = fit(Demand(gpu=demand.gpu), state)
            if found and demand.gpu.kind is not GpuKind.NONE:
                key = f"p{len(requests)}"
                state = state.apply(key, found.allocations[pick % len(found.allocations)])
                requests[key] = demand.gpu
                placed = True
    sums = _unit_sums(state, requests)
    for device in node.devices:
        assert sums.get(device.index, 0) <= gpu_units(node, device), (device, sums)
    assert sum(pod_units(requests[key]) for key, _ in state.pods) <= node_units(node)


def _fill(node: Node, gpu: GpuRequest) -> int:
    """How many pods of ``gpu`` the core packs onto ``node`` (at most 60)."""
    state = NodeState.empty(node)
    count = 0
    while (found := fit(Demand(gpu=gpu), state)) and count < 60:
        state = state.apply(f"p{count}", found.allocations[0])
        count += 1
    return count


@SETTINGS
@given(st.sampled_from(["mps", "time-slicing", "mig"]), st.integers(1, 1000), st.sampled_from(list(CATALOG)))
def test_a_gpu_filled_with_one_fraction_stays_within(mode: str, milli: int, model: str) -> None:
    """Fill one GPU with as many copies of one fraction as fit: the tightest packing of that shape."""
    if mode == "mig" and CATALOG[model].mig is None:
        mode = "mps"
    node = make_node(gpus=1, model=model, mode=mode, device_options={"mps_client_limit": 48, "replicas": 48})
    gpu = GpuRequest(GpuKind.SHARE, 1, fraction_milli=milli)
    assert _fill(node, gpu) * per_gpu_units(gpu) <= gpu_units(node, node.devices[0])


@pytest.mark.parametrize(
    ("node", "gpu", "count"),
    [
        # an H200 under MPS takes two shares of 72000 MiB: 2 x (100 x 72000 // 144384 = 49) = 98
        (make_node(gpus=1, model="H200-141GB", mode="mps"), GpuRequest(GpuKind.SHARE, 1, memory_mib=72_000), 2),
        # a GPU of twice the reference's memory takes four: 4 x 49 = 196, within its ceil(100 x 2) = 200
        (
            Node("big", 1000, 1000, (make_device(0, GpuModel("B-XXL", 2 * REFERENCE_MEMORY_MIB, 0), "mps"),)),
            GpuRequest(GpuKind.SHARE, 1, memory_mib=72_000),
            4,
        ),
        # a static H100 of seven 1g.10gb instances serves seven whole-GPU pods that accept MIG: 7 x 14 = 98
        (
            make_node(
                gpus=1,
                mode="mig",
                device_options={"mig_instances": static_mig("H100-80GB", *[("1g.10gb", i) for i in range(7)])},
            ),
            GpuRequest(GpuKind.WHOLE, 1, sharing=MIG),
            7,
        ),
    ],
)
def test_the_tightest_packings_stay_within(node: Node, gpu: GpuRequest, count: int) -> None:
    assert _fill(node, gpu) == count
    assert count * per_gpu_units(gpu) <= gpu_units(node, node.devices[0])
