"""The defragmentation planner in timed replay: hand-derived runs, the arms, the command line."""

from __future__ import annotations

import csv
import pickle
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from scheduler.cli import app
from scheduler.sim.defrag import DefragSpec
from scheduler.sim.engine import simulate
from tests.sim.helpers import scenario

runner = CliRunner()

# One node, two MPS H100s; binpack packs shares onto the fullest GPU.
# t=0 x1 (0.5) and t=1 x2 (0.5) fill GPU 0; t=2 y (0.25) goes to GPU 1; t=3 x1 leaves: GPU 0
# holds x2, GPU 1 holds y, and no GPU is free when "train" (a whole GPU) comes at t=4.
FRAGMENTED = """
name: fragmented
replay: timed
nodes:
  - {name: n, cpu: 64, memory: 256Gi, gpus: {model: H100-80GB, count: 2, mode: mps}}
pods:
  - {name: x1, cpu: 1, memory: 1Gi, gpu: {fraction: 0.5}, arrive: 0, duration: 3}
  - {name: x2, cpu: 1, memory: 1Gi, gpu: {fraction: 0.5}, arrive: 1, duration: 10000}
  - {name: y, cpu: 1, memory: 1Gi, gpu: {fraction: 0.25}, arrive: 2, duration: 10000}
  - {name: train, cpu: 1, memory: 1Gi, gpu: {count: 1}, arrive: 4, duration: 1000}
"""


def run(spec: DefragSpec | None) -> object:
    return simulate(scenario(FRAGMENTED), "binpack", 1, defrag=spec)


def test_the_planner_moves_the_small_share_and_lets_the_whole_gpu_in() -> None:
    # GPU-seconds held: x1 0.5 x 3, x2 0.5 x 10000 (1..10001), y 0.25 x 10000 (2..10002; its
    # eviction and landing happen in no time).
    plain = run(None)
    assert (plain.failed, plain.evictions) == (1, 0)  # type: ignore[attr-defined]
    assert plain.gpu_hours == pytest.approx((1.5 + 5000 + 2500) / 3600)  # type: ignore[attr-defined]
    # waiting alone: nothing leaves before the planner runs at t=600: train is turned away then
    waited = run(DefragSpec(600, 0))
    assert (waited.failed, waited.waited_in, waited.evictions) == (1, 0, 0)  # type: ignore[attr-defined]
    # the planner at t=600: evict y (it lands beside x2 on GPU 0), train takes GPU 1 until its
    # departure time, t=1004: 404 GPU-seconds more.
    moved = run(DefragSpec(600, 1))
    assert (moved.failed, moved.placed, moved.evictions, moved.moves) == (0, 4, 1, 1)  # type: ignore[attr-defined]
    assert (moved.waited_in, moved.evicted_lost) == (1, 0)  # type: ignore[attr-defined]
    assert moved.gpu_hours == pytest.approx((1.5 + 5000 + 2500 + 404) / 3600)  # type: ignore[attr-defined]


def test_a_pod_waits_and_gets_in_when_another_leaves() -> None:
    # x2 leaves at t=300 (before the planner's run at 600): train, waiting, takes GPU 0 then.
    text = FRAGMENTED.replace("arrive: 1, duration: 10000", "arrive: 1, duration: 299")
    result = simulate(scenario(text), "binpack", 1, defrag=DefragSpec(600, 0))
    assert (result.failed, result.waited_in, result.evictions) == (0, 1, 0)
    # GPU-seconds: x1 1.5, x2 0.5 x 299, y 2500, train from x2's departure (t=300) to t=1004: 704
    assert result.gpu_hours == pytest.approx((1.5 + 149.5 + 2500 + 704) / 3600)
    assert simulate(scenario(text), "binpack", 1).failed == 1  # the plain replay turns it away at once


# Two MPS GPUs, each ends up with two 0.25 shares (f, 0.5, fills GPU 0 while c and d arrive, so
# they go to GPU 1, then leaves): a whole GPU needs both pods of one GPU evicted, two at once.
PAIRS = """
name: pairs
replay: timed
nodes:
  - {name: n, cpu: 64, memory: 256Gi, gpus: {model: H100-80GB, count: 2, mode: mps}}
pods:
  - {name: a, cpu: 1, memory: 1Gi, gpu: {fraction: 0.25}, arrive: 0, duration: 10000}
  - {name: b, cpu: 1, memory: 1Gi, gpu: {fraction: 0.25}, arrive: 1, duration: 10000}
  - {name: f, cpu: 1, memory: 1Gi, gpu: {fraction: 0.5}, arrive: 2, duration: 3}
  - {name: c, cpu: 1, memory: 1Gi, gpu: {fraction: 0.25}, arrive: 3, duration: 10000}
  - {name: d, cpu: 1, memory: 1Gi, gpu: {fraction: 0.25}, arrive: 4, duration: 10000}
  - {name: train, cpu: 1, memory: 1Gi, gpu: {count: 1}, arrive: 6, duration: 1000}
"""


def test_a_run_evicts_no_more_than_its_budget() -> None:
    one = simulate(scenario(PAIRS), "binpack", 1, defrag=DefragSpec(600, 1))
    assert (one.failed, one.evictions) == (1, 0)  # the one move needs two evictions: none is made
    two = simulate(scenario(PAIRS), "binpack", 1, defrag=DefragSpec(600, 2))
    assert (two.failed, two.evictions, two.moves, two.evicted_lost) == (0, 2, 1, 0)


