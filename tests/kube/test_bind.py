"""Bind through the real client against the fake API server: the ledger's compare-and-set, the record,
the Binding, and what is undone (or deliberately kept) when a step fails."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from scheduler.backend import PodRef
from scheduler.core.allocation import decode_record
from scheduler.kube import KubeBackend, ledger_name
from scheduler.kube.binder import WatchedPod
from tests.fakes import FakeApiServer, FakeClock
from tests.kube.conftest import Recorder, decide_for, gpu_node, gpu_pod, wait_until

Make = Callable[..., KubeBackend]
PREFIX = "gpuslice.io/"
LEDGER_NS = "gpuslice"


def ref(apiserver: FakeApiServer, name: str, namespace: str = "default") -> PodRef:
    live = apiserver.pod(namespace, name)
    assert live is not None
    return PodRef(namespace, name, live["metadata"]["uid"])


def ledger(apiserver: FakeApiServer, node: str = "n1") -> dict[str, Any]:
    cm = apiserver.configmap(LEDGER_NS, ledger_name(node))
    return {} if cm is None else json.loads(cm["data"]["ledger"])


def annotations(apiserver: FakeApiServer, name: str) -> dict[str, str]:
    live = apiserver.pod("default", name)
    assert live is not None
    return dict(live["metadata"].get("annotations") or {})


def record_keys(apiserver: FakeApiServer, name: str) -> set[str]:
    return {k for k in annotations(apiserver, name) if k.startswith(PREFIX) and k != PREFIX + "gpu-memory"}


def leftover(apiserver: FakeApiServer, name: str) -> None:
    """Give the pod an annotation of ours no record sets (forged, or left by an older version):
    its bind then patches the pod before the Binding."""
    live = apiserver.pod("default", name)
    assert live is not None
    live["metadata"].setdefault("annotations", {})[PREFIX + "bound-at"] = "2024-01-01T00:00:00Z"
    apiserver.put_pod(live)


def setup_pods(apiserver: FakeApiServer, *names: str, gpus: int = 1) -> dict[str, Any]:
    node = apiserver.put_node(gpu_node("n1", gpus=gpus))
    for name in names:
        apiserver.put_pod(gpu_pod(name))
    return node


def bind(
    backend: KubeBackend,
    apiserver: FakeApiServer,
    node: dict[str, Any],
    name: str,
    seen: list[Sequence[tuple[str, str]]] | None = None,
) -> Any:
    live = apiserver.pod("default", name)
    assert live is not None
    return backend.bind(ref(apiserver, name), "n1", decide_for(node, live, seen))


def test_bind_writes_ledger_record_and_binding(apiserver: FakeApiServer, make_backend: Make) -> None:
    node = setup_pods(apiserver, "a")
    result = bind(make_backend(), apiserver, node, "a")
    assert result.error == "" and result.allocation is not None
    live = apiserver.pod("default", "a")
    assert live is not None and live["spec"]["nodeName"] == "n1"
    notes = annotations(apiserver, "a")
    assert notes[PREFIX + "bind-phase"] == "bound"  # copied from the Binding, in the same write as nodeName
    assert notes[PREFIX + "visible-devices"] == "0"
    assert notes[PREFIX + "mps-memory-limit"] == "0=20480M"  # 20Gi = 20 x 1024 MiB on GPU 0
    assert decode_record(notes[PREFIX + "allocation"], "default/a") == result.allocation
    assert json.loads(notes[PREFIX + "allocation"])["timestamp"] == "2024-05-01T12:00:00Z"  # the fake clock
    entry = ledger(apiserver)["default/a"]
    assert entry == {
        "uid": "uid-a",
        "record": notes[PREFIX + "allocation"],
        "phase": "allocating",  # as written; marked bound by the node's next write once watched bound
        "time": "2024-05-01T12:00:00Z",
    }
    cm = apiserver.configmap(LEDGER_NS, "gpuslice-node-n1")
    assert cm is not None and cm["metadata"]["annotations"] == {PREFIX + "node": "n1"}


def test_a_bind_writes_the_pod_once_and_reads_no_ledger_it_wrote(apiserver: FakeApiServer, make_backend: Make) -> None:
    # The record travels in the Binding (the API server copies its annotations onto the pod as it
    # sets the node); the node's ledger is decided on as this process last wrote it.
    node = setup_pods(apiserver, "a", "b")
    backend = make_backend()
    assert bind(backend, apiserver, node, "a").error == ""
    reads = apiserver.count("get", "configmaps")
    assert bind(backend, apiserver, node, "b").error == ""
    assert apiserver.count("get", "configmaps") == reads  # b's bind: no ledger read
    assert apiserver.count("patch", "pods") == 0
    assert apiserver.count("create", "pods/binding") == 2
    assert set(ledger(apiserver)) == {"default/a", "default/b"}
    assert apiserver.count("update", "configmaps") == 1  # b's entry: nothing marks a's bound after its Binding
    assert record_keys(apiserver, "b") == {
        PREFIX + k for k in ("allocation", "bind-phase", "visible-devices", "mps-memory-limit", "mps-thread-percentage")
    }


def test_a_nodes_first_bind_lists_no_pods_and_a_ledger_read_with_entries_does(
    apiserver: FakeApiServer, make_backend: Make
) -> None:
    # The pods on the node are read only to weigh the ledger's entries: with no ledger yet there
    # is nothing to weigh. A process that remembers no ledger (a restart, another replica) reads
    # it, and then weighs a's entry against the pods on the node.
    node = setup_pods(apiserver, "a", "b")
    assert bind(make_backend(), apiserver, node, "a").error == ""
    assert apiserver.count("get", "configmaps") == 1 and apiserver.count("list", "pods") == 0
    assert bind(make_backend(), apiserver, node, "b").error == ""
    assert apiserver.count("get", "configmaps") == 2 and apiserver.count("list", "pods") == 1
    assert set(ledger(apiserver)) == {"default/a", "default/b"}


def test_a_synced_backend_makes_a_nodes_first_ledger_without_reading_it(
    apiserver: FakeApiServer, make_backend: Make
) -> None:
    # The ledgers' watch knows none of n1: the first bind creates it at once (no read, no list).
    node = setup_pods(apiserver, "a")
    backend = make_backend()
    backend.start(Recorder())
    listed = apiserver.count("list", "pods")  # the watch's own first list
    try:
        assert bind(backend, apiserver, node, "a").error == ""
    finally:
        backend.stop()
    assert apiserver.count("get", "configmaps") == 0 and apiserver.count("list", "pods") == listed
    assert apiserver.count("create", "configmaps") == 1
    assert set(ledger(apiserver)) == {"default/a"}


def test_entries_of_pods_watched_bound_are_marked_by_the_nodes_next_write_and_not_swept(
    apiserver: FakeApiServer, make_backend: Make
) -> None:
    # A bind makes no call after its Binding: its entry stays "allocating" until the
    # node's ledger is written next, which marks bound the entries of pods the watch shows bound
    # there. The sweep visits no ledger whose every pod the watch shows bound on its node.
    node = setup_pods(apiserver, "a", "b")
    backend = make_backend()
    backend.start(Recorder())
    try:
        assert bind(backend, apiserver, node, "a").error == ""
        assert ledger(apiserver)["default/a"]["phase"] == "allocating"
        wait_until(lambda: backend._pods.get("default/a") == WatchedPod("uid-a", "n1", True), "a watched bound")
        before = apiserver.count("update", "configmaps")
        assert bind(backend, apiserver, node, "b").error == ""
        assert apiserver.count("update", "configmaps") == before + 1  # b's entry alone: no marking call
        assert {k: e["phase"] for k, e in ledger(apiserver).items()} == {
            "default/a": "bound",
            "default/b": "allocating",
        }
        wait_until(lambda: backend._pods.get("default/b") == WatchedPod("uid-b", "n1", True), "b watched bound")
        calls = len(apiserver.requests)
        report = backend.sweep()
        assert report.ledgers == 0  # every entry's pod watched bound on n1: not visited
        assert {(verb, resource) for verb, resource, _ in apiserver.requests[calls:]} == {
            ("list", "configmaps"),  # the ledgers
            ("list", "pods"),  # the unbound pods (records nothing vouches for)
        }
        apiserver.delete_pod("default", "a")
        wait_until(lambda: "default/a" not in backend._pods, "a's deletion watched")
        report = backend.sweep()  # a's entry: its pod gone, so n1's ledger is visited, a's entry dropped
        assert (report.ledgers, report.entries_dropped) == (1, 1)
        assert {k: e["phase"] for k, e in ledger(apiserver).items()} == {"default/b": "bound"}
    finally:
        backend.stop()


def calls_of(apiserver: FakeApiServer, since: int) -> list[tuple[str, str]]:
    """The calls made since ``since`` requests, the watches' own left out."""
    return [(verb, resource) for verb, resource, _ in apiserver.requests[since:] if verb != "watch"]


