"""The sharing modes, one module each, registered in one place: every mode is listed, the faces
read their facts from it, and a new mode is its module plus one registration (a fake one here)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest

from scheduler.agent.config import OverrunSettings, load_config
from scheduler.agent.guard import Guard
from scheduler.agent.sampling import ShareUse
from scheduler.core import modes
from scheduler.core.allocation import DeviceShare
from scheduler.core.board import Board
from scheduler.core.capacity import EMPTY, DeviceUsage, Refusal, add_share, free, refusal, usage_row
from scheduler.core.catalog import CATALOG
from scheduler.core.errors import ConfigError
from scheduler.core.fit import fit
from scheduler.core.inventory import Device, Node, SharingMode
from scheduler.core.k8s import parse_node
from scheduler.core.modes.base import Mode, refused
from scheduler.core.policies import make_policy
from scheduler.core.request import MILLI, Demand, GpuKind, GpuRequest
from scheduler.core.state import NodeState
from scheduler.sim.errors import TraceError
from scheduler.sim.scenario import load_text
from tests.docs.reading import table_after


def test_every_mode_is_registered_once_in_the_order_of_the_enum() -> None:
    assert [m.name for m in modes.registered()] == list(SharingMode)
    assert modes.accepted() == "exclusive, mps, time-slicing, mig"
    assert {m.name for m in modes.registered() if m.arrayable} == {SharingMode.MPS, SharingMode.TIME_SLICING}
    assert modes.parse("mps") is SharingMode.MPS
    assert modes.parse("MPS") is None  # exact names only; callers lower-case what they accept so


@pytest.mark.parametrize(
    ("mode", "isolated", "control_daemon", "counts_stray"),
    [
        # MIG: the hardware confines a process to its instance; exclusive: the pod owns the GPU
        (SharingMode.MIG, True, False, False),
        (SharingMode.EXCLUSIVE, True, False, True),
        # MPS: the agent runs a control daemon per GPU, which enforces the caps
        (SharingMode.MPS, False, True, True),
        (SharingMode.TIME_SLICING, False, False, True),
    ],
)
def test_the_facts_the_agent_and_the_webhook_read(
    mode: SharingMode, isolated: bool, control_daemon: bool, counts_stray: bool
) -> None:
    rules = modes.of(mode)
    assert (rules.isolated, rules.control_daemon, rules.counts_stray) == (isolated, control_daemon, counts_stray)


class FakeMode(StrEnum):
    HALVES = "halves"


class Halves(Mode):
    """A GPU cut into two halves of its memory and compute: at most two shares, each at most
    half of it."""

    name = FakeMode.HALVES  # type: ignore[assignment]  # a test's own mode, outside SharingMode
    summary = "two halves of a GPU"
    isolated = True

    def rules(self, node: Node, device: Device, usage: DeviceUsage, share: DeviceShare) -> Refusal | None:
        if share.memory_mib > device.memory_mib // 2 or share.compute_milli > MILLI // 2:
            return refused(device, usage, f"GPU {device.index} is cut in halves: at most half of it")
        if usage.shares >= 2:
            return refused(device, usage, f"GPU {device.index} has no free half")
        return None

    def amounts(self, node: Node, device: Device, usage: DeviceUsage) -> tuple[int, int, int]:
        left = 2 - usage.shares
        return left * device.memory_mib // 2, left * MILLI // 2, left * MILLI // 2

    def detail(self, device: Device, usage: DeviceUsage) -> str:
        return f"{usage.shares}/2 halves"


@pytest.fixture
def halves() -> Iterator[Mode]:
    mode = modes.register(Halves())
    yield mode
    modes.unregister(FakeMode.HALVES)


def halves_node(name: str = "h1", gpus: int = 1) -> Node:
    mode: Any = FakeMode.HALVES
    devices = tuple(Device(f"{name}-gpu{i}", i, CATALOG["H100-80GB"], mode) for i in range(gpus))
    return Node(name, 64_000, 512_000, devices)


def fraction(milli: int) -> Demand:
    return Demand(0, 0, GpuRequest(GpuKind.SHARE, 1, fraction_milli=milli))


@pytest.mark.usefixtures("halves")
def test_a_new_mode_fits_and_refuses_with_its_own_text() -> None:
    state = NodeState.empty(halves_node())
    # a half fits twice (H100: 81920 MiB, half of it 40960 MiB), a third time no half is left
    for k in range(2):
        found = fit(fraction(500), state)
        assert found, found.reason
        taken = found.allocations[0].shares[0]
        assert (taken.mode, taken.memory_mib, taken.compute_milli) == (FakeMode.HALVES, 40960, 500)
        state = state.apply(f"p{k}", found.allocations[0])
    assert fit(fraction(500), state).reason == "GPU 0 has no free half"
    assert fit(fraction(600), NodeState.empty(halves_node())).reason == "GPU 0 is cut in halves: at most half of it"
    # its free share and description, as `gpuslice inspect` shows them: one half left
    device = state.node.devices[0]
    half = DeviceShare(device.uuid, 0, device.mode, 40960, 500)
    one = add_share(device, EMPTY, half)
    assert free(state.node, device, state.usage[0]).milli == 0  # both halves taken
    assert (free(state.node, device, one).milli, free(state.node, device, one).detail) == (500, "1/2 halves")
    # not a mode of the rules of arrays: the capacity model asks its rules one share at a time
    assert usage_row(state.node, device, one)[0] == 0
    assert refusal(state.node, device, one, half) is None


@pytest.mark.usefixtures("halves")
def test_a_new_mode_is_placed_by_the_board_as_by_fit() -> None:
    board = Board([NodeState.empty(halves_node("h1")), NodeState.empty(halves_node("h2"))])
    policy = make_policy("binpack")
    for k in range(4):
        placement = board.best(policy, fraction(500))
        assert placement is not None, k
        state = board.get(placement.node)
        assert state is not None
        board.put(state.apply(f"p{k}", placement.allocation))
    assert board.best(policy, fraction(500)) is None  # two GPUs, two halves each: four pods


@pytest.mark.usefixtures("halves")
def test_a_new_mode_shows_where_modes_are_listed_and_read(tmp_path: Path) -> None:
    assert modes.accepted() == "exclusive, mps, time-slicing, mig, halves"
    # the agent's configuration takes it, and names it among the accepted
    path = tmp_path / "agent.yaml"
    path.write_text("sharing: {mode: halves}\n", encoding="utf-8")
    assert load_config(str(path), "n1", {}).sharing_of(0).mode is FakeMode.HALVES
    path.write_text("sharing: {mode: quarters}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="accepted: exclusive, mps, time-slicing, mig, halves"):
        load_config(str(path), "n1", {})
    # a node's inventory annotation and a simulated node group may be in it
    raw = {
        "metadata": {"name": "k1", "annotations": {"gpuslice.io/inventory": '[{"model": "H100", "mode": "halves"}]'}},
        "status": {"allocatable": {"cpu": "8", "memory": "32Gi"}},
    }
    assert [d.mode for d in parse_node(raw).devices] == [FakeMode.HALVES]
    trace = load_text("nodes:\n  - {name: a, gpus: {model: H100, mode: halves}}\npods: [{name: p}]\n", Path("t.yaml"))
    assert trace.nodes[0].devices[0].mode is FakeMode.HALVES
    with pytest.raises(TraceError, match="accepted: exclusive, mps, time-slicing, mig, halves"):
        load_text("nodes:\n  - {name: a, gpus: {model: H100, mode: thirds}}\npods: [{name: p}]\n", Path("t.yaml"))
    # the agent's overrun guard reads its isolation: an overrun is reported, never evicted,
    # where the same share of a time-slicing GPU would be evicted
    guard = Guard(OverrunSettings(action="evict"), cluster=None)  # type: ignore[arg-type]  # never reached
    use = ShareUse("ns/p", "uid", 0, "GPU-0", "H100", FakeMode.HALVES, "", 40960, 500, 50000, None, ())  # type: ignore[arg-type]
    assert not guard._wants_eviction(use)
    assert guard._wants_eviction(replace(use, mode=SharingMode.TIME_SLICING))


def test_the_fake_mode_is_gone_once_unregistered() -> None:
    assert modes.parse("halves") is None
    assert "halves" not in modes.accepted()


def test_the_list_of_modes_in_the_docs_is_the_registry() -> None:
    page = Path(__file__).parents[2] / "docs" / "sharing-modes.md"
    table = table_after(page, "mode | module | what a GPU of it holds")
    yes = {"yes": True, "no": False}
    listed = [
        (mode.strip("`"), module.strip("`"), holds, yes[isolated], yes[daemon], yes[stray])
        for mode, module, holds, isolated, daemon, stray in table[1:]
    ]
    assert listed == [
        (
            str(m.name),
            f"{type(m).__module__.rsplit('.', 1)[1]}.py",
            m.summary,
            m.isolated,
            m.control_daemon,
            m.counts_stray,
        )
        for m in modes.registered()
    ]
