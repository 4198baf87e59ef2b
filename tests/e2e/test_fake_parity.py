"""The fake API server (tests/fakes/apiserver.py) answers as the real v1.37 one does: one small
scenario of the calls gpuslice makes, each failure it can meet on the way (not found, already
exists, a stale resourceVersion, an immutable field, a second Binding, a Binding or an Eviction
for another pod of the same name, bad parameters), played against both. Where they disagree,
the real one is right and the fake is mended; a future drift of either fails here.

Compared: each call's HTTP status and, for a failure, its ``Status`` body's kind, status,
reason, code and message (the pod's uid and namespace written as placeholders). Not compared:
``details`` (which gpuslice never reads), and what the fake does not model at all (RBAC,
admission). The expiry of a watch is compared in test_faults.py, where the API server serves
watches from etcd."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.controlplane import ApiError, ControlPlane
from tests.fakes import FakeApiServer

pytestmark = pytest.mark.controlplane

NAMESPACE = "e2e-parity"
NAME = "parity"
STATUS_FIELDS = ("kind", "status", "reason", "code", "message")

Outcome = tuple[str, int, dict[str, Any]]


def normalised(body: Any, uid: str) -> dict[str, Any]:
    """The compared fields of a Status body, the pod's uid and namespace as placeholders."""
    if not isinstance(body, dict) or body.get("kind") != "Status":
        return {}
    text = json.dumps({k: body.get(k) for k in STATUS_FIELDS})
    text = text.replace(uid, "<uid>") if uid else text
    loaded: dict[str, Any] = json.loads(text.replace(f"/{NAMESPACE}/", "/<namespace>/"))
    return loaded


def scenario(http: httpx.Client) -> Iterator[Outcome]:
    """The calls, in order: (what, HTTP status, the normalised Status of a failure)."""
    pods = f"/api/v1/namespaces/{NAMESPACE}/pods"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {"containers": [{"name": "main", "image": "registry.example.com/app:1"}]},
    }
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": NAME}, "target": {"name": "n1"}}
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "deleteOptions": {"gracePeriodSeconds": 0},  # no kubelet here to end the pod
    }
    merge = "application/merge-patch+json"
    uid = ""

    def call(
        what: str, method: str, path: str, body: Any = None, content_type: str = "application/json", **params: str
    ) -> Outcome:
        content = None if body is None else json.dumps(body).encode()
        headers = {} if body is None else {"Content-Type": content_type}
        answer = http.request(method, path, content=content, headers=headers, params=params or None)
        data = answer.json() if answer.headers.get("content-type", "").startswith("application/json") else None
        return what, answer.status_code, normalised(data, uid) if answer.status_code >= 400 else {}

    created = http.post(pods, json=pod)
    uid = created.json()["metadata"]["uid"]
    yield "create", created.status_code, {}
    yield call("create again", "POST", pods, pod)
    yield call("get a missing pod", "GET", f"{pods}/missing")
    yield call("delete a missing pod", "DELETE", f"{pods}/missing")
    stale = {"metadata": {"resourceVersion": "1", "labels": {"a": "b"}}}
    yield call("merge patch at a stale resourceVersion", "PATCH", f"{pods}/{NAME}", stale, merge)
    current = http.get(f"{pods}/{NAME}").json()
    current["metadata"]["resourceVersion"] = "1"
    yield call("update at a stale resourceVersion", "PUT", f"{pods}/{NAME}", current)
    yield call("merge patch of metadata.uid", "PATCH", f"{pods}/{NAME}", {"metadata": {"uid": "other"}}, merge)
    other = {**binding, "metadata": {"name": NAME, "uid": "other"}}
    yield call("a Binding for another pod of the name", "POST", f"{pods}/{NAME}/binding", other)
    yield call("a Binding without a target", "POST", f"{pods}/{NAME}/binding", {**binding, "target": {}})
    yield call("bind", "POST", f"{pods}/{NAME}/binding", binding)
    yield call("bind again", "POST", f"{pods}/{NAME}/binding", {**binding, "target": {"name": "n2"}})
    yield call("list with a bad fieldSelector", "GET", pods, fieldSelector="spec.nodeName")
    watch = {"watch": "true", "resourceVersion": "abc", "timeoutSeconds": "1"}
    yield call("watch from a resourceVersion that is no number", "GET", pods, **watch)
    uid_precondition = {**eviction, "deleteOptions": {"gracePeriodSeconds": 0, "preconditions": {"uid": "other"}}}
    yield call("an Eviction for another pod of the name", "POST", f"{pods}/{NAME}/eviction", uid_precondition)
    missing = {**eviction, "metadata": {"name": "missing", "namespace": NAMESPACE}}
    yield call("an Eviction of a missing pod", "POST", f"{pods}/missing/eviction", missing)
    yield call("evict", "POST", f"{pods}/{NAME}/eviction", eviction)
    yield call("get the evicted pod", "GET", f"{pods}/{NAME}")


def test_the_fake_api_server_answers_as_the_real_one(control_plane: ControlPlane) -> None:
    client = control_plane.client()
    client.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    with FakeApiServer() as fake, httpx.Client(base_url=fake.url, timeout=30) as fake_http:
        real = list(scenario(client.http))
        faked = list(scenario(fake_http))
    differences = [(r, f) for r, f in zip(real, faked, strict=True) if r != f]
    assert differences == [], "\n".join(f"real: {r}\nfake: {f}" for r, f in differences)


def test_a_forbidden_call_reads_the_same_from_the_fake(control_plane: ControlPlane) -> None:
    """The fake has no RBAC: a refusal is a fault it is told to answer (status=403). Given the
    real refusal's words, its Status must read as the real one's."""
    client = control_plane.client()
    client.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    client.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "nobody", "namespace": NAMESPACE}})
    nobody = control_plane.client(client.account_token(NAMESPACE, "nobody"))
    with pytest.raises(ApiError) as refused:
        nobody.get("/api/v1/pods")
    real = (refused.value.status, normalised(refused.value.body, ""))
    assert real[0] == 403, real
    with FakeApiServer() as fake, httpx.Client(base_url=fake.url, timeout=30) as http:
        fake.fault("list", "pods", status=403, message=refused.value.body["message"])
        answer = http.get("/api/v1/pods")
        assert (answer.status_code, normalised(answer.json(), "")) == real


def watch_answer(http: httpx.Client, path: str, version: str) -> tuple[int, list[dict[str, Any]]]:
    """A short watch of ``path`` from ``version``: its HTTP status and every event it carried."""
    params = {"watch": "true", "resourceVersion": version, "timeoutSeconds": "2", "allowWatchBookmarks": "true"}
    with http.stream("GET", path, params=params) as answer:
        events = [json.loads(line) for line in answer.iter_lines() if line.strip()]
    return answer.status_code, events


def expired_watch_of_the_fake(path: str) -> tuple[int, list[dict[str, Any]]]:
    """What the fake answers a watch of ``path`` from a resourceVersion older than its compaction."""
    with FakeApiServer() as fake, httpx.Client(base_url=fake.url, timeout=30) as http:
        fake.put_pod({"metadata": {"name": "a", "namespace": NAMESPACE}})
        version = str(fake.resource_version)
        fake.put_pod({"metadata": {"name": "b", "namespace": NAMESPACE}})
        fake.compact()
        return watch_answer(http, path, version)