def test_a_pod_the_watch_shows_pending_is_bound_in_two_calls_without_reading_it(
    apiserver: FakeApiServer, make_backend: Make
) -> None:
    node = setup_pods(apiserver, "a", "b")
    leftover(apiserver, "b")  # an annotation of ours on b: its bind reads it and patches it first
    backend = make_backend()
    backend.start(Recorder())
    try:
        wait_until(lambda: {"default/a", "default/b"} <= set(backend._pods), "a and b watched")
        since = len(apiserver.requests)
        assert bind(backend, apiserver, node, "a").error == ""
        assert calls_of(apiserver, since) == [("create", "configmaps"), ("create", "pods/binding")]
        since = len(apiserver.requests)
        assert bind(backend, apiserver, node, "b").error == ""
        assert calls_of(apiserver, since) == [
            ("get", "pods"),
            ("update", "configmaps"),
            ("patch", "pods"),
            ("create", "pods/binding"),
        ]
    finally:
        backend.stop()
    assert record_keys(apiserver, "b") == {
        PREFIX + k for k in ("allocation", "bind-phase", "visible-devices", "mps-memory-limit", "mps-thread-percentage")
    }
    assert set(ledger(apiserver)) == {"default/a", "default/b"}


def test_a_repeated_bind_the_watch_has_not_seen_land_reads_the_pod_and_allocates_nothing_more(
    apiserver: FakeApiServer, make_backend: Make
) -> None:
    # kube-scheduler sends a's bind again (the first answer was lost) before the watch shows a
    # bound: the ledger holds a's entry, so the pod is read, found bound, and the first
    # allocation answered again; nothing new is written.
    node = setup_pods(apiserver, "a")
    backend = make_backend()
    uid = ref(apiserver, "a").uid
    backend._binder._watched = lambda key: WatchedPod(uid, "", False) if key == "default/a" else None
    first = bind(backend, apiserver, node, "a")
    assert first.error == "" and apiserver.count("get", "pods") == 0
    before = ledger(apiserver)
    since = len(apiserver.requests)
    again = bind(backend, apiserver, node, "a")
    assert again.error == "" and again.allocation == first.allocation
    assert calls_of(apiserver, since) == [("get", "pods")]
    assert ledger(apiserver) == before


