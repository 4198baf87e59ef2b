"""One run through the core, outcomes derived by hand."""

from __future__ import annotations

import pytest

from scheduler.sim.engine import simulate
from scheduler.sim.load import embedded_scenario, load_trace
from tests.sim.helpers import TWO_GPUS, scenario

# Node ranks fixed so ties are known: a before b.
A_FIRST = {"a": 0, "b": 1}


@pytest.mark.parametrize(
    ("policy", "placements"),
    [
        # Two 1-GPU nodes; pods 0.2, 0.5, 0.8, 0.5 in this order.
        # bestfit: p0 ties (same CPU and GPU left) -> a (rank). p1: a leaves 300 milli-GPU, b 500:
        # less left scores higher -> a [300 free]. p2 (0.8) fits only b [200 free]. p3 (0.5) fits
        # nowhere (300 and 200 free): dropped.
        ("bestfit", ["a", "a", "b", None]),
        # dotprod: p1: v_node . v_pod is smaller on a (800 free vs 1000) -> a; then as bestfit.
        ("dotprod", ["a", "a", "b", None]),
        # gpupacking: p0: both idle 1-GPU nodes, max(33 - 1, 1) = 32 each -> a. p1: a's GPU is
        # shared, 100 - (800 * 100 // 1000) // 10 = 92 > b's 32 -> a. Then as bestfit.
        ("gpupacking", ["a", "a", "b", None]),
        # gpuclustering: p1: a hosts only share pods: 25 * 7200 // 8000 + 75 = 97; b: 21 + 25 = 46 -> a.
        ("gpuclustering", ["a", "a", "b", None]),
        # binpack: p1 -> a (70% used after vs 50%).
        ("binpack", ["a", "a", "b", None]),
        # spread: p1 -> b (50% used after vs 70% on a). p2 (0.8): a has 800 free -> a. p3 -> b.
        ("spread", ["a", "b", "a", "b"]),
        # fgd, typical workload = these pods: 0.5 (p = 0.5), 0.2 (0.25), 0.8 (0.25).
        # p0: 1000 -> 800 free still hosts all three shapes: F 0 -> 0, score 50 on both -> a.
        # p1 on a: 800 -> 300 hosts only 0.2: F = 300 * (0.5 + 0.25) = 225, floor(100 s(-0.225)) = 44;
        #    on b: 1000 -> 500 hosts 0.5 and 0.2: F = 500 * 0.25 = 125, floor(100 s(-0.125)) = 46 -> b.
        # p2 (0.8) fits only a (800 free) -> a. p3 (0.5) fits b (500 free) -> b. Nothing dropped.
        ("fgd", ["a", "b", "a", "b"]),
    ],
)
def test_two_gpu_cluster_per_policy(policy: str, placements: list[str | None]) -> None:
    result = simulate(scenario(TWO_GPUS), policy, 1, ranks=A_FIRST)
    assert [node for _, node in result.placements] == placements
    assert result.failed == placements.count(None)
    expected = sum(m for m, n in zip((200, 500, 800, 500), placements, strict=True) if n)
    assert result.allocated[-1] == expected
    assert result.arrived[-1] == 2000


def test_random_places_only_where_the_pod_fits() -> None:
    for seed in range(20):
        result = simulate(scenario(TWO_GPUS), "random", seed)
        free = {"a": 1000, "b": 1000}
        for (_, node), milli in zip(result.placements, (200, 500, 800, 500), strict=True):
            if node is None:
                assert all(f < milli for f in free.values())
            else:
                assert free[node] >= milli
                free[node] -= milli


TIMED = """
name: timed
replay: timed
nodes:
  - {name: a, cpu: 8, memory: 16Gi, gpus: {model: T4, count: 1, mode: mps}}
pods:
  - {name: first, gpu: {fraction: 0.6}, arrive: 0, duration: 10}
  - {name: early, gpu: {fraction: 0.6}, arrive: 5, duration: 10}
  - {name: on-time, gpu: {fraction: 0.6}, arrive: 10, duration: 10}
"""


def test_timed_replay_reuses_freed_shares() -> None:
    # t=0 first takes 0.6; t=5 early (0.6) finds 0.4 free: dropped; t=10 first leaves before
    # on-time arrives (departures go first at equal times): on-time gets the share.
    result = simulate(scenario(TIMED), "bestfit", 1)
    assert result.failed == 1
    assert result.placed == 2
    # events: first in (t=0), early dropped (5), first out (10), on-time in (10), early's
    # departure (15, nothing to free), on-time out (20)
    assert result.allocated.tolist() == [0, 600, 600, 0, 600, 600, 0]
    assert result.arrived.tolist() == [0, 600, 1200, 1200, 1800, 1800, 1800]


def test_gpu_hours_and_compressed_creation_times() -> None:
    # As recorded: first holds 0.6 GPU over 0-10 s, on-time over 10-20 s: 0.6 x 20 = 12 GPU-seconds.
    result = simulate(scenario(TIMED), "bestfit", 1)
    assert result.gpu_hours == pytest.approx(12 / 3600)
    # Creation times halved, durations kept: first 0-10, early at 2.5 and on-time at 5 both find
    # 0.4 free: two dropped, 0.6 x 10 = 6 GPU-seconds.
    squeezed = simulate(scenario(TIMED), "bestfit", 1, compress=2.0)
    assert (squeezed.placed, squeezed.failed) == (1, 2)
    assert squeezed.gpu_hours == pytest.approx(6 / 3600)
    with pytest.raises(ValueError, match="compress 0"):
        simulate(scenario(TIMED), "bestfit", 1, compress=0)


GENERATED = """
name: generated
replay: timed
nodes:
  - {name: n, count: 3, cpu: 32, memory: 128Gi, gpus: {model: A100-80GB, count: 2, mode: mig}}
workloads:
  - name: infer
    pods: 60
    rate: 0.1
    duration: {distribution: exponential, mean: 60}
    shapes:
      - {weight: 3, cpu: 2, memory: 4Gi, gpu: {mig: 1g.10gb}}
      - {weight: 1, cpu: 4, memory: 8Gi, gpu: {mig: 3g.40gb}}
"""


@pytest.mark.parametrize("policy", ["fgd", "random", "bestfit"])
def test_same_seed_same_placements(policy: str) -> None:
    trace = scenario(GENERATED)
    one = simulate(trace, policy, 7)
    two = simulate(trace, policy, 7)
    assert one.allocated.tolist() == two.allocated.tolist()
    assert one.arrived.tolist() == two.arrived.tolist()
    assert one.failed == two.failed
    other = simulate(trace, policy, 8)
    assert other.arrived.tolist() != one.arrived.tolist()  # another seed draws another workload


def test_arrivals_placements_repeat_exactly() -> None:
    trace = embedded_scenario()
    for policy in ("fgd", "random"):
        assert simulate(trace, policy, 3).placements == simulate(trace, policy, 3).placements


def test_kubernetes_list_starts_from_the_bound_pods() -> None:
    from importlib import resources

    path = resources.files("scheduler").joinpath("examples", "cluster.yaml")
    trace = load_trace(str(path))
    assert trace.bound and trace.pods
    result = simulate(trace, "binpack", 1)
    # the bound pods' GPU is allocated before the first arrival
    assert result.allocated[0] > 0
    assert result.placed + result.failed == len(trace.pods)
