"""GPU quotas in scenarios: namespaces and quotas read with field paths, pods held back by
their quota reported apart from those that fit nowhere, and the default unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.core.quota import Limits
from scheduler.sim.engine import simulate
from scheduler.sim.errors import TraceError
from scheduler.sim.scenario import load_text

NODES = "nodes:\n  - {name: n, count: 1, cpu: 64, memory: 512Gi, gpus: {model: H100-80GB, count: 4, mode: mps}}\n"


def trace(extra: str) -> str:
    return "name: t\nreplay: arrivals\ninflate: 0\nshuffle: false\n" + NODES + extra


def test_namespaces_and_quotas_are_read() -> None:
    got = load_text(
        trace(
            "pods:\n  - {name: a, namespace: team-a, count: 2, gpu: {fraction: 0.5}}\n"
            "workloads:\n  - {name: w, namespace: team-b, pods: 3, shapes: [{gpu: {count: 1}}]}\n"
            "quotas:\n  - {namespace: team-a, gpuCompute: 0.5, models: {H100-80GB: {gpus: 1}}}\n"
        ),
        "t.yaml",
    )
    assert {p.namespace for p in got.pods} == {"team-a"}
    assert got.generators[0].namespace == "team-b"
    (quota,) = got.quotas
    # 0.5 GPUs of compute = 500 milli
    assert (quota.namespace, quota.name, quota.limits) == ("team-a", "quota", Limits(compute_milli=500))
    assert quota.models == (("H100-80GB", Limits(gpus=1)),)


@pytest.mark.parametrize(
    ("quotas", "message"),
    [
        ("  - {namespace: a, gpus: -1}\n", "quotas[0].gpus: invalid value -1"),
        ("  - {namespace: a, gpu: 1}\n", "quotas[0].gpu: unknown key"),
        (
            "  - {namespace: a, gpus: 1}\n  - {namespace: a, gpus: 2}\n",
            "quotas[1].name: quota a/quota is defined twice",
        ),
    ],
)
def test_a_bad_quota_is_refused_with_its_field_path(quotas: str, message: str) -> None:
    with pytest.raises(TraceError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_text(trace("pods:\n  - {name: a, gpu: {count: 1}}\nquotas:\n" + quotas), "t.yaml")


def test_pods_held_back_by_quota_are_reported_apart_from_those_that_fit_nowhere() -> None:
    # 4 GPUs; team-a asks 3 whole GPUs, its quota allows 2; team-b asks 3, no quota. In order:
    # a-0, a-1 placed; a-2 held by the quota; b-0, b-1 placed (4 GPUs full); b-2 fits nowhere.
    got = load_text(
        trace(
            "pods:\n  - {name: a, namespace: team-a, count: 3, gpu: {count: 1}}\n"
            "  - {name: b, namespace: team-b, count: 3, gpu: {count: 1}}\n"
            "quotas:\n  - {namespace: team-a, gpus: 2}\n"
        ),
        "t.yaml",
    )
    result = simulate(got, "binpack", 42)
    assert result.failed_by_kind == {"held by quota (team-a)": 1, "1-gpu (team-b)": 1}
    assert (result.placed, result.failed) == (4, 2)
    assert dict(result.placements)["a-2"] is None


def test_without_namespaces_the_failure_kinds_are_as_before() -> None:
    got = load_text(trace("pods:\n  - {name: a, count: 5, gpu: {count: 1}}\n"), "t.yaml")
    assert simulate(got, "binpack", 42).failed_by_kind == {"1-gpu": 1}


def test_quotas_and_defragmentation_are_not_simulated_together(tmp_path: Path) -> None:
    from scheduler.sim.defrag import DefragSpec

    got = load_text(
        trace("replay: timed\n").replace("replay: arrivals\n", "")
        + "pods:\n  - {name: a, gpu: {count: 1}}\nquotas:\n  - {namespace: default, gpus: 1}\n",
        "t.yaml",
    )
    with pytest.raises(ValueError, match="GPU quotas and defragmentation"):
        simulate(got, "binpack", 42, defrag=DefragSpec(600.0, 1))