@pytest.mark.parametrize("change", ["recreated", "bound by another"])
def test_a_pod_that_changed_since_the_watch_showed_it_pending_is_refused_and_its_entry_undone(
    apiserver: FakeApiServer, make_backend: Make, change: str
) -> None:
    node = setup_pods(apiserver, "a")
    backend = make_backend()
    uid = ref(apiserver, "a").uid
    backend._binder._watched = lambda key: WatchedPod(uid, "", False)  # what the watch last showed
    live = apiserver.pod("default", "a")
    assert live is not None
    if change == "recreated":
        apiserver.delete_pod("default", "a")
        apiserver.put_pod(gpu_pod("a", uid="uid-a2"))
    else:  # bound by something other than gpuslice (no record of ours on it)
        live["spec"]["nodeName"] = "n1"
        apiserver.put_pod(live)
    result = backend.bind(PodRef("default", "a", uid), "n1", decide_for(node, live, None))
    assert "binding default/a to n1 failed" in result.error and "rolled back" in result.error
    assert ledger(apiserver) == {}  # the share is not held for a pod that does not hold it


def test_a_ledger_the_watch_has_not_shown_yet_is_read_when_its_creation_is_refused(
    apiserver: FakeApiServer, make_backend: Make
) -> None:
    # Another replica made n1's ledger (a's entry) a moment ago, before this process's watch
    # shows it: the create is refused (it exists), the ledger is read, a's entry kept.
    node = setup_pods(apiserver, "a", "b")
    assert bind(make_backend(), apiserver, node, "a").error == ""
    late = make_backend()
    late._binder._ledger_absent = lambda _node: True  # as a watch that has not caught up
    assert bind(late, apiserver, node, "b").error == ""
    assert apiserver.count("create", "configmaps") == 2  # a's, and b's refused one
    assert set(ledger(apiserver)) == {"default/a", "default/b"}


