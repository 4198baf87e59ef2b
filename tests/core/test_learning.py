"""Learning apart from scoring: what a policy learned is one object (its ``learned``), told of
the pods seen and of the cluster as each call sees it; scoring and adjusting read it and the
cluster and change neither, and a planner asks the policy over a copy of it."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

from scheduler.core.board import Board
from scheduler.core.catalog import ProfileSpec
from scheduler.core.fit import fit
from scheduler.core.policies import REGISTRY, make_policy, over_a_copy, tell
from scheduler.core.policies.base import Declared, Policy, capabilities
from scheduler.core.request import Demand, GpuKind, GpuRequest
from scheduler.core.select import Gaps, finish, gap_histogram
from scheduler.core.state import NodeState
from tests.builders import make_state

LEARNING = sorted(name for name in REGISTRY if capabilities(make_policy(name)).learning is not None)


def cluster() -> list[NodeState]:
    """Groups of several models and sharing modes (a pinned T4 group among them), a node without GPUs."""
    return [
        make_state(name="t4", gpus=2, model="T4", cpu_milli=32_000),
        make_state(name="mps", gpus=2, mode="mps", cpu_milli=32_000),
        make_state(name="ts", gpus=1, mode="time-slicing", cpu_milli=16_000),
        make_state(name="mig", gpus=1, model="A100-80GB", mode="mig", cpu_milli=32_000),
        make_state(name="cpu", gpus=0, cpu_milli=64_000),
    ]


def pods() -> list[Demand]:
    """Shares, whole GPUs (some pinned to T4), a MIG profile and pods without GPUs: enough for
    the online estimates to move."""
    shapes = [
        GpuRequest(GpuKind.SHARE, 1, fraction_milli=250),
        GpuRequest(GpuKind.SHARE, 1, fraction_milli=500),
        GpuRequest(GpuKind.WHOLE, 1, models=("T4",)),
        GpuRequest(GpuKind.WHOLE, 1),
        GpuRequest(GpuKind.MIG, 1, profile=ProfileSpec.parse("3g.40gb")),
        GpuRequest(),
    ]
    return [Demand(1000 * (1 + k % 3), 1024, shapes[k % len(shapes)]) for k in range(30)]


def own(policy: Policy) -> bytes:
    """Everything a learning ``policy`` holds but its memos (what it learned included)."""
    learning = capabilities(policy).learning
    assert learning is not None
    return pickle.dumps({k: v for k, v in sorted(vars(policy).items()) if k not in learning.memos})


def learned(policy: Policy) -> Any:
    learning = capabilities(policy).learning
    assert learning is not None
    return learning.learned


def view(policy: Policy, states: list[NodeState]) -> Declared:
    """The cluster of ``states`` as a call's ``adjust`` sees it (no placement moves a gap)."""
    can = capabilities(policy)
    cluster = Gaps(gap_histogram(states), np.full((2, len(states)), -1), states, states)
    return Declared(cluster, can.reads, policy.name)


def ask(policy: Policy, demand: Demand, states: list[NodeState]) -> None:
    """Every hook the board asks, directly (the learned object is not told to follow)."""
    can = capabilities(policy)
    candidates = [(s, a) for s in states for a in fit(demand, s).allocations]
    if can.prepare is not None:
        can.prepare.prepare(demand, candidates)
    raw = np.full(len(states), -np.inf)
    for j, state in enumerate(states):
        for allocation in fit(demand, state).allocations:
            raw[j] = max(raw[j], policy.score(demand, state, allocation))
            if can.tiebreak is not None:
                can.tiebreak.tiebreak(demand, state, allocation)
    if can.adjust is not None:
        can.adjust.adjust(demand, raw, view(policy, states))
    if can.normalize is not None and (raw > -np.inf).any():
        can.normalize.normalize(raw[raw > -np.inf])


@pytest.mark.parametrize("name", sorted(set(LEARNING) - {"random"}))  # random's adjust and tiebreak draw
def test_scoring_and_adjusting_change_nothing_of_the_policy_nor_of_what_it_learned(name: str) -> None:
    """Asked with what it learned and the cluster as they stand, a policy answers and changes
    neither: were ``adjust`` to learn (fgd-reserve's departures, kappa, classes used to be
    learned there), what it holds would differ after."""
    policy = make_policy(name)
    states = cluster()
    for demand in pods():
        tell(policy, demand)
    before = own(policy)
    for demand in pods():
        ask(policy, demand, states)
    assert own(policy) == before


@pytest.mark.parametrize("name", sorted(set(LEARNING) - {"random"}))  # random learns nothing
def test_what_a_policy_learns_is_held_by_its_learned_object_alone(name: str) -> None:
    """Told of pods and asked calls (the learned object following the cluster), the policy's
    own fields stay as made: everything learned is in the one object a face owns and copies."""
    policy = make_policy(name)
    fields = {k: v for k, v in vars(policy).items() if k != "learned"}
    mine = own(make_policy(name))  # as made, with what it learned (nothing yet)
    states = cluster()
    for demand in pods():
        tell(policy, demand)
        finish(policy, demand, np.full(len(states), 50.0), view(policy, states))
    kept = capabilities(policy).learning
    assert kept is not None
    assert {k: v for k, v in vars(policy).items() if k != "learned" and k not in kept.memos} == {
        k: v for k, v in fields.items() if k not in kept.memos
    }
    assert own(policy) != mine  # and it did learn


def _busy(states: list[NodeState]) -> list[NodeState]:
    """``states`` with a whole GPU taken wherever one is free: a cluster that is not the served one."""
    out = []
    for k, state in enumerate(states):
        found = fit(Demand(1000, 1024, GpuRequest(GpuKind.WHOLE, 1)), state)
        out.append(state.apply(f"busy{k}", found.allocations[0]) if found else state)
    return out


@pytest.mark.parametrize("name", LEARNING)
def test_a_planner_asks_a_copy_of_what_was_learned_and_the_served_one_never_sees_it(name: str) -> None:
    """The planner's copy follows the clusters it plans and the pods it is told; what the
    served policy learned stays as it was, byte for byte, and answers as a policy never copied."""
    served, twin = make_policy(name), make_policy(name)
    states = cluster()
    board, twin_board = Board(states), Board(states)
    for demand in pods()[:12]:
        for policy, on in ((served, board), (twin, twin_board)):
            tell(policy, demand)
            on.scores(policy, demand)
    before = pickle.dumps(learned(served))
    asked = over_a_copy(served)
    assert asked is not served and learned(asked) is not learned(served)
    assert pickle.dumps(learned(asked)) == before  # a copy of everything learned
    planned = Board(_busy(states))
    for demand in pods()[12:]:
        tell(asked, demand)
        planned.scores(asked, demand)
        planned.best(asked, demand)
    assert pickle.dumps(learned(served)) == before
    assert pickle.dumps(learned(asked)) != before  # the copy did learn
    for demand in pods()[12:]:
        tell(served, demand)
        tell(twin, demand)
        assert board.scores(served, demand).tolist() == twin_board.scores(twin, demand).tolist()


def test_a_policy_that_learns_nothing_is_asked_as_it_is() -> None:
    policy = make_policy("binpack")
    assert over_a_copy(policy) is policy
