"""Checks on the real Alibaba openb trace, where the README's commands fetch it (or $GPUSLICE_OPENB)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from scheduler.core.fragmentation import Fragmentation, TypicalWorkload
from scheduler.core.state import NodeState
from scheduler.sim.datasets import OPENB_ENV, openb_dir
from scheduler.sim.model import Trace, request_milli
from scheduler.sim.openb import read_trace
from scheduler.sim.protocol import arrival_events

OPENB = openb_dir(Path(__file__).resolve().parents[2])

pytestmark = [
    pytest.mark.openb,
    pytest.mark.skipif(
        not (OPENB / "openb_pod_list_default.csv").exists(),
        reason=f"the openb trace is not at {OPENB} (fetch it as the README says, or set {OPENB_ENV})",
    ),
]


@pytest.fixture(scope="module")
def default() -> Trace:
    return read_trace(OPENB / "openb_pod_list_default.csv")


def test_default_cluster_and_pods(default: Trace) -> None:
    assert (len(default.nodes), default.gpus, len(default.pods)) == (1213, 6212, 8152)
    assert sum(request_milli(p.demand) for p in default.pods) == 6_086_800  # 98.0% of capacity


def test_typical_pods_and_empty_cluster_fragmentation(default: Trace) -> None:
    """The FGD paper's checks: 35 typical shapes cover 95.26% of pods; empty-cluster frag rate 13.9%."""
    demands = default.typical_demands()
    workload = TypicalWorkload.from_demands(demands)
    assert len(workload.shapes) == 35
    covered = sum(1 for d in demands if any((d.cpu_milli, d.gpu) == (s.cpu_milli, s.gpu) for s, _ in workload.shapes))
    assert covered / len(demands) == pytest.approx(0.9526, abs=5e-5)
    measure = Fragmentation(workload)
    frag = idle = 0.0
    for node in default.nodes:
        f, i = measure.frag_rate_parts(NodeState.empty(node))
        frag, idle = frag + f, idle + i
    assert 100 * frag / idle == pytest.approx(13.9, abs=0.05)


def test_inflation_reaches_130_percent(default: Trace) -> None:
    events = arrival_events(default, random.Random(42), 1.3, True)
    total = sum(request_milli(e.pod.demand) for e in events)
    assert total / default.capacity_milli == pytest.approx(1.3, abs=0.01)
    assert len(events) > len(default.pods)
