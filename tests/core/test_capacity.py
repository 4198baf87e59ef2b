"""One capacity model per sharing mode, with the arithmetic in the comments."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from scheduler.core.allocation import Allocation, DeviceShare
from scheduler.core.capacity import (
    DeviceUsage,
    Refusal,
    add_share,
    free_milli,
    refusal,
    shares_fit,
    stray_refusal,
    usage_row,
)
from scheduler.core.errors import RecordError
from scheduler.core.fit import fit, refused_reason, short_reason
from scheduler.core.inventory import SharingMode
from scheduler.core.modes.shared import (
    COMPUTE_SHORT,
    MEMORY_SHORT,
    SHORT_COMPUTE,
    SHORT_MEMORY,
    STRAY_SHORT,
    rows_add_share,
    rows_fit,
    rows_free_milli,
    rows_refused_free,
    rows_refused_rule,
    rows_shortages,
)
from scheduler.core.request import Demand, GpuKind, GpuRequest
from scheduler.core.state import NodeState
from tests.builders import make_node, make_state


def share(milli: int = 0, memory: int = 0, compute: int = 0, count: int = 1) -> Demand:
    return Demand(
        0, 0, GpuRequest(GpuKind.SHARE, count, fraction_milli=milli, memory_mib=memory, compute_milli=compute)
    )


def whole(count: int = 1) -> Demand:
    return Demand(0, 0, GpuRequest(GpuKind.WHOLE, count))


def fill(state: NodeState, demand: Demand, times: int) -> NodeState:
    for k in range(times):
        found = fit(demand, state)
        assert found, f"pod {k}: {found.reason}"
        state = state.apply(f"p{len(state.pods)}", found.allocations[0])
    return state


def test_exclusive_gives_whole_devices_only_once() -> None:
    state = fill(make_state(gpus=2), whole(), 2)
    assert not fit(whole(), state)
    # part of a GPU never takes an exclusive one: it would waste the other three quarters
    state = make_state(gpus=1)
    assert fit(share(milli=250), state).reason == (
        "GPU 0 is exclusive: part of a GPU needs a shared GPU, or sharing listing exclusive"
    )
    # unless the pod accepts a whole GPU: then it gets all of it (81920 MiB, 1000 milli)
    accepting = Demand(0, 0, replace(share(milli=250).gpu, sharing=frozenset({SharingMode.EXCLUSIVE, SharingMode.MPS})))
    got = fit(accepting, state).allocations[0].shares[0]
    assert (got.memory_mib, got.compute_milli) == (81920, 1000)
    # a share of the whole GPU wastes nothing: served as asked
    got = fit(share(milli=1000), state).allocations[0].shares[0]
    assert (got.memory_mib, got.compute_milli) == (81920, 1000)


def test_mps_caps_memory_compute_and_clients() -> None:
    # H100: 81920 MiB. Four 20 GiB + 25% shares fill memory (4 x 20480 = 81920) and compute (4 x 250 = 1000).
    state = fill(make_state(mode="mps"), share(memory=20480, compute=250), 4)
    assert (state.usage[0].memory_mib, state.usage[0].compute_milli) == (81920, 1000)
    assert not fit(share(memory=1, compute=1), state)
    # compute binds first: 3 x 30% = 90%, a fourth 30% would make 120%
    state = fill(make_state(mode="mps"), share(memory=1024, compute=300), 3)
    assert "compute" in fit(share(memory=1024, compute=300), state).reason
    # the client limit binds: 2 clients allowed
    state = fill(make_state(mode="mps", device_options={"mps_client_limit": 2}), share(memory=1024, compute=10), 2)
    assert "client limit of 2" in fit(share(memory=1024, compute=10), state).reason


def test_mps_compute_oversubscription_is_per_node_and_off_by_default() -> None:
    # with 150%: three 50% shares fit (1500 <= 1500 milli), a fourth does not
    state = fill(make_state(mode="mps", mps_compute_oversub_pct=150), share(memory=1024, compute=500), 3)
    assert not fit(share(memory=1024, compute=500), state)


def test_mps_thread_percentage_and_memory_limit_of_the_allocation() -> None:
    alloc = fit(share(memory=20480, compute=333), make_state(mode="mps")).allocations[0]
    assert alloc.mps_thread_percentage() == 34  # 333 milli = 33.3% -> 34 (rounded up)
    assert alloc.mps_memory_limit() == "0=20480M"


def test_time_slicing_caps_replicas_and_declared_memory() -> None:
    # 4 replicas: a fifth share is refused even with memory left (4 x 8192 = 32768 of 81920 MiB)
    state = fill(make_state(mode="time-slicing", device_options={"replicas": 4}), share(memory=8192), 4)
    assert "no free time-slicing replica" in fit(share(memory=8192), state).reason
    # memory: 40960 + 40960 = 81920 fills the GPU; 10 replicas do not help a third
    state = fill(make_state(mode="time-slicing", device_options={"replicas": 10}), share(memory=40960), 2)
    assert fit(share(memory=40960), state).reason == "needs 40960 MiB on one GPU, more than is free"


def test_time_slicing_memory_oversubscription() -> None:
    # 150%: 81920 x 1.5 = 122880 MiB of declared memory; three 40960 MiB shares fit, a fourth does not
    state = fill(
        make_state(mode="time-slicing", ts_memory_oversub_pct=150, device_options={"replicas": 8}),
        share(memory=40960),
        3,
    )
    assert not fit(share(memory=40960), state)


def test_no_single_share_larger_than_the_device_even_when_oversubscribed() -> None:
    state = make_state(mode="time-slicing", ts_memory_oversub_pct=300, device_options={"replicas": 8})
    assert "has 81920 MiB" in fit(share(memory=90000), state).reason


def test_fraction_resolves_per_device_and_rounds_memory_down() -> None:
    # 0.333 GPU each; memory rounds down, so three never exceed the GPU
    state = fill(make_state(mode="mps"), share(milli=333), 3)
    assert state.usage[0].memory_mib == 3 * 27279  # 333/1000 x 81920 = 27279.36 -> 27279
    assert state.usage[0].compute_milli == 999


def test_memory_only_request_takes_proportional_compute() -> None:
    # 20480 of 81920 MiB = 25% -> 250 milli of compute
    got = fit(share(memory=20480), make_state(mode="mps")).allocations[0].shares[0]
    assert (got.memory_mib, got.compute_milli) == (20480, 250)


def test_whole_request_on_a_shared_gpu_needs_it_empty_and_blocks_it() -> None:
    state = fill(make_state(mode="mps", gpus=2), share(milli=100), 1)
    got = fit(whole(), state)
    assert [a.shares[0].index for a in got.allocations] == [1]
    state = state.apply("w", got.allocations[0])
    assert state.usage[1].whole
    assert [a.shares[0].index for a in fit(share(milli=100), state).allocations] == [0]


@pytest.mark.parametrize(
    ("mode", "options", "used", "expected"),
    [
        ("exclusive", {}, [], 1000),
        ("exclusive", {}, [(81920, 1000)], 0),
        ("mps", {}, [(20480, 500)], 500),  # compute 500 free, memory 75% free -> 500
        ("mps", {}, [(61440, 100)], 250),  # memory 25% free binds
        ("time-slicing", {"replicas": 2}, [(20480, 0)], 750),
        ("time-slicing", {"replicas": 1}, [(20480, 0)], 0),  # no replica left
    ],
)
def test_free_milli_per_mode(mode: str, options: dict[str, int], used: list[tuple[int, int]], expected: int) -> None:
    state = make_state(mode=mode, device_options=options)
    device = state.node.devices[0]
    for k, (memory, compute) in enumerate(used):
        state = state.apply(f"p{k}", Allocation("n1", (DeviceShare(device.uuid, 0, device.mode, memory, compute),)))
    assert free_milli(state.node, device, state.usage[0]) == expected


def test_apply_refuses_over_capacity_records_and_release_restores() -> None:
    state = make_state(mode="mps")
    device = state.node.devices[0]
    big = Allocation("n1", (DeviceShare(device.uuid, 0, device.mode, 50_000, 600),))
    after = state.apply("a", big)
    message = "pod b: conflicts on node n1: needs 60 percent compute on one GPU, more than is free"
    with pytest.raises(RecordError, match=message):
        after.apply("b", big)
    with pytest.raises(RecordError, match="already has an allocation"):
        after.apply("a", big)
    with pytest.raises(RecordError, match="GPU index 3 does not exist"):
        state.apply("c", Allocation("n1", (DeviceShare(device.uuid, 3, device.mode, 1, 1),)))
    with pytest.raises(RecordError, match="GPU 0 of node n1 is n1-gpu0, not GPU-x"):
        state.apply("c", Allocation("n1", (DeviceShare("GPU-x", 0, device.mode, 1, 1),)))
    with pytest.raises(RecordError, match="not 'n1'"):
        state.apply("c", Allocation("n2", ()))
    assert after.release("a") == state
    assert after.release("unknown") is after


def test_node_cpu_memory_and_pod_count_are_checked() -> None:
    state = make_state(cpu_milli=1000, memory_mib=1024, max_pods=1)
    assert fit(Demand(2000, 0), state).reason == "insufficient cpu: needs 2000m"
    assert fit(Demand(0, 2048), state).reason == "insufficient memory: needs 2048 MiB"
    state = state.apply("a", fit(Demand(100, 100), state).allocations[0])
    assert "maximum of 1 pods" in fit(Demand(0, 0), state).reason


@pytest.mark.parametrize("mode", ["mps", "time-slicing"])
@pytest.mark.parametrize("oversub", [100, 150, 200])
@pytest.mark.parametrize("stray", [0, 30_000])
def test_shares_fit_answers_as_refusal_share_by_share(mode: str, oversub: int, stray: int) -> None:
    """shares_fit (every share at once) and rows_fit (every state and share at once) against
    refusal and stray_refusal (one at a time), on an L4 (23034 MiB) at every usage of a grid
    and every share of another: memory and compute each below, at and past each bound, clients
    and replicas up to their limits."""
    node = make_node(
        gpus=1,
        model="L4",
        mode=mode,
        mps_compute_oversub_pct=oversub,
        ts_memory_oversub_pct=oversub,
        device_options={"mps_client_limit": 3, "replicas": 3, "stray_memory_mib": stray},
    )
    device = node.devices[0]
    total = device.memory_mib
    sizes = [0, 1, 1000, total // 2, total - 1, total, total + 1, 2 * total]
    computes = [0, 1, 300, 500, 999, 1000, 1001]
    grid = [(m, c) for m in [*sizes, -1] for c in [*computes, -1]]
    memory = np.array([m for m, _ in grid])
    compute = np.array([c for _, c in grid])
    checked = 0
    rows: list[tuple[int, ...]] = []
    answers: list[bool] = []
    frees: list[int] = []
    whys: list[Refusal | None] = []
    free_shares: list[int] = []
    usages: list[DeviceUsage] = []
    for used_memory in sizes:
        for used_compute in computes:
            for shares in range(5):
                for whole in (False, True):
                    usage = DeviceUsage(used_memory, used_compute, shares, whole)
                    got = shares_fit(node, device, usage, memory, compute)
                    assert got is not None
                    rows.append(usage_row(node, device, usage))
                    usages.append(usage)
                    free_shares.append(free_milli(node, device, usage))
                    for k, (m, c) in enumerate(grid):
                        share = DeviceShare(device.uuid, 0, device.mode, m, c)
                        why = refusal(node, device, usage, share) or stray_refusal(node, device, usage, share)
                        expected = why is None
                        assert bool(got[k]) == expected, (usage, m, c)
                        checked += expected
                        answers.append(expected)
                        frees.append(-1 if why is None else why.free_mib)
                        whys.append(why)
    assert checked  # some shares fit
    # each state's free share, all at once
    assert rows_free_milli(np.array(rows, dtype=np.int64), mode == "mps").tolist() == free_shares
    assert len(set(free_shares)) > (0 if stray >= total else 4)  # stray past the GPU leaves nothing free
    # every (state, share) pair at once: one row per pair
    states = np.repeat(np.array(rows, dtype=np.int64), len(grid), axis=0)
    at_once = rows_fit(states, np.tile(memory, len(rows)), np.tile(compute, len(rows)))
    assert at_once.tolist() == answers
    # every state against every share by broadcasting: one row of answers per state
    grid_at_once = rows_fit(tuple(np.array(rows, dtype=np.int64).T[:, :, None]), memory, compute)
    assert grid_at_once.shape == (len(rows), len(grid)) and grid_at_once.ravel().tolist() == answers
    # and where a share is refused, the free memory its refusal reports
    reported = rows_refused_free(states, np.tile(memory, len(rows)), np.tile(compute, len(rows)))
    refused = ~at_once
    assert reported[refused].tolist() == np.array(frees)[refused].tolist()
    assert len(set(reported[refused].tolist())) > 3  # several rules, several amounts
    # and what is short where the rule broken names no GPU (compute, memory): the numbers the
    # refusal reports, and so its node reason's text
    what, need = rows_shortages(states, np.tile(memory, len(rows)), np.tile(compute, len(rows)))
    answered = [k for k in np.flatnonzero(refused).tolist() if what[k]]
    for k in answered:
        why = whys[k]
        assert why is not None
        if what[k] == SHORT_MEMORY:
            assert need[k] == why.need_mib
        else:
            assert what[k] == SHORT_COMPUTE and need[k] == grid[k % len(grid)][1] and why.need_mib is None
        assert short_reason(int(what[k]), int(need[k])) == refused_reason(why)
    rules = rows_refused_rule(states, np.tile(memory, len(rows)), np.tile(compute, len(rows)))
    answerable = {MEMORY_SHORT} | ({COMPUTE_SHORT} if mode == "mps" else set()) | ({STRAY_SHORT} if stray else set())
    assert {int(rules[k]) for k in answered} == answerable  # every such rule met, and only those
    # and each state once a share is added, as add_share then usage_row write it (whole or not)
    placed = rows_add_share(states, np.tile(memory, len(rows)), np.tile(compute, len(rows)))
    added = [
        usage_row(node, device, add_share(device, usage, DeviceShare(device.uuid, 0, device.mode, m, c)))
        for usage in usages
        for m, c in grid
    ]
    assert placed.tolist() == [list(row) for row in added]
    assert {row[8] for row in added} == {0, 1}


def test_shares_fit_leaves_other_modes_and_unhealthy_gpus_to_refusal() -> None:
    some = np.array([1000])
    for mode in ("exclusive", "mig"):
        node = make_node(model="A100-80GB", mode=mode)
        assert shares_fit(node, node.devices[0], DeviceUsage(), some, some) is None
    sick = make_node(mode="mps", device_options={"healthy": False})
    assert shares_fit(sick, sick.devices[0], DeviceUsage(), some, some) is None
    assert usage_row(sick, sick.devices[0], DeviceUsage())[0] == 0  # rows_fit is not asked either
