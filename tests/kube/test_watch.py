"""List + watch through the real client against the fake API server: sync, events, relists, readiness."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from scheduler.backend import Kind
from scheduler.kube import KubeBackend, KubeError
from tests.fakes import FakeApiServer, FakeClock
from tests.fakes.apiserver import WATCH_EXPIRED
from tests.kube.conftest import Recorder, gpu_node, gpu_pod, wait_until

Make = Callable[..., KubeBackend]


def started(make: Make, apiserver: FakeApiServer, **options: object) -> tuple[KubeBackend, Recorder]:
    backend, recorder = make(**options), Recorder()
    backend.start(recorder)
    wait_until(
        lambda: apiserver.open_watches() == 4, "the four watches (nodes, pods, GPU quotas, node ledgers) to open"
    )
    return backend, recorder


def test_start_reports_every_node_and_pod_then_is_ready(apiserver: FakeApiServer, make_backend: Make) -> None:
    apiserver.put_node(gpu_node("n1"))
    apiserver.put_node(gpu_node("n2"))
    apiserver.put_pod(gpu_pod("a"))
    apiserver.put_pod(gpu_pod("b", namespace="team"))
    backend = make_backend(list_page_size=1)  # one object per page: the continue token is followed
    recorder = Recorder()
    assert not backend.ready()
    backend.start(recorder)
    assert backend.ready()  # start returns after the first full list, before any event
    assert recorder.keys(Kind.NODE) == {"n1", "n2"}
    assert recorder.keys(Kind.POD) == {"default/a", "team/b"}
    assert apiserver.count("list", "nodes") == 2 and apiserver.count("list", "pods") == 2  # 2 pages each


def test_fields_the_client_does_not_know_reach_the_consumer(apiserver: FakeApiServer, make_backend: Make) -> None:
    body = gpu_pod("a")
    body["spec"]["fieldFromTheFuture"] = {"x": 1}
    apiserver.put_pod(body)
    _, recorder = started(make_backend, apiserver)
    assert recorder.objects[(Kind.POD, "default/a")]["spec"]["fieldFromTheFuture"] == {"x": 1}


def test_watch_reports_added_modified_and_deleted(apiserver: FakeApiServer, make_backend: Make) -> None:
    apiserver.put_node(gpu_node("n1"))
    _, recorder = started(make_backend, apiserver)
    apiserver.put_pod(gpu_pod("a"))
    wait_until(lambda: recorder.has(Kind.POD, "default/a"), "the new pod")
    apiserver.set_pod_phase("default", "a", "Running")
    wait_until(
        lambda: recorder.objects.get((Kind.POD, "default/a"), {}).get("status", {}).get("phase") == "Running",
        "the modified pod",
    )
    apiserver.delete_pod("default", "a")
    wait_until(lambda: recorder.has(Kind.POD, "default/a", obj_is_none=True), "the deletion")
    apiserver.delete_node("n1")
    wait_until(lambda: recorder.has(Kind.NODE, "n1", obj_is_none=True), "the node's deletion")


def test_410_relists_and_reports_what_vanished_in_between(apiserver: FakeApiServer, make_backend: Make) -> None:
    apiserver.put_pod(gpu_pod("gone"))
    apiserver.put_pod(gpu_pod("stays"))
    backend, recorder = started(make_backend, apiserver)
    pods = backend._reflectors[1]
    lists_before = apiserver.count("list", "pods")
    # The watch misses the changes (stalled), then the server compacts: the only way to learn
    # of them is the relist that the ERROR 410 event forces.
    apiserver.stall_watches("pods")
    apiserver.delete_pod("default", "gone")
    apiserver.put_pod(gpu_pod("new"))
    assert apiserver.expire_watches("pods") == 1
    apiserver.stall_watches("pods", stalled=False)
    wait_until(lambda: recorder.has(Kind.POD, "default/gone", obj_is_none=True), "the deletion found by relisting")
    assert recorder.keys(Kind.POD) == {"default/stays", "default/new"}
    assert apiserver.count("list", "pods") == lists_before + 1
    assert pods.broken_since is None and backend.ready()  # a 410 is routine, not a broken watch


def test_a_watch_refused_with_http_410_relists_at_once_as_an_error_event_does(
    apiserver: FakeApiServer, make_backend: Make
) -> None:
    # v1.37 refuses a watch from a resourceVersion too old with an ERROR event in a 200 stream
    # (tests/e2e/test_faults.py); an HTTP 410 answer to the watch itself means the same.
    backend, recorder = started(make_backend, apiserver)
    pods = backend._reflectors[1]
    lists_before = apiserver.count("list", "pods")
    refusal = apiserver.fault("watch", "pods", status=410, message=WATCH_EXPIRED)
    wait_until(lambda: refusal.fired == 1, "the resumed watch (after its 2 s timeout) refused with HTTP 410")
    wait_until(lambda: apiserver.count("list", "pods") == lists_before + 1, "the relist")
    apiserver.put_pod(gpu_pod("after"))
    wait_until(lambda: recorder.has(Kind.POD, "default/after"), "an event on the watch that follows")
    assert pods.last_error == "" and pods.broken_since is None and backend.ready()  # routine, no backoff


def test_a_dropped_watch_is_relisted_and_followed_again(apiserver: FakeApiServer, make_backend: Make) -> None:
    backend, recorder = started(make_backend, apiserver)
    lists_before = apiserver.count("list", "pods")
    assert apiserver.drop_watches("pods") == 1
    wait_until(lambda: apiserver.count("list", "pods") > lists_before, "the relist after the drop")
    apiserver.put_pod(gpu_pod("after"))
    wait_until(lambda: recorder.has(Kind.POD, "default/after"), "an event on the new watch")
    assert backend.ready()


def test_a_stalled_watch_is_detected_by_its_read_timeout(apiserver: FakeApiServer, make_backend: Make) -> None:
    # watch_timeout_s=2 + watch_read_slack_s=0.5: a stream silent for 2.5 s is broken.
    _, recorder = started(make_backend, apiserver)
    lists_before = apiserver.count("list", "pods")
    apiserver.stall_watches("pods")
    apiserver.put_pod(gpu_pod("during-stall"))
    wait_until(lambda: recorder.has(Kind.POD, "default/during-stall"), "the relist after the stall", timeout_s=6)
    assert apiserver.count("list", "pods") > lists_before


def test_ready_goes_false_after_the_grace_period_and_recovers(
    apiserver: FakeApiServer, make_backend: Make, clock: FakeClock
) -> None:
    backend, recorder = started(make_backend, apiserver)  # watch_grace_s=5
    outage = [apiserver.fault(verb, "pods", status=503, times=None) for verb in ("list", "watch")]
    apiserver.drop_watches("pods")
    wait_until(lambda: outage[0].fired >= 2, "relists failing")
    clock.advance(4.0)
    assert backend.ready()  # broken, but within the grace period
    assert backend.problems() and "503" in backend.problems()[0]
    clock.advance(2.0)
    assert not backend.ready()
    apiserver.clear_faults()
    apiserver.put_pod(gpu_pod("after-outage"))
    wait_until(backend.ready, "readiness after the outage")
    wait_until(lambda: recorder.has(Kind.POD, "default/after-outage"), "the pod created during the outage")
    assert backend.problems() == []


def test_a_failing_consumer_does_not_stop_the_watch(apiserver: FakeApiServer, make_backend: Make) -> None:
    seen: list[str] = []

    def on_change(change: object) -> None:
        seen.append(getattr(change, "key", ""))
        raise RuntimeError("consumer bug")

    backend = make_backend()
    backend.start(on_change)
    wait_until(lambda: apiserver.open_watches() == 4, "the four watches (node ledgers too)")
    apiserver.put_pod(gpu_pod("a"))
    apiserver.put_pod(gpu_pod("b"))
    wait_until(lambda: "default/b" in seen, "the second event after the first raised")


def test_start_fails_with_a_clear_error_when_the_server_is_unreachable(apiserver: FakeApiServer) -> None:
    apiserver.fault("list", "nodes", status=500, times=None, message="etcd is down")
    backend = KubeBackend.from_url(apiserver.url, request_timeout_s=0.5, start_timeout_s=0.3, backoff_initial_s=0.05)
    with pytest.raises(KubeError, match=r"first list of nodes failed .*HTTP 500 InternalError: etcd is down"):
        backend.start(Recorder())
    assert not backend.ready()
    backend.stop()


def test_stop_ends_the_watch_threads_promptly(apiserver: FakeApiServer, make_backend: Make) -> None:
    backend, _ = started(make_backend, apiserver, watch_timeout_s=300)
    backend.stop()
    assert all(not t.is_alive() for t in backend._threads)
    assert not backend.ready()


MANAGED = [{"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]


def test_who_manages_which_field_is_not_kept_listed_or_watched(apiserver: FakeApiServer, make_backend: Make) -> None:
    listed = gpu_pod("a")
    listed["metadata"]["managedFields"] = MANAGED
    listed["metadata"]["labels"] = {"team": "x"}
    apiserver.put_pod(listed)
    node = gpu_node("n1")
    node["metadata"]["managedFields"] = MANAGED
    apiserver.put_node(node)
    _, recorder = started(make_backend, apiserver)
    first = recorder.objects[(Kind.POD, "default/a")]
    assert "managedFields" not in first["metadata"]
    assert first["metadata"]["labels"] == {"team": "x"} and first["spec"] == listed["spec"]
    assert "managedFields" not in recorder.objects[(Kind.NODE, "n1")]["metadata"]
    watched = gpu_pod("b")
    watched["metadata"]["managedFields"] = MANAGED
    apiserver.put_pod(watched)
    wait_until(lambda: (Kind.POD, "default/b") in recorder.objects, "the watched pod")
    assert "managedFields" not in recorder.objects[(Kind.POD, "default/b")]["metadata"]
    assert recorder.objects[(Kind.POD, "default/b")]["metadata"]["name"] == "b"
