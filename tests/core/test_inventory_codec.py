"""The inventory annotation's codec, and the three things the node agent adds to it: health,
MIG instances made by hand on a dynamic-MIG GPU, and memory held by stray processes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core import mig as migs
from scheduler.core.allocation import MigSlot
from scheduler.core.catalog import CATALOG, GpuModel
from scheduler.core.errors import InventoryError
from scheduler.core.fit import fit
from scheduler.core.inventory import Device, MigInstance, Node, SharingMode
from scheduler.core.k8s import DEVICE_KEYS, INVENTORY_KEYS, inventory_annotation, parse_node
from scheduler.core.request import parse_pod
from scheduler.core.state import NodeState
from tests.builders import make_device, pod


def as_k8s(node: Node, text: str) -> dict[str, Any]:
    return {
        "metadata": {"name": node.name, "annotations": {"gpuslice.io/inventory": text}},
        "status": {"allocatable": {"cpu": f"{node.cpu_milli}m", "memory": f"{node.memory_mib}Mi", "pods": "110"}},
    }


def reparse(node: Node) -> Node:
    return parse_node(as_k8s(node, inventory_annotation(node)))


@st.composite
def legal_instances(draw: st.DrawFn, model: GpuModel, uuid_prefix: str) -> tuple[MigInstance, ...]:
    """Instances placed one by one at a legal free start (so any subset is legal too)."""
    layout = model.mig
    assert layout is not None
    used: tuple[MigSlot, ...] = ()
    out = []
    for k in range(draw(st.integers(0, 4))):
        profile = draw(st.sampled_from(layout.profiles))
        starts = migs.free_starts(layout, used, profile)
        if not starts:
            continue
        start = draw(st.sampled_from(starts))
        used = (*used, migs.slot_of(profile, start))
        out.append(MigInstance(profile, start, f"MIG-{uuid_prefix}-{k}"))
    return tuple(out)


@st.composite
def devices(draw: st.DrawFn, index: int) -> Device:
    base = draw(st.sampled_from(sorted(CATALOG)))
    model = CATALOG[base]
    if draw(st.booleans()):  # NVML reports a little less memory than the catalogue's round figure
        model = GpuModel(model.name, model.memory_mib - draw(st.integers(1, 600)), model.sm_count, model.mig)
    modes = [SharingMode.EXCLUSIVE, SharingMode.MPS, SharingMode.TIME_SLICING]
    if model.mig is not None:
        modes.append(SharingMode.MIG)
    mode = draw(st.sampled_from(modes))
    options: dict[str, Any] = {
        "mps_client_limit": draw(st.integers(1, 48)),
        "replicas": draw(st.integers(1, 8)),
    }
    reason = draw(st.sampled_from(["", "XID 79: GPU has fallen off the bus", "XID 48: double-bit ECC error"]))
    options.update(healthy=not reason, unhealthy_reason=reason)
    options["stray_memory_mib"] = draw(st.sampled_from([0, 0, 256, 4096, model.memory_mib]))
    if mode is SharingMode.MIG:
        assert model.mig is not None
        instances = draw(legal_instances(model, f"{index}"))
        if draw(st.booleans()):
            options["mig_instances"] = instances
        else:
            cut = draw(st.integers(0, len(instances)))
            options["mig_taken"] = instances[:cut]
            options["mig_managed"] = instances[cut:]
            names = [p.name for p in model.mig.profiles]
            options["mig_allowed"] = tuple(draw(st.lists(st.sampled_from(names), unique=True, max_size=3)))
    return Device(f"GPU-{index}-{base}", index, model, mode, **options)


@st.composite
def nodes(draw: st.DrawFn) -> Node:
    count = draw(st.integers(0, 5))
    devs = tuple(draw(devices(i)) for i in range(count))
    pairs = [(a, b) for a in range(count) for b in range(a + 1, count)]
    links = frozenset(draw(st.lists(st.sampled_from(pairs), unique=True))) if pairs else frozenset()
    return Node(
        "gpu-1",
        32_000,
        256_000,
        devs,
        110,
        links,
        draw(st.integers(100, 300)),
        draw(st.integers(100, 300)),
    )


@settings(max_examples=150, deadline=None)
@given(nodes())
def test_parse_of_the_serialised_inventory_is_the_node(node: Node) -> None:
    assert reparse(node) == node
    body = json.loads(inventory_annotation(node))
    assert set(body) <= set(INVENTORY_KEYS)  # only keys the parser reads
    assert all(set(d) <= set(DEVICE_KEYS) for d in body["devices"])


def test_an_unhealthy_gpu_gets_nothing_new_and_says_why() -> None:
    node = Node(
        "gpu-1",
        32_000,
        256_000,
        (
            make_device(
                0, "L4", "mps", uuid="GPU-a", healthy=False, unhealthy_reason="XID 79: GPU has fallen off the bus"
            ),
            make_device(1, "L4", "mps", uuid="GPU-b"),
        ),
    )
    state = NodeState.empty(reparse(node))
    demand = parse_pod(pod(annotations={"gpuslice.io/gpu-fraction": "0.5"})).demand
    (only,) = fit(demand, state).allocations
    assert [s.index for s in only.shares] == [1]
    sick = NodeState.empty(reparse(Node("gpu-1", 32_000, 256_000, node.devices[:1])))
    assert fit(demand, sick).reason == "GPU 0 is unhealthy: XID 79: GPU has fallen off the bus"


def test_a_record_on_a_gpu_that_turned_unhealthy_still_counts() -> None:
    from scheduler.core.allocation import encode_record
    from scheduler.core.state import rebuild

    healthy = Node("gpu-1", 32_000, 256_000, (make_device(0, "L4", "mps", uuid="GPU-a"),))
    demand = parse_pod(pod(annotations={"gpuslice.io/gpu-fraction": "0.5"})).demand
    (alloc,) = fit(demand, NodeState.empty(healthy)).allocations
    sick = Node(
        "gpu-1", 32_000, 256_000, (make_device(0, "L4", "mps", uuid="GPU-a", healthy=False, unhealthy_reason="XID 79"),)
    )
    state, problems = rebuild(sick, [("default/p", encode_record(alloc))])
    assert problems == [] and state.usage[0].shares == 1


def test_a_slot_made_by_hand_is_taken_on_a_dynamic_gpu() -> None:
    layout = CATALOG["A100-80GB"].mig
    assert layout is not None
    four = layout.profile("4g.40gb")
    assert four is not None
    hand = MigInstance(four, 0, "MIG-hand")
    node = Node("gpu-1", 32_000, 256_000, (make_device(0, "A100-80GB", "mig", uuid="GPU-a", mig_taken=(hand,)),))
    state = NodeState.empty(reparse(node))
    big = parse_pod(pod(annotations={"gpuslice.io/mig-profile": "4g.40gb"})).demand
    assert fit(big, state).reason == "no free MIG slot for 4g.40gb"
    three = parse_pod(pod(annotations={"gpuslice.io/mig-profile": "3g.40gb"})).demand
    (alloc,) = fit(three, state).allocations
    assert alloc.shares[0].mig is not None and alloc.shares[0].mig.start == 4


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ({"healthy": "no"}, "healthy must be true or false"),
        ({"healthy": True, "unhealthyReason": "x"}, "only beside healthy: false"),
        (
            {"mode": "mig", "migTaken": {"profile": "1g.10gb"}},
            "key 'migTaken' must be a list of {profile, start, uuid}",
        ),
        (
            {
                "mode": "mig",
                "migInstances": [{"profile": "7g.80gb", "start": 0}],
                "migTaken": [{"profile": "7g.80gb", "start": 0}],
            },
            "a static geometry lists every instance in migInstances",
        ),
        (
            {"mode": "mig", "migTaken": [{"profile": "4g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 0}]},
            "MIG geometry is illegal",
        ),
    ],
)
def test_bad_agent_fields_are_named(device: dict[str, Any], message: str) -> None:
    raw = {"index": 0, "uuid": "GPU-a", "model": "A100-80GB", **device}
    node = {"metadata": {"name": "gpu-1", "annotations": {"gpuslice.io/inventory": json.dumps([raw])}}}
    with pytest.raises(InventoryError, match=message):
        parse_node(node)


def test_unhealthy_without_a_reason_still_says_so() -> None:
    raw = [{"index": 0, "model": "L4", "healthy": False}]
    node = parse_node({"metadata": {"name": "gpu-1", "annotations": {"gpuslice.io/inventory": json.dumps(raw)}}})
    assert (node.devices[0].healthy, node.devices[0].unhealthy_reason) == (False, "reported unhealthy")


def stray_node(mode: str, stray: int, **options: Any) -> Node:
    return Node(
        "gpu-1", 32_000, 256_000, (make_device(0, "L4", mode, uuid="GPU-a", stray_memory_mib=stray),), **options
    )


def share_of(memory: str) -> Any:
    return parse_pod(pod(annotations={"gpuslice.io/gpu-memory": memory})).demand


@pytest.mark.parametrize("mode", ["mps", "time-slicing"])
def test_stray_memory_is_not_free_to_new_shares(mode: str) -> None:
    # L4: 23034 MiB (the catalogue's). 8192 MiB stray leaves 23034 - 8192 = 14842 MiB: 14 GiB fits, 15 GiB does not
    state = NodeState.empty(reparse(stray_node(mode, 8192, ts_memory_oversub_pct=100)))
    assert state.node.devices[0].stray_memory_mib == 8192
    assert state.free()[0].memory_mib == 23034 - 8192
    assert fit(share_of("14Gi"), state)
    assert fit(share_of("15Gi"), state).reason == "needs 15360 MiB on one GPU, more than is free"
    # without the stray the same share fits
    assert fit(share_of("15Gi"), NodeState.empty(reparse(stray_node(mode, 0))))


def test_stray_memory_counts_beside_the_records() -> None:
    # 8 GiB recorded + 8 GiB stray on an L4 (23034 MiB): 23034 - 16384 = 6650 MiB left
    state = NodeState.empty(reparse(stray_node("mps", 8192)))
    state = state.apply("default/a", fit(share_of("8Gi"), state).allocations[0])
    assert state.free()[0].memory_mib == 6650
    assert fit(share_of("6Gi"), state) and not fit(share_of("7Gi"), state)


def test_an_exclusive_gpu_with_a_stray_process_is_not_free() -> None:
    state = NodeState.empty(reparse(stray_node("exclusive", 300)))
    whole = parse_pod(pod(gpus=1)).demand
    assert fit(whole, state).reason == "GPU 0 is not free: 300 MiB held by processes no allocation record accounts for"
    assert state.free()[0].milli == 0 and "stray 300 MiB" in state.free()[0].detail


def test_a_record_on_a_gpu_with_stray_memory_still_counts() -> None:
    # the records hold what they hold: stray memory refuses new shares, never old records
    from scheduler.core.allocation import encode_record
    from scheduler.core.state import rebuild

    (alloc,) = fit(share_of("20Gi"), NodeState.empty(reparse(stray_node("mps", 0)))).allocations
    state, problems = rebuild(reparse(stray_node("mps", 8192)), [("default/p", encode_record(alloc))])
    assert problems == [] and state.usage[0].memory_mib == 20480
    assert state.free()[0].memory_mib == 0


def test_stray_memory_on_a_mig_gpu_does_not_take_free_slots() -> None:
    node = Node("gpu-1", 32_000, 256_000, (make_device(0, "A100-80GB", "mig", uuid="GPU-a", stray_memory_mib=4096),))
    state = NodeState.empty(reparse(node))
    seven = parse_pod(pod(annotations={"gpuslice.io/mig-profile": "7g.80gb"})).demand
    assert fit(seven, state)


def test_a_bad_stray_figure_is_named() -> None:
    raw = [{"index": 0, "uuid": "GPU-a", "model": "L4", "mode": "mps", "strayMemoryMiB": -1}]
    with pytest.raises(InventoryError, match="key 'strayMemoryMiB' must be a whole number >= 0, got -1"):
        parse_node({"metadata": {"name": "gpu-1", "annotations": {"gpuslice.io/inventory": json.dumps(raw)}}})