def test_annotations_of_ours_on_the_pod_are_patched_away_before_the_binding(
    apiserver: FakeApiServer, make_backend: Make
) -> None:
    node = setup_pods(apiserver, "a")
    leftover(apiserver, "a")
    assert bind(make_backend(), apiserver, node, "a").error == ""
    assert apiserver.count("patch", "pods") == 1
    assert PREFIX + "bound-at" not in annotations(apiserver, "a")
    assert annotations(apiserver, "a")[PREFIX + "bind-phase"] == "bound"


def test_a_ledger_another_writer_changed_is_read_again(apiserver: FakeApiServer, make_backend: Make) -> None:
    # Two replicas: what one wrote, the other's remembered version lacks; the compare-and-set
    # refuses the stale version and the bind decides again on the ledger as it is.
    node = setup_pods(apiserver, "a", "b", "c", "d", "e")
    first, second = make_backend(), make_backend()
    for name in "ab":
        assert bind(first, apiserver, node, name).error == ""
    assert bind(second, apiserver, node, "c").error == ""  # second remembers a, b, c
    assert bind(first, apiserver, node, "d").error == ""  # first's a, b is stale: re-read, a-d
    seen: list[Sequence[tuple[str, str]]] = []
    assert "more than is free" in bind(second, apiserver, node, "e", seen).error  # full: a-d hold the GPU
    assert [k for k, _ in seen[-1]] == ["default/a", "default/b", "default/c", "default/d"]
    assert set(ledger(apiserver)) == {"default/a", "default/b", "default/c", "default/d"}


def test_a_no_decided_on_a_remembered_ledger_is_asked_again_of_the_api_server(
    apiserver: FakeApiServer, make_backend: Make
) -> None:
    # Another replica's sweep dropped an entry: the share is free, though the remembered ledger
    # still holds it; a refusal is never given on a version that may be out of date.
    node = setup_pods(apiserver, "a", "b", "c", "d", "e")
    backend, other = make_backend(), make_backend()
    for name in "abcd":
        assert bind(backend, apiserver, node, name).error == ""
    apiserver.delete_pod("default", "a")
    assert other.sweep().entries_dropped == 1
    seen: list[Sequence[tuple[str, str]]] = []
    assert bind(backend, apiserver, node, "e", seen).error == ""
    assert len(seen) == 2 and [k for k, _ in seen[-1]] == ["default/b", "default/c", "default/d"]


def test_a_remembered_ledger_deleted_since_is_made_again(apiserver: FakeApiServer, make_backend: Make) -> None:
    node = setup_pods(apiserver, "a", "b")
    backend = make_backend()
    assert bind(backend, apiserver, node, "a").error == ""
    apiserver.delete_configmap(LEDGER_NS, "gpuslice-node-n1")  # an operator's mistake: a's bind is forgotten
    assert bind(backend, apiserver, node, "b").error == ""  # the replace finds none: read again, created
    assert set(ledger(apiserver)) == {"default/b"}


def test_an_entry_of_a_pod_gone_since_holds_its_share_until_a_read_or_the_sweep_drops_it(
    apiserver: FakeApiServer, make_backend: Make
) -> None:
    node = setup_pods(apiserver, "a", "b", "c")
    backend = make_backend()
    for name in "ab":
        assert bind(backend, apiserver, node, name).error == ""
    apiserver.delete_pod("default", "a")
    lists = apiserver.count("list", "pods")
    seen: list[Sequence[tuple[str, str]]] = []
    assert bind(backend, apiserver, node, "c", seen).error == ""  # room left beside a and b: no call to check
    assert apiserver.count("list", "pods") == lists and [k for k, _ in seen[-1]] == ["default/a", "default/b"]
    assert set(ledger(apiserver)) == {"default/a", "default/b", "default/c"}
    assert backend.sweep().entries_dropped == 1
    assert set(ledger(apiserver)) == {"default/b", "default/c"}


