"""A policy's capabilities are the protocols its class names, and what it reads is checked."""

from __future__ import annotations

import random

import numpy as np
import pytest

from scheduler.core.allocation import Allocation
from scheduler.core.board import Board
from scheduler.core.errors import ConfigError
from scheduler.core.fit import fit
from scheduler.core.policies import REGISTRY, make_policy
from scheduler.core.policies.base import (
    CAPABILITIES,
    Adjusting,
    Cluster,
    Policy,
    Reading,
    Reads,
    ReadsError,
    capabilities,
    tell,
)
from scheduler.core.request import Demand, GpuKind, GpuRequest
from scheduler.core.select import rank
from scheduler.core.state import NodeState
from tests.builders import make_state


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_registered_policy_names_exactly_the_hooks_it_has(name: str) -> None:
    policy = make_policy(name)
    found = capabilities(policy)  # refuses a hook without its protocol, or a protocol without its hook
    for attribute, protocol in CAPABILITIES.items():
        assert (protocol in type(policy).__mro__) == hasattr(policy, attribute), (name, attribute)
    assert found.reads == (policy.reads if isinstance(policy, Reading) else frozenset({Reads.CPU}))


def test_a_hook_without_its_protocol_is_refused_by_name() -> None:
    class Sly:
        name = "sly"

        def score(self, demand: Demand, state: NodeState, allocation: Allocation) -> float:
            return 1.0

        def adjust(self, demand: Demand, scores: np.ndarray, cluster: Cluster) -> np.ndarray:
            return scores

    with pytest.raises(TypeError, match=r"policy sly: 'adjust' and the capability Adjusting go together"):
        capabilities(Sly())


def cluster() -> list[NodeState]:
    """Nodes in several sharing modes; two MPS nodes alike, so the board shares their answers."""
    return [
        make_state(name="a", gpus=2, mode="mps", memory_mib=64_000),
        make_state(name="b", gpus=2, mode="mps", memory_mib=64_000),
        make_state(name="c", gpus=1, mode="time-slicing", memory_mib=256_000),
        make_state(name="d", gpus=2, mode="exclusive", memory_mib=128_000),
        make_state(name="e", gpus=1, model="A100-80GB", mode="mig", memory_mib=256_000),
    ]


def mismatches(make: type[Policy] | str, steps: int = 60, seed: int = 3) -> list[str]:
    """Pods of mixed shapes, each scored by the board and by the plain node-by-node ranking
    (``select.rank``, which keeps nothing), then placed where the board puts it: the steps
    where the two disagree. Each side has its own policy, told the same pods (a learning
    policy's answers follow what it was told)."""
    rng = random.Random(seed)
    shapes = [
        GpuRequest(GpuKind.SHARE, 1, fraction_milli=250),
        GpuRequest(GpuKind.SHARE, 1, fraction_milli=500),
        GpuRequest(GpuKind.SHARE, 1, memory_mib=8000),
        GpuRequest(GpuKind.WHOLE, 1),
        GpuRequest(GpuKind.WHOLE, 2),
        GpuRequest(),
    ]
    states = cluster()
    order = {s.node.name: i for i, s in enumerate(states)}
    board = Board(states, order)
    mine, oracle = (make_policy(make), make_policy(make)) if isinstance(make, str) else (make(), make())
    found: list[str] = []
    for step in range(steps):
        demand = Demand(rng.choice((1000, 4000)), rng.choice((1024, 8192, 30_000)), rng.choice(shapes))
        tell(mine, demand)
        tell(oracle, demand)
        got = board.scores(mine, demand).tolist()
        ranking = {p.node: p.score for p in rank(oracle, demand, list(board.states), order).placements}
        expected = [ranking.get(s.node.name, -float("inf")) for s in board.states]
        if got != pytest.approx(expected):
            found.append(f"step {step}: {demand}: board {got}, node by node {expected}")
        choice = board.best(mine, demand)
        if choice is not None and rng.random() < 0.8:
            state = board.get(choice.node)
            assert state is not None and fit(demand, state)
            board.put(state.apply(f"p{step}", choice.allocation))
    return found


@pytest.mark.parametrize("name", sorted(set(REGISTRY) - {"random"}))  # random's scores are draws
def test_every_registered_policy_scores_on_the_board_as_node_by_node(name: str) -> None:
    assert mismatches(name) == []


class _LeftMemory(Reading):
    """Scores by the memory the pod asks, but declares that it reads only its CPU."""

    name = "left-memory"
    reads = frozenset({Reads.CPU})

    def score(self, demand: Demand, state: NodeState, allocation: Allocation) -> float:
        return float(min(100, demand.memory_mib // 512))


class _Declared(_LeftMemory):
    name = "declared-memory"
    reads = frozenset({Reads.CPU, Reads.MEMORY})


def test_a_score_reading_what_it_does_not_declare_is_caught_by_the_node_by_node_check() -> None:
    # the board reuses the first pod's scores for pods that differ only in memory: caught
    assert mismatches(_LeftMemory)
    assert mismatches(_Declared) == []  # the same score, declared: none


class _PeeksAtGaps(Reading, Adjusting):
    name = "peeks"
    reads = frozenset({Reads.CPU})

    def score(self, demand: Demand, state: NodeState, allocation: Allocation) -> float:
        return 50.0

    def adjust(self, demand: Demand, scores: np.ndarray, cluster: Cluster) -> np.ndarray:
        found: np.ndarray = scores - cluster.moves[1]  # moves the board works out only for Reads.GAPS
        return found


class _PeeksAtGroups(_PeeksAtGaps):
    name = "peeks-groups"
    reads = frozenset({Reads.CPU, Reads.GAPS})

    def adjust(self, demand: Demand, scores: np.ndarray, cluster: Cluster) -> np.ndarray:
        return scores - len(cluster.groups.keys)


@pytest.mark.parametrize(
    ("policy", "part"), [(_PeeksAtGaps, r"moves .* Reads\.GAPS"), (_PeeksAtGroups, r"groups .* Reads\.GROUPS")]
)
def test_adjust_reading_a_part_of_the_cluster_it_does_not_declare_fails_by_name(
    policy: type[_PeeksAtGaps], part: str
) -> None:
    demand = Demand(1000, 1024, GpuRequest(GpuKind.SHARE, 1, fraction_milli=250))
    states = cluster()
    with pytest.raises(ReadsError, match=f"policy {policy.name} read the cluster's {part}"):
        Board(states).scores(policy(), demand)
    with pytest.raises(ReadsError, match=f"policy {policy.name} read the cluster's {part}"):
        rank(policy(), demand, states)


def test_a_policys_options_are_checked_by_the_core_at_any_depth() -> None:
    # the one check both faces use (the service's configuration loader calls the same function)
    with pytest.raises(ConfigError, match=r"^policy fgd: unknown option 'workload.0.wieght'; accepted: weight, cpu,"):
        make_policy("fgd", {"workload": [{"wieght": 1}]})
    with pytest.raises(ConfigError, match=r"^policy fgd-reserve: unknown option 'reserve_weigth'; accepted: workload,"):
        make_policy("fgd-reserve", {"reserve_weigth": 1})
    with pytest.raises(ConfigError, match=r"^policy fgd-reserve: reserve_weight must be a finite number >= 0"):
        make_policy("fgd-reserve", {"reserve_weight": -1})
