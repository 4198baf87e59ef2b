"""Prioritize holds the node it ranks first for the pod, until its bind arrives or the hold runs
out: kube-scheduler filters the next pods before that bind, and they must not be steered to
the same share (without holds, 43% of binds failed under kube-scheduler's asynchronous binds)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from scheduler.core import select
from scheduler.core.state import NodeState
from scheduler.extender import service, wire
from scheduler.extender.config import load_config
from scheduler.extender.service import Extender
from scheduler.filebackend import FileBackend

from .kit import binding, cluster_file, filter_args, k8s_node, k8s_pod


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def served(tmp_path: Path, *pods: dict[str, Any], hold_s: float = 2.0) -> tuple[Extender, Clock]:
    clock = Clock()
    # x is fuller than y, so binpack ranks x first for a 0.5 GPU pod
    busy = k8s_pod("busy", gpu_fraction="0.25", node=None)
    path = cluster_file(tmp_path / "c.json", k8s_node("x", gpus=1), k8s_node("y", gpus=1), busy, *pods)
    config = load_config(env={}, flags={"policy": "binpack", "hold_s": hold_s})
    extender = Extender(config, FileBackend(path, config.prefix), clock=clock)
    extender.start()
    assert call(extender, "bind", binding(busy, "x")) == ""
    return extender, clock


def call(extender: Extender, verb: str, payload: dict[str, Any]) -> Any:
    body = orjson.dumps(payload)
    if verb == "filter":
        return orjson.loads(extender.filter(wire.parse_args(body)))
    if verb == "prioritize":
        return orjson.loads(extender.prioritize(wire.parse_args(body)))
    return extender.bind(wire.parse_binding(body))


def passes(extender: Extender, pod: dict[str, Any]) -> list[str]:
    return list(call(extender, "filter", filter_args(pod, ["x", "y"]))["NodeNames"] or [])


def test_the_node_ranked_first_is_the_only_top_score_and_is_held(tmp_path: Path) -> None:
    a, b = k8s_pod("a", gpu_fraction="0.5"), k8s_pod("b", gpu_fraction="0.5")
    extender, _ = served(tmp_path, a, b)
    assert passes(extender, a) == ["x", "y"]
    # binpack: x (250 + 500) / 1000 = 75% -> 7.5 -> 8, y 50% -> 5: x is first and alone at 10
    scores = call(extender, "prioritize", filter_args(a, ["x", "y"]))
    assert scores == [{"Host": "x", "Score": 10}, {"Host": "y", "Score": 5}]
    # b is filtered before a's bind arrives: x has 0.25 free for it (its 0.5 is held for a)
    assert passes(extender, b) == ["y"]
    assert call(extender, "bind", binding(a, "x")) == ""
    assert passes(extender, b) == ["y"]  # now a holds it for good


def test_a_hold_runs_out(tmp_path: Path) -> None:
    a, b = k8s_pod("a", gpu_fraction="0.5"), k8s_pod("b", gpu_fraction="0.5")
    extender, clock = served(tmp_path, a, b)
    call(extender, "prioritize", filter_args(a, ["x", "y"]))
    assert passes(extender, b) == ["y"]
    clock.now += 1.9
    assert passes(extender, b) == ["y"]
    clock.now += 0.2  # a's bind never came
    assert passes(extender, b) == ["x", "y"]
    assert extender.cache.inflight() == {}


def test_a_pods_own_hold_never_stands_in_its_way(tmp_path: Path) -> None:
    a = k8s_pod("a", gpu_fraction="0.75")
    extender, _ = served(tmp_path, a)
    call(extender, "prioritize", filter_args(a, ["x", "y"]))  # x is held for a
    assert passes(extender, a) == ["x", "y"]  # scheduled again (its bind failed, say)
    assert call(extender, "prioritize", filter_args(a, ["x", "y"]))[0] == {"Host": "x", "Score": 10}


def test_a_bind_elsewhere_or_a_failed_bind_lets_the_hold_go(tmp_path: Path) -> None:
    a, b, c = (k8s_pod(n, gpu_fraction="0.75") for n in "abc")
    extender, _ = served(tmp_path, a, b, c)
    call(extender, "prioritize", filter_args(a, ["x", "y"]))  # x: (250 + 750) / 1000 -> 10, held for a
    assert call(extender, "bind", binding(a, "y")) == ""  # kube-scheduler chose y after all
    assert passes(extender, b) == ["x"]  # y has 0.25 left; x's 0.75 is free again
    call(extender, "prioritize", filter_args(b, ["x"]))
    assert passes(extender, c) == []  # x held for b
    extender.backend.delete_pod("default/b")  # b goes before its bind: the bind fails
    assert call(extender, "bind", binding(b, "x")) != ""
    assert passes(extender, c) == ["x"]


def test_holds_can_be_turned_off(tmp_path: Path) -> None:
    a, b = k8s_pod("a", gpu_fraction="0.5"), k8s_pod("b", gpu_fraction="0.5")
    extender, _ = served(tmp_path, a, b, hold_s=0)
    call(extender, "prioritize", filter_args(a, ["x", "y"]))
    assert passes(extender, b) == ["x", "y"]


def test_a_bind_decides_under_the_cache_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the Kubernetes backend bind decides in a worker thread while filter and
    prioritize run: the policy's caches they share are read under the cache's lock."""
    a = k8s_pod("a", gpu_fraction="0.5")
    extender, _ = served(tmp_path, a)
    seen: list[bool] = []

    def evaluate(*args: Any) -> Any:
        seen.append(held_here(extender.cache.lock))
        return select.evaluate(*args)

    monkeypatch.setattr(service, "evaluate", evaluate)
    assert call(extender, "bind", binding(a, "y")) == ""  # no hold for a: the bind decides
    assert seen == [True]