def test_a_repeated_bind_returns_the_same_allocation_without_allocating_again(
    apiserver: FakeApiServer, make_backend: Make
) -> None:
    node = setup_pods(apiserver, "a")
    backend = make_backend()
    first = bind(backend, apiserver, node, "a")
    seen: list[Sequence[tuple[str, str]]] = []
    again = bind(backend, apiserver, node, "a", seen)
    assert again.error == "" and again.allocation == first.allocation
    assert seen == []  # decided nothing
    assert apiserver.count("create", "pods/binding") == 1
    assert list(ledger(apiserver)) == ["default/a"]


def test_a_bind_to_another_node_of_a_bound_pod_fails(apiserver: FakeApiServer, make_backend: Make) -> None:
    node = setup_pods(apiserver, "a")
    backend = make_backend()
    bind(backend, apiserver, node, "a")
    result = backend.bind(ref(apiserver, "a"), "n2", decide_for(node, gpu_pod("a")))
    assert result.allocation is None and "already bound to node n1" in result.error


def test_a_conflict_on_the_ledger_is_retried_against_the_new_ledger(
    apiserver: FakeApiServer, make_backend: Make
) -> None:
    node = setup_pods(apiserver, "a", "b")
    backend = make_backend()
    bind(backend, apiserver, node, "a")  # creates the ledger, then marks a bound (1 update)
    conflict = apiserver.fault("update", "configmaps", status=409)
    seen: list[Sequence[tuple[str, str]]] = []
    result = bind(backend, apiserver, node, "b", seen)
    assert result.error == "" and conflict.fired == 1
    assert len(seen) == 2  # decided, lost the compare-and-set, re-read and decided again
    assert [k for k, _ in seen[1]] == ["default/a"]
    assert set(ledger(apiserver)) == {"default/a", "default/b"}


def test_endless_conflicts_give_up_cleanly(apiserver: FakeApiServer, make_backend: Make) -> None:
    node = setup_pods(apiserver, "a", "b")
    backend = make_backend(conflict_retries=3)
    bind(backend, apiserver, node, "a")
    apiserver.fault("update", "configmaps", status=409, times=None)
    result = bind(backend, apiserver, node, "b")
    assert result.allocation is None and "changed under 3 attempts" in result.error
    assert record_keys(apiserver, "b") == set()
    assert set(ledger(apiserver)) == {"default/a"}


def test_a_decision_against_the_pod_is_reported_and_writes_nothing(
    apiserver: FakeApiServer, make_backend: Make
) -> None:
    node = setup_pods(apiserver)
    apiserver.put_pod(gpu_pod("huge", gpu_memory="100Gi"))
    result = bind(make_backend(), apiserver, node, "huge")
    assert result.allocation is None
    assert result.error.startswith("no share for default/huge on n1: needs 102400 MiB")
    assert apiserver.configmap(LEDGER_NS, "gpuslice-node-n1") is None
    assert apiserver.count("patch", "pods") == 0 and apiserver.count("create", "pods/binding") == 0


@pytest.mark.parametrize("status", [403, 409, 422])
def test_a_refused_binding_rolls_back_record_and_ledger_entry(
    apiserver: FakeApiServer, make_backend: Make, status: int
) -> None:
    node = setup_pods(apiserver, "a")
    apiserver.fault("create", "pods/binding", status=status, message="refused")
    result = bind(make_backend(), apiserver, node, "a")
    assert result.allocation is None
    assert f"HTTP {status}" in result.error and "the allocation was rolled back" in result.error
    assert record_keys(apiserver, "a") == set()
    assert ledger(apiserver) == {}
    live = apiserver.pod("default", "a")
    assert live is not None and "nodeName" not in live["spec"]


def test_a_failed_record_patch_removes_the_ledger_entry(apiserver: FakeApiServer, make_backend: Make) -> None:
    node = setup_pods(apiserver, "a")
    leftover(apiserver, "a")
    apiserver.fault("patch", "pods", status=500)
    result = bind(make_backend(), apiserver, node, "a")
    assert "writing the allocation record of default/a failed" in result.error
    assert "rolled back" in result.error
    assert ledger(apiserver) == {} and record_keys(apiserver, "a") == {PREFIX + "bound-at"}
    assert apiserver.count("create", "pods/binding") == 0


