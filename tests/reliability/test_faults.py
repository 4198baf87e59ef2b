"""API-server faults through the real extender and KubeBackend, over HTTP.

Each fault is injected in the fake API server while kube-scheduler's calls (filter, then
bind) reach a service replica. Expected every time: the bind answers an Error (kube-scheduler
requeues the pod) or succeeds; once the faults clear and a stale interval passes on the
fake clock, one sweep leaves every pod with a record bound, every ledger entry backed by a
live pod, no device over-allocated, and every replica's cache equal to the state rebuilt
from the API server's objects.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from scheduler.kube.ledger import ledger_name
from tests.fakes import FakeClock

from .harness import (
    KUBE_FAST,
    LEDGER_NAMESPACE,
    PREFIX,
    CountingApiServer,
    Replica,
    audit,
    cache_view,
    node_json,
    pod_json,
    truth,
    wait_for,
)

Make = Callable[..., Replica]
NODES = ("n1", "n2", "n3")


def cluster(api: CountingApiServer, pods: int = 8) -> list[dict[str, Any]]:
    """3 nodes x 2 H100-80GB under MPS; pods of half a GPU: 4 fit on a node, 12 in all."""
    for name in NODES:
        api.put_node(node_json(name, gpus=2))
    return [api.put_pod(pod_json(f"p{i:02d}", gpu_fraction="0.5")) for i in range(pods)]


def known(replica: Replica, pod: dict[str, Any]) -> None:
    key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
    wait_for(lambda: key in replica.extender.cache.pods, f"{key} in the cache")


def bind(replica: Replica, pod: dict[str, Any], node: str) -> str:
    """kube-scheduler's filter then bind; the bind's Error ("" when bound)."""
    known(replica, pod)
    replica.client.filter(pod, list(NODES))
    return replica.client.bind(pod, node)


def leftover(api: CountingApiServer, name: str) -> None:
    """Give the pod an annotation of ours no record sets (forged, or left by an older version):
    its bind then patches the record onto the pod before the Binding (else the record travels
    in the Binding alone)."""
    live = api.pod("default", name)
    assert live is not None
    live["metadata"].setdefault("annotations", {})[PREFIX + "bound-at"] = "2024-01-01T00:00:00Z"
    api.put_pod(live)


def record(api: CountingApiServer, name: str) -> str | None:
    live = api.pod("default", name)
    assert live is not None
    return (live["metadata"].get("annotations") or {}).get(PREFIX + "allocation")


def ledger_keys(api: CountingApiServer, node: str) -> set[str]:
    import json

    cm = api.configmap(LEDGER_NAMESPACE, ledger_name(node))
    return set(json.loads(cm["data"]["ledger"])) if cm else set()


def settle(api: CountingApiServer, clock: FakeClock, *replicas: Replica) -> None:
    """Faults clear, a stale interval passes, one sweep: then nothing half-written, caches = truth."""
    api.clear_faults()
    api.stall_watches(stalled=False)
    clock.advance(KUBE_FAST["stale_allocation_s"] + 1)
    for replica in replicas:
        replica.backend.sweep()
    report = audit(api)
    assert report.clean, report
    names = [n["metadata"]["name"] for n in api.nodes()]
    for replica in replicas:
        wait_for(lambda r=replica: cache_view(r.extender, names) == truth(api), "the cache to equal the truth")


def test_conflicts_on_every_write_fail_binds_cleanly(api: CountingApiServer, clock: FakeClock, replicas: Make) -> None:
    pods = cluster(api)
    replica = replicas(conflict_retries=3)
    for verb, resource in (("update", "configmaps"), ("create", "configmaps"), ("patch", "pods")):
        api.fault(verb, resource, status=409, times=None)
    api.fault("create", "pods/binding", status=409, times=None)
    errors = [bind(replica, pod, "n1") for pod in pods[:3]]
    assert all("HTTP 409" in e or "changed under 3 attempts" in e for e in errors), errors
    assert audit(api).bound == 0 and all(record(api, p["metadata"]["name"]) is None for p in pods)
    settle(api, clock, replica)
    # kube-scheduler retries: now every pod finds its share, 4 per node
    placed = [bind(replica, pod, NODES[i // 4]) for i, pod in enumerate(pods)]
    assert placed == [""] * 8
    settle(api, clock, replica)
    assert audit(api).bound == 8


def test_a_5xx_on_the_record_patch_rolls_back(api: CountingApiServer, clock: FakeClock, replicas: Make) -> None:
    pods = cluster(api, 2)
    leftover(api, "p00")
    replica = replicas()
    api.fault("patch", "pods", status=500)
    error = bind(replica, pods[0], "n1")
    assert "writing the allocation record of default/p00 failed" in error and "rolled back" in error
    assert ledger_keys(api, "n1") == set() and record(api, "p00") is None
    assert bind(replica, pods[0], "n1") == ""
    settle(api, clock, replica)


def test_a_record_patch_that_times_out_and_lands_after_its_undo_is_swept(
    api: CountingApiServer, clock: FakeClock, replicas: Make
) -> None:
    # Regression: the patch times out (1 s), the bind undoes (ledger entry, annotations), then the
    # delayed patch lands: a record on an unbound pod that no bind would ever come back to clean.
    pods = cluster(api, 1)
    leftover(api, "p00")
    replica = replicas(request_timeout_s=1.0)
    api.fault("patch", "pods", name="p00", delay_s=1.6, status=None)
    error = bind(replica, pods[0], "n1")
    assert "writing the allocation record of default/p00 failed" in error
    wait_for(lambda: record(api, "p00") is not None, "the late patch to land", timeout_s=5)
    assert [h.split(":")[0] for h in audit(api).half_written] == ["default/p00"]
    assert cache_view(replica.extender, ["n1"])["n1"] == truth(api)["n1"]  # it claims nothing meanwhile
    clock.advance(KUBE_FAST["stale_allocation_s"] + 1)
    assert replica.backend.sweep().records_removed == 1
    assert record(api, "p00") is None
    settle(api, clock, replica)


def test_a_5xx_binding_keeps_the_share_until_the_retry(
    api: CountingApiServer, clock: FakeClock, replicas: Make
) -> None:
    pods = cluster(api, 2)
    replica = replicas()
    api.fault("create", "pods/binding", status=503)
    error = bind(replica, pods[0], "n1")
    assert "the Binding may still land" in error
    assert ledger_keys(api, "n1") == {"default/p00"}  # reserved: releasing a share in use double-books
    assert bind(replica, pods[0], "n1") == ""  # the retry replaces its own reservation
    settle(api, clock, replica)
    assert audit(api).shares_by_node["n1"] == 1


def test_a_binding_whose_answer_is_lost_counts_as_bound(
    api: CountingApiServer, clock: FakeClock, replicas: Make
) -> None:
    pods = cluster(api, 1)
    replica = replicas()
    api.fault("create", "pods/binding", status=504, apply=True)
    assert bind(replica, pods[0], "n1") == ""
    settle(api, clock, replica)


def test_a_binding_that_times_out_and_lands_later(api: CountingApiServer, clock: FakeClock, replicas: Make) -> None:
    pods = cluster(api, 1)
    replica = replicas(request_timeout_s=1.0)
    api.fault("create", "pods/binding", delay_s=1.5, status=None)
    assert "the Binding may still land" in bind(replica, pods[0], "n1")
    wait_for(lambda: (api.pod("default", "p00") or {}).get("spec", {}).get("nodeName") == "n1", "the late Binding")
    assert bind(replica, pods[0], "n1") == ""  # kube-scheduler's retry finds it bound: same allocation
    settle(api, clock, replica)
    assert ledger_keys(api, "n1") == {"default/p00"}  # the entry kept: its pod is bound there


@pytest.mark.parametrize("fault", ["drop", "stall", "expire"])
def test_watch_faults_and_the_caches_converge(
    api: CountingApiServer, clock: FakeClock, replicas: Make, fault: str
) -> None:
    pods = cluster(api, 8)
    first, second = replicas(), replicas()
    assert [bind(first, p, "n1") for p in pods[:2]] == ["", ""]
    wait_for(lambda: api.open_watches("pods") == 2, "both replicas watching pods")
    # two replicas, each watching nodes, pods, GPU quotas and node ledgers
    if fault == "drop":
        assert api.drop_watches() == 8
    elif fault == "stall":
        api.stall_watches()
    else:
        assert api.expire_watches() == 8
    # binds carry on through both replicas while their views lag: the ledger decides
    results = [bind(first if i % 2 else second, p, "n2") for i, p in enumerate(pods[2:7])]
    assert results.count("") == 4 and "no share" in "".join(results)  # 4 halves fit on n2, the 5th does not
    settle(api, clock, first, second)
    assert audit(api).shares_by_node == {"n1": 2, "n2": 4, "n3": 0}


def test_a_node_deleted_while_a_bind_is_in_flight(api: CountingApiServer, clock: FakeClock, replicas: Make) -> None:
    pods = cluster(api, 3)
    replica = replicas()
    node = api.node("n1")
    for pod in pods:
        known(replica, pod)
    api.fault("create", "pods/binding", name="p00", delay_s=0.8, status=None)
    outcome: list[str] = []
    thread = threading.Thread(target=lambda: outcome.append(bind(replica, pods[0], "n1")))
    thread.start()
    wait_for(lambda: ("create", "pods/binding", "p00") in api.requests, "the bind to reach its Binding")
    api.delete_node("n1")
    thread.join(timeout=10)
    # The Binding names a node that is gone: the API server accepts it (the pod garbage collector
    # deletes such pods later), so the bind completes as kube-scheduler's own binder would.
    assert outcome == [""]
    wait_for(lambda: "n1" not in replica.extender.cache.board, "the node to leave the cache")
    error = bind(replica, pods[1], "n1")
    assert "n1" in error and "unknown" in error  # a bind to a node already gone fails cleanly
    settle(api, clock, replica)
    assert node is not None
    api.put_node(node)  # back again (re-registered): the pod bound to it counts again
    settle(api, clock, replica)
    assert truth(api)["n1"] is not None and audit(api).shares_by_node["n1"] == 1


def test_a_pod_deleted_between_filter_and_bind(api: CountingApiServer, clock: FakeClock, replicas: Make) -> None:
    pods = cluster(api, 2)
    replica = replicas()
    known(replica, pods[0])
    assert replica.client.filter(pods[0], list(NODES))["NodeNames"] == list(NODES)
    api.delete_pod("default", "p00")
    wait_for(lambda: "default/p00" not in replica.extender.cache.pods, "the deletion to reach the cache")
    error = replica.client.bind(pods[0], "n1")
    assert "default/p00 does not exist" in error
    assert ledger_keys(api, "n1") == set()
    # deleted while the bind is in flight (between the ledger write and the Binding)
    api.fault("create", "pods/binding", name="p01", delay_s=0.5, status=None)
    known(replica, pods[1])
    outcome: list[str] = []
    thread = threading.Thread(target=lambda: outcome.append(bind(replica, pods[1], "n1")))
    thread.start()
    wait_for(lambda: ("create", "pods/binding", "p01") in api.requests, "the bind to reach its Binding")
    api.delete_pod("default", "p01")
    thread.join(timeout=10)
    assert "HTTP 404" in outcome[0] and "rolled back" in outcome[0]
    assert ledger_keys(api, "n1") == set()
    settle(api, clock, replica)


def test_the_sweep_leaves_binds_in_progress_alone_and_skips_settled_ledgers(
    api: CountingApiServer, clock: FakeClock, replicas: Make
) -> None:
    pods = cluster(api, 3)
    leftover(api, "p01")  # so its record is patched onto it before the Binding
    replica = replicas()
    assert bind(replica, pods[0], "n1") == ""  # settled: bound (its entry marked by n1's next write)
    api.fault("create", "pods/binding", status=503)  # p01 keeps its reservation and its record
    assert "may still land" in bind(replica, pods[1], "n1")
    report = replica.backend.sweep()
    # fresh: nothing is touched (that bind may still be going on, or be retried)
    assert (report.entries_dropped, report.records_removed) == (0, 0)
    assert ledger_keys(api, "n1") == {"default/p00", "default/p01"} and record(api, "p01") is not None
    clock.advance(KUBE_FAST["stale_allocation_s"] + 1)
    report = replica.backend.sweep()
    assert (report.ledgers, report.entries_dropped) == (1, 1)
    assert ledger_keys(api, "n1") == {"default/p00"} and record(api, "p01") is None
    lists = api.count("list", "pods")
    report = replica.backend.sweep()  # every entry's pod watched bound on n1: no call for the ledger
    assert report.ledgers == 0 and api.count("list", "pods") == lists + 1  # only the unbound pods' list
    settle(api, clock, replica)


@pytest.mark.parametrize("error", [ValueError("Cannot shutdown socket"), RuntimeError("released to the pool")])
def test_closing_a_watch_at_any_moment_never_raises(error: Exception) -> None:
    # Regression: stop() closing a watch whose connection urllib3 would not shut down (seen as a
    # flaky error in tests/kube under load) raised out of KubeBackend.stop().
    from scheduler.kube.api import WatchStream

    class Response:
        closed = False

        def shutdown(self) -> None:
            raise error

        def close(self) -> None:
            self.closed = True

    response = Response()
    WatchStream("watch pods", response).close()
    assert response.closed
