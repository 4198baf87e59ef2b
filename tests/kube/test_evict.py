"""``gpuslice defrag`` against a fake API server: the list it plans from, evictions with their
dry run, a PodDisruptionBudget's refusal, and no call outside DEFRAG_API_CALLS."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from scheduler.cli import app
from scheduler.core.pods import BOUND, holding_record
from scheduler.kube import DEFRAG_API_CALLS, Evictor, KubeApi, Outcome
from scheduler.kube.ledger import Entry, ledger_configmap
from scheduler.kube.options import KubeOptions
from tests.extender.kit import fragmented_cluster, k8s_pod
from tests.fakes import FakeApiServer, audited

runner = CliRunner()
PREFIX = "gpuslice.io/"
PDB_MESSAGE = "Cannot evict pod as it would violate the pod's disruption budget."


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    """The fake API server, audited against the calls the defrag account may make (not the service's)."""
    with audited(DEFRAG_API_CALLS, "DEFRAG_API_CALLS") as server:
        yield server


def load(apiserver: FakeApiServer, vouched: bool = True) -> None:
    """The fragmented cluster; with ``vouched``, each node's ledger holds the records its pods carry
    (as if gpuslice had bound them), else no ledger exists and every record is one written by hand."""
    ledgers: dict[str, dict[str, Entry]] = {}
    for obj in fragmented_cluster():
        (apiserver.put_node if obj["kind"] == "Node" else apiserver.put_pod)(obj)
        record = holding_record(obj, PREFIX) if obj["kind"] == "Pod" else None
        if record is not None:
            meta = obj["metadata"]
            entry = Entry(meta["uid"], record, BOUND, "2026-01-01T00:00:00Z")
            ledgers.setdefault(obj["spec"]["nodeName"], {})[f"{meta['namespace']}/{meta['name']}"] = entry
    for node, entries in ledgers.items() if vouched else ():
        apiserver.put_configmap(ledger_configmap(KubeOptions().namespace, PREFIX, node, entries))


def served_calls(apiserver: FakeApiServer) -> set[tuple[str, str, str]]:
    return {(verb, "", resource) for verb, resource in apiserver.served}


def test_evictions_dry_runs_refusals_and_pods_gone(apiserver: FakeApiServer) -> None:
    load(apiserver)
    evictor = Evictor(KubeApi.from_url(apiserver.url))
    assert evictor.evict("serve/a0", "uid-serve-a0", dry_run=True).outcome is Outcome.EVICTED
    assert apiserver.pod("serve", "a0") is not None  # a dry run changes nothing
    assert evictor.evict("serve/a0", "uid-serve-a0").outcome is Outcome.EVICTED
    assert apiserver.pod("serve", "a0") is None
    assert evictor.evict("serve/a0").outcome is Outcome.GONE  # 404
    assert evictor.evict("serve/a4", "uid-of-another-a4").outcome is Outcome.GONE  # 409: replaced
    assert apiserver.pod("serve", "a4") is not None
    apiserver.fault("create", "pods/eviction", status=429, message=PDB_MESSAGE)
    refused = evictor.evict("serve/b0", "uid-serve-b0")
    assert (refused.outcome, refused.message) == (Outcome.REFUSED, PDB_MESSAGE)
    assert apiserver.pod("serve", "b0") is not None
    assert served_calls(apiserver) <= DEFRAG_API_CALLS


def test_apply_evicts_the_plan_and_only_it(apiserver: FakeApiServer) -> None:
    load(apiserver)
    result = runner.invoke(app, ["defrag", "--api-url", apiserver.url, "-n", "serve", "--apply"])
    assert result.exit_code == 0, result.output
    assert "move 1: serve/a0 evicted" in result.output
    assert apiserver.pod("serve", "a0") is None
    left = [k for k in ("a4", "ds", "b0", "lonely", "b4") if apiserver.pod("serve", k) is not None]
    assert left == ["a4", "ds", "b0", "lonely", "b4"] and apiserver.pod("train", "big") is not None
    # the dry run, then the eviction, each with the pod's uid as a precondition
    assert [r for r in apiserver.requests if r[1] == "pods/eviction"] == [
        ("create", "pods/eviction", "a0"),
        ("create", "pods/eviction", "a0"),
    ]
    assert served_calls(apiserver) == DEFRAG_API_CALLS


def test_a_disruption_budget_stops_the_run_before_anything_is_evicted(apiserver: FakeApiServer) -> None:
    load(apiserver)
    apiserver.fault("create", "pods/eviction", status=429, message=PDB_MESSAGE)  # the dry run is refused
    result = runner.invoke(app, ["defrag", "--api-url", apiserver.url, "-n", "serve", "--apply", "--json"])
    assert result.exit_code == 0, result.output
    got: dict[str, Any] = json.loads(result.output)
    assert got["applied"] == [{"move": "1", "pod": "serve/a0", "outcome": "refused", "message": PDB_MESSAGE}]
    assert apiserver.pod("serve", "a0") is not None


def test_without_apply_nothing_is_evicted(apiserver: FakeApiServer) -> None:
    load(apiserver)
    result = runner.invoke(app, ["defrag", "--api-url", apiserver.url, "-n", "serve"])
    assert result.exit_code == 0, result.output
    assert "evict serve/a0" in result.output and "(a plan only: --apply evicts)" in result.output
    assert not [r for r in apiserver.requests if r[1] == "pods/eviction"]
    assert served_calls(apiserver) == {("list", "", "nodes"), ("list", "", "pods"), ("list", "", "configmaps")}


def test_a_refusal_after_the_dry_run_stops_the_run_there(apiserver: FakeApiServer) -> None:
    load(apiserver)
    # a second 3g.40gb waits: b4 (GPU 1, slot 4) is the only pod whose eviction frees a start for it
    apiserver.put_pod(k8s_pod("big2", namespace="train", mig_profile="3g.40gb"))
    plan = json.loads(runner.invoke(app, ["defrag", "--api-url", apiserver.url, "-n", "serve", "--json"]).output)
    assert [m["evict"] for m in plan["moves"]] == [["serve/a0"], ["serve/b4"]]
    # the dry run of a0 passes, its eviction is refused (the budget changed in between): stop there
    apiserver.fault("create", "pods/eviction", status=429, message=PDB_MESSAGE, skip=1)
    result = runner.invoke(app, ["defrag", "--api-url", apiserver.url, "-n", "serve", "--apply"])
    assert result.exit_code == 0, result.output
    assert f"stopped at move 1: evicting serve/a0 is refused: {PDB_MESSAGE}" in result.output
    assert apiserver.pod("serve", "a0") is not None and apiserver.pod("serve", "b4") is not None
    assert [r for r in apiserver.requests if r[1] == "pods/eviction"] == [("create", "pods/eviction", "a0")] * 2


def test_records_no_ledger_holds_claim_no_gpu_in_the_plan(apiserver: FakeApiServer) -> None:
    """Written by hand (no ledger holds them), the six records block nothing: train/big fits as
    things are, and no move is planned; with the ledgers, a0 must move (as above)."""
    load(apiserver, vouched=False)
    result = runner.invoke(app, ["defrag", "--api-url", apiserver.url, "-n", "serve", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert (plan["moves"], plan["fitsNow"]) == ([], [{"pod": "train/big", "node": "mig-node"}])
    for name in ("a0", "a4", "ds", "b0", "lonely", "b4"):
        apiserver.delete_pod("serve", name)
    load(apiserver)
    result = runner.invoke(app, ["defrag", "--api-url", apiserver.url, "-n", "serve", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert ([m["evict"] for m in plan["moves"]], plan["fitsNow"]) == ([["serve/a0"]], [])