def test_a_binding_that_happened_despite_an_error_answer_counts_as_bound(
    apiserver: FakeApiServer, make_backend: Make
) -> None:
    node = setup_pods(apiserver, "a")
    apiserver.fault("create", "pods/binding", status=504, apply=True)  # done, but the answer is an error
    result = bind(make_backend(), apiserver, node, "a")
    assert result.error == "" and result.allocation is not None
    assert ledger(apiserver)["default/a"]["uid"] == "uid-a"  # the share stays counted


def test_an_unanswered_binding_keeps_the_share_reserved(
    apiserver: FakeApiServer, make_backend: Make, clock: FakeClock
) -> None:
    # The Binding answers 503 and did not happen; it could have (a 5xx is ambiguous), so the share
    # stays reserved: releasing a share in use is what double-books.
    node = setup_pods(apiserver, "a", "b", "c", "d", "late")
    backend = make_backend()
    apiserver.fault("create", "pods/binding", status=503)
    failed = bind(backend, apiserver, node, "a")
    assert "the Binding may still land" in failed.error
    assert ledger(apiserver)["default/a"]["phase"] == "allocating"
    for name in ("b", "c", "d"):
        assert bind(backend, apiserver, node, name).error == ""
    # a's reservation fills the GPU (4 x 20 GiB of 80 GiB)
    assert "needs 25 percent compute" in bind(backend, apiserver, node, "late").error
    # kube-scheduler retries a: its own old reservation is replaced, not counted twice
    retry = bind(backend, apiserver, node, "a")
    assert retry.error == ""
    assert set(ledger(apiserver)) == {"default/a", "default/b", "default/c", "default/d"}


def test_a_reservation_unbound_for_too_long_is_dropped(
    apiserver: FakeApiServer, make_backend: Make, clock: FakeClock
) -> None:
    node = setup_pods(apiserver, "a", "b", "c", "d", "late")
    leftover(apiserver, "a")  # so the record is written on the pod before its Binding
    backend = make_backend()  # stale_allocation_s=60
    apiserver.fault("create", "pods/binding", status=503)
    bind(backend, apiserver, node, "a")
    for name in ("b", "c", "d"):
        bind(backend, apiserver, node, name)
    assert bind(backend, apiserver, node, "late").error
    clock.advance(61)
    assert record_keys(apiserver, "a") == {
        PREFIX + k for k in ("allocation", "bind-phase", "visible-devices", "mps-memory-limit", "mps-thread-percentage")
    }
    assert bind(backend, apiserver, node, "late").error == ""  # a's stale reservation was dropped
    assert "default/a" not in ledger(apiserver)
    assert record_keys(apiserver, "a") == set()  # and the record it left on the pod removed


def test_a_binding_that_times_out_and_lands_later_is_not_released(apiserver: FakeApiServer, make_backend: Make) -> None:
    node = setup_pods(apiserver, "a")
    backend = make_backend()  # request_timeout_s=1
    apiserver.fault("create", "pods/binding", status=None, delay_s=1.5)  # served after the client gave up
    result = bind(backend, apiserver, node, "a")
    assert "Read timed out" in result.error and "stays reserved" in result.error
    assert ledger(apiserver)["default/a"]["phase"] == "allocating"
    from tests.kube.conftest import wait_until

    wait_until(lambda: (apiserver.pod("default", "a") or {})["spec"].get("nodeName") == "n1", "the late Binding")
    again = bind(backend, apiserver, node, "a")  # the scheduler's retry finds it bound
    assert again.error == "" and again.allocation is not None
    assert decode_record(annotations(apiserver, "a")[PREFIX + "allocation"], "default/a") == again.allocation


def test_a_pod_deleted_before_its_bind_is_not_bound(apiserver: FakeApiServer, make_backend: Make) -> None:
    node = setup_pods(apiserver, "a")
    pod_ref = ref(apiserver, "a")
    apiserver.delete_pod("default", "a")
    result = make_backend().bind(pod_ref, "n1", decide_for(node, gpu_pod("a")))
    assert result.error == "pod default/a does not exist (deleted before its bind)"
    assert apiserver.configmap(LEDGER_NS, "gpuslice-node-n1") is None


def test_a_recreated_pod_is_not_bound_in_place_of_the_old_one(apiserver: FakeApiServer, make_backend: Make) -> None:
    node = setup_pods(apiserver, "a")
    old = ref(apiserver, "a")
    apiserver.delete_pod("default", "a")
    apiserver.put_pod(gpu_pod("a", uid="uid-a-2"))
    result = make_backend().bind(old, "n1", decide_for(node, gpu_pod("a")))
    assert "has uid uid-a-2, not uid-a" in result.error


