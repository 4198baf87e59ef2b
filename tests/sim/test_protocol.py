"""Arrival order: shuffle, inflation (with the authors' stop quirk), node ranks, timed events."""

from __future__ import annotations

import random

from scheduler.core.request import Demand, GpuKind, GpuRequest
from scheduler.sim.model import SimPod
from scheduler.sim.protocol import inflate_pods, node_ranks, timed_events
from tests.builders import make_node
from tests.sim.helpers import scenario


class Scripted(random.Random):
    """A random stream whose randrange answers are given in advance."""

    def __init__(self, answers: list[int]) -> None:
        super().__init__(0)
        self.answers = list(answers)

    def randrange(self, *args: int, **kwargs: int) -> int:  # type: ignore[override]
        return self.answers.pop(0)


WHOLE_1 = SimPod("whole", Demand(1000, 0, GpuRequest(GpuKind.WHOLE, 1)))
HALF = SimPod("half", Demand(1000, 0, GpuRequest(GpuKind.SHARE, 1, fraction_milli=500)))
WHOLE_2 = SimPod("pair", Demand(1000, 0, GpuRequest(GpuKind.WHOLE, 2)))
ORIGINAL = [WHOLE_1, HALF, WHOLE_2]


def test_inflation_stops_on_the_per_gpu_share_quirk() -> None:
    """Capacity 4 GPUs = 4000 milli; target 1.3 x 4000 = 5200. Start: whole (1000) + half (500) = 1500.

    draw pair: 1500 + 1000 (one GPU's share, not 2000) <= 5200 -> added, total 3500
    draw pair: 3500 + 1000 <= 5200 -> added, total 5500 (past the target: the quirk)
    draw half: 5500 + 500 > 5200 -> stop
    """
    out = inflate_pods([WHOLE_1, HALF], ORIGINAL, 1.3, 4000, Scripted([2, 2, 1]))
    assert [p.name for p in out] == ["whole", "half", "pair-tuned-0", "pair-tuned-1"]


def test_inflation_below_the_trace_removes_random_pods() -> None:
    # total 3500 > 0.5 x 4000 = 2000: remove index 2 (pair, -2000) -> 1500 <= 2000: stop
    out = inflate_pods(list(ORIGINAL), ORIGINAL, 0.5, 4000, Scripted([2]))
    assert [p.name for p in out] == ["whole", "half"]


def test_inflation_zero_keeps_the_pods() -> None:
    assert inflate_pods(list(ORIGINAL), ORIGINAL, 0, 4000, random.Random(1)) == ORIGINAL


def test_node_ranks_are_a_seeded_permutation() -> None:
    nodes = [make_node(name=f"n{i}") for i in range(30)]
    ranks = node_ranks(nodes, random.Random(5))
    assert sorted(ranks.values()) == list(range(30))
    assert ranks == node_ranks(list(reversed(nodes)), random.Random(5))  # input order does not matter
    assert ranks != node_ranks(nodes, random.Random(6))


def test_timed_events_departures_first_at_equal_times() -> None:
    trace = scenario(
        """
nodes: [{name: a}]
pods:
  - {name: x, arrive: 10}
  - {name: y, arrive: 0, duration: 10}
  - {name: z, arrive: 3, duration: 1}
"""
    )
    events = timed_events(trace, random.Random(0))
    assert [(e.time, e.pod.name, e.leave) for e in events] == [
        (0, "y", False),
        (3, "z", False),
        (4, "z", True),
        (10, "y", True),
        (10, "x", False),
    ]