def test_a_bind_takes_its_counted_hold_without_working_the_node_out_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache's state of the node counts the pod's hold beside exactly the node's records and
    the other holds: the share is still free there, so the bind takes it as held, with no state
    released, applied or evaluated; a bind without a hold still asks the policy."""
    a, b, c = (k8s_pod(n, gpu_fraction="0.25") for n in "abc")
    extender, _ = served(tmp_path, a, b, c)
    worked: list[str] = []
    for name in ("apply", "release"):
        real = getattr(NodeState, name)
        monkeypatch.setattr(NodeState, name, lambda self, *args, _n=name, _f=real: worked.append(_n) or _f(self, *args))
    monkeypatch.setattr(service, "evaluate", lambda *args: worked.append("evaluate") or select.evaluate(*args))

    call(extender, "prioritize", filter_args(a, ["x", "y"]))  # x held for a (worked out there)
    held = extender.cache.held("default/a")
    assert held is not None and held.node == "x"
    worked.clear()
    assert call(extender, "bind", binding(a, "x")) == ""
    assert worked == []
    assert extender.cache.state("x").allocation_of("default/a") == held.allocation

    call(extender, "prioritize", filter_args(b, ["x", "y"]))  # x (0.5 taken) held for b
    worked.clear()
    assert call(extender, "bind", binding(c, "x")) == ""  # c had no hold: the policy is asked
    assert worked == ["evaluate", "apply"]  # decided, then counted in the cache
    worked.clear()
    assert call(extender, "bind", binding(b, "x")) == ""  # c took what b's hold left: b's still free
    assert worked == []
    state = extender.cache.state("x")
    assert state is not None and state.frees[0].milli == 0  # busy, a, b and c: a quarter each, nothing over
    assert {k for k, _ in state.pods} == {"default/busy", "default/a", "default/b", "default/c"}


def test_policies_are_told_of_new_pods_under_the_cache_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Being told of a pod changes what a policy learned (fgd-reserve re-estimates its
    workload): never while a bind decides with it in a worker thread. (The service's ``tell``
    is watched, whatever the policy: binpack here, which learns nothing.)"""
    a = k8s_pod("a", gpu_fraction="0.5")
    extender, _ = served(tmp_path, a)
    seen: list[bool] = []
    monkeypatch.setattr(service, "tell", lambda policy, demand: seen.append(held_here(extender.cache.lock)))
    passes(extender, a)
    assert seen == [True]


def held_here(lock: Any) -> bool:
    """Whether the calling thread holds ``lock``: another thread cannot take it."""
    taken: list[bool] = []
    probe = threading.Thread(target=lambda: taken.append(lock.acquire(blocking=False)))
    probe.start()
    probe.join()
    if taken[0]:
        lock.release()
    return not taken[0]