def test_runs_repeat_exactly_and_the_options_are_checked() -> None:
    a, b = run(DefragSpec(600, 2)), run(DefragSpec(600, 2))
    assert (a.failed, a.evictions, a.gpu_hours) == (b.failed, b.evictions, b.gpu_hours)  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="interval"):
        DefragSpec(0, 1)
    with pytest.raises(ValueError, match="budget"):
        DefragSpec(60, -1)
    with pytest.raises(ValueError, match="simulated time"):
        simulate(scenario(FRAGMENTED), "binpack", 1, replay="arrivals", defrag=DefragSpec(60, 1))


def test_the_planner_asks_over_a_copy_of_what_the_replays_policy_learned(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planning asks the policy about clusters that are not the replay's; fgd-reserve's learned
    object follows the cluster's free GPU from call to call (its departures rule), so the
    replay's own learned object must not be the one asked: the policy over a copy of it is,
    made at the planner's run, with what it learned, and planning leaves the replay's as it was."""
    from scheduler.sim import defrag, engine

    built: list[Any] = []
    asked: list[tuple[Any, int]] = []

    def build(*args: Any) -> Any:
        built.append(real_build(*args))
        return built[-1]

    def plan(states: Any, pending: Any, movers: Any, policy: Any, *rest: Any) -> Any:
        replay = built[0].learned
        before = pickle.dumps(replay)
        assert pickle.dumps(policy.learned) == before  # a copy, as it stands
        asked.append((policy, replay.gpu_seen))
        found = real_plan(states, pending, movers, policy, *rest)
        assert pickle.dumps(replay) == before  # nothing planned reached the replay's learned object
        assert pickle.dumps(policy.learned) != before  # while the copy followed the plan's clusters
        return found

    real_build, real_plan = engine.build_policy, defrag.plan
    monkeypatch.setattr(engine, "build_policy", build)
    monkeypatch.setattr(defrag, "plan", plan)
    moved = simulate(scenario(FRAGMENTED), "fgd-reserve", 1, defrag=DefragSpec(600, 1))
    assert (moved.failed, moved.evictions) == (0, 1)
    (replay,) = built  # no second policy is built and told of the arrivals
    assert asked and all(policy is not replay and policy.learned is not replay.learned for policy, _ in asked)
    assert asked[-1][1] > 0  # the replay's policy had been told of the arrivals by then


def test_the_command_runs_each_arm_and_writes_defrag_csv(tmp_path: Path) -> None:
    path = tmp_path / "fragmented.yaml"
    path.write_text(FRAGMENTED)
    out = tmp_path / "out"
    args = ["simulate", str(path), "-p", "binpack", "--seeds", "1", "--workers", "1", "-q", "--out", str(out)]
    result = runner.invoke(app, [*args, "--defrag-budget", "off,wait,1", "--defrag-every", "10"])
    assert result.exit_code == 0, result.output
    with (out / "defrag.csv").open() as handle:
        rows = {r["arm"]: r for r in csv.DictReader(handle)}
    assert {a: (r["turned_away"], r["evictions"]) for a, r in rows.items()} == {
        "off": ("1", "0"),
        "wait": ("1", "0"),
        "1": ("0", "1"),
    }
    assert "in / eviction" in result.output and not (out / "summary.csv").exists()
    bad = runner.invoke(app, [*args, "--defrag-budget", "some"])
    assert bad.exit_code == 2 and "--defrag-budget 'some': accepted:" in bad.output
    bad = runner.invoke(app, [*args, "--defrag-budget", "1", "--defrag-every", "0"])
    assert bad.exit_code == 2 and "--defrag-every '0': accepted:" in bad.output
    bad = runner.invoke(app, [*args, "--defrag-budget", "1", "--replay", "arrivals"])
    assert bad.exit_code == 2 and "needs simulated time" in bad.output


def test_the_table_counts_pods_let_in_per_eviction_against_waiting() -> None:
    from scheduler.sim import defragtable

    def row(arm: str, seed: int, turned: int, evictions: int) -> dict[str, object]:
        return {
            "trace": "t",
            "policy": "p",
            "seed": seed,
            "arm": arm,
            "pods": 100,
            "turned_away": turned,
            "evicted_lost": 0,
            "evictions": evictions,
            "gpu_hours": 10.0,
        }

    recorded = [row("off", 1, 14, 0), row("off", 2, 16, 0), row("wait", 1, 10, 0), row("wait", 2, 12, 0)]
    recorded += [row("4", 1, 6, 4), row("4", 2, 8, 4), row("16", 1, 5, 10)]
    got = {r["arm"]: r for r in defragtable.summary(recorded)}
    assert [r["arm"] for r in defragtable.summary(recorded)] == ["off", "wait", "4", "16"]
    # (10 + 12 - 6 - 8) pods let in for 4 + 4 evictions
    assert got["4"]["per_eviction"] == 1.0 and got["4"]["turned_away"] == 7.0
    # seed 1 only: (10 - 5) / 10
    assert got["16"]["per_eviction"] == 0.5
    assert got["off"]["turned_away_sd"] == pytest.approx(2**0.5)
    assert "| t | p | 4 | 100 | 7.0 ± 1.4 | 4.0 | 0.0 | 10 | 1.00 |" in defragtable.markdown(list(got.values()))
