"""/debug/defrag and ``gpuslice defrag`` on a cluster file: the plan, what may move, the options."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from scheduler.cli import app
from scheduler.core.request import Demand, GpuRequest

from .kit import cluster_file, fragmented_cluster, k8s_node, k8s_pod

runner = CliRunner()


def test_the_route_plans_the_one_move_that_lets_the_3g_in(serve: Any) -> None:
    svc = serve(*fragmented_cluster(), defrag={"namespaces": ["serve"]})
    got = svc.http.get("/debug/defrag").json()
    (move,) = got["moves"]
    assert (move["node"], move["evict"], move["admits"]) == ("mig-node", ["serve/a0"], "train/big")
    assert move["frees"] == "GPU 0: 1g.10gb at slot 0; 1000m CPU"
    assert move["allocation"]["devices"][0]["mig"] == "3g.40gb@0"
    assert [landing["pod"] for landing in move["lands"]] == ["serve/a0"]
    # the movers: a0, a4, b0, b4 (not ds, a DaemonSet's; not lonely, which nothing recreates)
    assert (got["pending"], got["movable"], got["evictions"], got["stranded"]) == (1, 4, 1, [])
    # planning changed nothing: the service's own view is as it was
    assert {p["pod"] for p in svc.extender.describe("mig-node")[0]["pods"]} == {
        f"serve/{k}" for k in ("a0", "a4", "ds", "b0", "lonely", "b4")
    }


def test_nothing_moves_outside_the_namespaces_opted_in(serve: Any) -> None:
    svc = serve(*fragmented_cluster())  # no namespace opted in: the default
    got = svc.http.get("/debug/defrag").json()
    assert got["moves"] == [] and got["movable"] == 0
    assert got["stranded"] == [{"pod": "train/big", "reason": "no move of at most 8 movable pods lets it in"}]
    svc = serve(*fragmented_cluster(), defrag={"namespaces": ["train"]})
    assert svc.http.get("/debug/defrag").json()["moves"] == []


def test_the_command_prints_the_plan_of_a_cluster_file(tmp_path: Path) -> None:
    path = cluster_file(tmp_path / "cluster.json", *fragmented_cluster())
    result = runner.invoke(app, ["defrag", "--cluster-file", str(path), "-n", "serve"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "1 pending GPU pods, 4 pods that may move (controller-owned, in serve)"
    assert lines[1] == (
        "move 1: evict serve/a0 on mig-node (frees GPU 0: 1g.10gb at slot 0; 1000m CPU): lets train/big in; "
        "expected to land: serve/a0 -> mig-node"
    )
    assert lines[-1] == "(a plan only: --apply evicts)"
    as_json = runner.invoke(app, ["defrag", "--cluster-file", str(path), "-n", "serve", "--json"])
    assert json.loads(as_json.output)["moves"][0]["evict"] == ["serve/a0"]
    # a budget of no eviction plans nothing
    none = runner.invoke(app, ["defrag", "--cluster-file", str(path), "-n", "serve", "--max-evictions", "0", "--json"])
    assert json.loads(none.output)["moves"] == []


def test_the_command_reads_the_services_file_without_its_serving_settings(tmp_path: Path) -> None:
    path = cluster_file(tmp_path / "cluster.json", *fragmented_cluster())
    config = tmp_path / "gpuslice.yaml"
    config.write_text(
        "host: 0.0.0.0\ntls_cert: /nowhere/tls.crt\ntls_key: /nowhere/tls.key\npolicy: {name: spread}\n"
        "defrag: {namespaces: [serve], max_evictions: 2}\n"
    )
    result = runner.invoke(app, ["defrag", "--cluster-file", str(path), "--config", str(config), "--json"])
    assert result.exit_code == 0, result.output
    got = json.loads(result.output)
    assert got["namespaces"] == ["serve"] and got["maxEvictions"] == 2 and len(got["moves"]) == 1


def test_bad_options_are_one_line(tmp_path: Path) -> None:
    path = cluster_file(tmp_path / "cluster.json", k8s_node("n"), k8s_pod("p", gpu_fraction="0.5"))
    for args, fragment in (
        (["--apply"], "--apply evicts pods of the live cluster"),
        (["-n", "Not A Namespace"], "--namespace 'Not A Namespace': accepted: a namespace name"),
        (["--max-evictions", "-1"], "--max-evictions '-1': accepted: a whole number from 0 to 1000"),
        (["--policy", "nope"], "unknown policy 'nope'"),
    ):
        result = runner.invoke(app, ["defrag", "--cluster-file", str(path), *args])
        assert result.exit_code == 2, (args, result.output)
        assert fragment in result.output and "Traceback" not in result.output
        assert result.output.startswith("gpuslice defrag: ")


def test_a_pod_being_bound_is_not_pending(serve: Any) -> None:
    from scheduler.core.fit import fit
    from scheduler.core.request import parse_pod

    small = k8s_pod("small", namespace="train", mig_profile="1g.10gb")
    svc = serve(*fragmented_cluster(), small, defrag={"namespaces": ["serve"]})
    assert svc.http.get("/debug/defrag").json()["pending"] == 2
    cache = svc.extender.cache
    with cache.lock:
        state = cache.state("mig-node")
    found = fit(parse_pod(small).demand, state)
    cache.reserve("train/small", "uid-train-small", found.allocations[0])  # a bind decided, the watch not yet in
    got = svc.http.get("/debug/defrag").json()
    assert got["pending"] == 1 and [m["admits"] for m in got["moves"]] == ["train/big"]


def test_the_route_plans_over_a_copy_of_what_the_serving_policy_learned(
    serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planning asks the policy about clusters that are not the live one; fgd-reserve's learned
    object follows the cluster's free GPU from call to call (its departures rule), so the
    serving learned object must not be the one asked: the policy over a copy of it is, and
    nothing the planner asks reaches the serving one."""
    from scheduler.extender import defrag

    web = k8s_pod("web", namespace="serve", node="mig-node")  # no GPU: told too (CPU-bound rule)
    svc = serve(*fragmented_cluster(), web, defrag={"namespaces": ["serve"]}, policy="fgd-reserve")
    live = svc.extender.policy
    live.learned.observe(Demand(4000, 0, GpuRequest()))  # what it learned from a pod it served
    asked: list[Any] = []
    told: list[Any] = []
    real_observe = type(live.learned).observe

    def observe(learned: Any, demand: Any) -> None:
        told.append(demand)
        real_observe(learned, demand)

    monkeypatch.setattr(type(live.learned), "observe", observe)

    def plan(states: Any, pending: Any, movers: Any, policy: Any, *rest: Any) -> Any:
        asked.append(policy)
        return real_plan(states, pending, movers, policy, *rest)

    real_plan = defrag.plan
    monkeypatch.setattr(defrag, "plan", plan)
    before = pickle.dumps(live.learned)  # everything the serving policy learned
    assert [m["admits"] for m in svc.http.get("/debug/defrag").json()["moves"]] == ["train/big"]
    (policy,) = asked
    assert policy.name == live.name and policy.learned is not live.learned
    assert pickle.dumps(live.learned) == before
    assert policy.learned.flow != live.learned.flow  # the copy followed the clusters planned
    # a copy of what the serving policy learned: no second policy is told the pods again
    assert told == []
    assert policy.learned.cpu_seen == live.learned.cpu_seen == 4000