def test_entries_of_deleted_or_finished_pods_free_their_share(apiserver: FakeApiServer, make_backend: Make) -> None:
    node = setup_pods(apiserver, "a", "b", "c", "d", "e", "f")
    backend = make_backend()
    for name in "abcd":
        assert bind(backend, apiserver, node, name).error == ""
    assert bind(backend, apiserver, node, "e").error  # full
    apiserver.delete_pod("default", "a")
    apiserver.set_pod_phase("default", "b", "Succeeded")
    seen: list[Sequence[tuple[str, str]]] = []
    assert bind(backend, apiserver, node, "e", seen).error == ""
    assert [k for k, _ in seen[-1]] == ["default/c", "default/d"]
    assert bind(backend, apiserver, node, "f").error == ""
    assert set(ledger(apiserver)) == {"default/c", "default/d", "default/e", "default/f"}


def test_the_ledger_not_the_pods_says_what_gpuslice_bound(apiserver: FakeApiServer, make_backend: Make) -> None:
    # The ledger is the source of truth of what gpuslice bound: a bound record on a pod is what any
    # namespace can write. A deleted ledger forgets the binds it held (docs/security.md: the
    # ledgers are state, not a cache); the node agent still refuses to hand a device named twice.
    node = setup_pods(apiserver, "a", "b", "c", "d", "e")
    backend = make_backend()
    for name in "abcd":
        bind(backend, apiserver, node, name)
    seen: list[Sequence[tuple[str, str]]] = []
    assert "needs 25 percent compute on one GPU, more than is free" in bind(backend, apiserver, node, "e", seen).error
    assert [k for k, _ in seen[0]] == ["default/a", "default/b", "default/c", "default/d"]  # from the ledger
    apiserver.delete_configmap(LEDGER_NS, "gpuslice-node-n1")
    seen.clear()
    assert bind(backend, apiserver, node, "e", seen).error == ""
    assert seen[-1] == []  # the records left on a-d vouch for nothing (seen[0]: as remembered)


def test_a_corrupt_ledger_is_started_afresh(apiserver: FakeApiServer, make_backend: Make) -> None:
    node = setup_pods(apiserver, "a", "b")
    backend = make_backend()
    bind(backend, apiserver, node, "a")
    cm = apiserver.configmap(LEDGER_NS, "gpuslice-node-n1")
    assert cm is not None
    cm["data"]["ledger"] = "{not json"
    apiserver.put_configmap(cm)
    seen: list[Sequence[tuple[str, str]]] = []
    assert bind(backend, apiserver, node, "b", seen).error == ""
    assert seen[-1] == []  # what the ledger held is lost with it: a's record on its pod vouches for nothing
    assert set(ledger(apiserver)) == {"default/b"}


def test_dropping_a_stale_reservation_leaves_a_newer_attempts_record_alone(
    apiserver: FakeApiServer, make_backend: Make, clock: FakeClock
) -> None:
    node = setup_pods(apiserver, "a", "late")
    leftover(apiserver, "a")  # so the record is written on the pod before its Binding
    apiserver.put_node(gpu_node("n2"))
    backend = make_backend()
    apiserver.fault("create", "pods/binding", status=503, times=2)
    bind(backend, apiserver, node, "a")  # reserved on n1, Binding unanswered
    clock.advance(30)
    live = apiserver.pod("default", "a")
    assert live is not None
    assert "may still land" in backend.bind(ref(apiserver, "a"), "n2", decide_for(gpu_node("n2"), live)).error
    on_n2 = annotations(apiserver, "a")[PREFIX + "allocation"]
    assert json.loads(on_n2)["node"] == "n2"
    clock.advance(31)  # n1's entry is 61 s old, n2's 31 s
    assert bind(backend, apiserver, node, "late").error == ""  # beside n1's stale entry: room left
    backend.sweep()
    assert "default/a" not in ledger(apiserver, "n1")
    assert annotations(apiserver, "a")[PREFIX + "allocation"] == on_n2
    assert ledger(apiserver, "n2")["default/a"]["record"] == on_n2
