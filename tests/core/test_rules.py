"""fgd-reserve's rules, each a pure module, on cases worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.core.policies.rules import cpubound, departures, gpucpu, migbalance, on_groups

INF = float("inf")


def test_kappa_is_the_share_of_the_cluster_cpu_the_mix_asks_once_its_gpu_fills_it() -> None:
    # 4 cores per GPU asked; 8 GPUs and 64 cores: the mix asks 32 of the 64 cores, 0.5
    assert cpubound.kappa(cpu_seen=4000, gpu_seen=1000, gpus=8, cpu_milli=64_000) == 0.5
    assert cpubound.kappa(cpu_seen=4000, gpu_seen=0, gpus=8, cpu_milli=64_000) == 0.0  # nothing known yet
    assert cpubound.kappa(cpu_seen=4000, gpu_seen=1000, gpus=0, cpu_milli=64_000) == 0.0


@pytest.mark.parametrize(
    ("kappa", "factor"),
    [
        (0.5, 1.0),  # below low: stranding counts in full
        (0.9, 1.0),
        (0.93, 0.875),  # (1.1 - 0.93) / 0.2 = 0.85 -> 6.8 eighths -> 7
        (1.0, 0.5),
        (1.05, 0.25),
        (1.1, 0.0),  # from high: not at all
        (2.0, 0.0),
    ],
)
def test_the_stranding_factor_falls_from_low_to_high_in_eighths(kappa: float, factor: float) -> None:
    assert cpubound.factor(kappa, 0.9, 1.1) == pytest.approx(factor)


def test_the_balance_stands_down_as_what_was_freed_catches_up_with_what_is_held() -> None:
    flow = departures.follow(departures.Flow(), 100)  # the first call: nothing moved yet
    assert flow == departures.Flow(100, 0, 0) and departures.factor(flow) == 1.0
    flow = departures.follow(flow, 60)  # placements took 40
    assert flow == departures.Flow(60, 40, 0) and departures.factor(flow) == 1.0
    flow = departures.follow(flow, 70)  # a departure freed 10: held 30, 10 / 30 freed
    assert flow == departures.Flow(70, 40, 10) and departures.factor(flow) == pytest.approx(2 / 3)
    flow = departures.follow(flow, 90)  # freed 30 of 40 taken: held 10, freed more than held
    assert departures.factor(flow) == 0.0
    assert departures.factor(departures.Flow(50, 0, 5)) == 0.0  # only freed (a node joined)


def test_the_balance_view_leaves_mig_groups_and_their_nodes_out() -> None:
    group_gaps = np.array([[1, 2, 0], [0, 1, 5], [3, 0, 1]])  # groups 0 and 2 MPS, 1 MIG
    mig = np.array([False, True, False])
    node_group = np.array([0, 1, -1, 2, 1])
    found = migbalance.view(group_gaps, mig, node_group)
    assert found is not None
    gaps, skip = found
    assert gaps.tolist() == [4, 2, 1]  # groups 0 + 2
    assert skip.tolist() == [False, True, False, False, True]
    assert migbalance.view(group_gaps, np.zeros(3, dtype=bool), node_group) is None  # no MIG: all count


def test_on_groups_reads_a_node_without_group_as_in_none() -> None:
    assert on_groups(np.array([-1, 0, 1]), np.array([True, False])).tolist() == [False, True, False]


def test_gpu_nodes_lose_the_price_while_a_node_without_gpus_fits() -> None:
    scores = np.array([50.0, 40.0, -INF, 80.0, 10.0])
    on_gpu = np.array([True, False, True, True, True])
    priced = gpucpu.apply(scores, on_gpu, 30.0)
    # 50 - 30, 40 kept (no GPU), -inf kept, 80 - 30; 10 - 30 = -20 squashed into 0..1: 1 / (2 + 20)
    assert priced.tolist() == pytest.approx([20.0, 40.0, -INF, 50.0, 1 / 22])
    # the node without GPUs does not fit: nothing changes
    alone = np.array([50.0, -INF])
    assert gpucpu.apply(alone, np.array([True, False]), 30.0).tolist() == [50.0, -INF]
    assert gpucpu.apply(scores, on_gpu, 0.0) is scores  # no price, no change
