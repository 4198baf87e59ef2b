"""The node agent's Kubernetes side against the fake API server, through the real client: its Node,
the pods bound to it (list and watch narrowed to the node), Events, evictions; and exactly the
declared calls."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from scheduler.agent.cluster import ObjectRef
from scheduler.kube import KubeApi
from scheduler.kube.api import AGENT_API_CALLS
from scheduler.kube.nodeapi import NodeApi
from tests.builders import pod
from tests.fakes import FakeApiServer
from tests.kube.conftest import FAST


def node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": {"keep": "me"}}, "status": {"allocatable": {"cpu": "8"}}}


def on(node_name: str, name: str) -> dict[str, Any]:
    obj = pod(name)
    obj["spec"]["nodeName"] = node_name
    return obj


def test_the_node_api_reads_and_writes_only_its_own_node_and_pods() -> None:
    from scheduler.kube.options import KubeOptions

    with FakeApiServer() as server:
        server.put_node(node("gpu-1"))
        server.put_node(node("gpu-2"))
        server.put_pod(on("gpu-1", "mine"))
        server.put_pod(on("gpu-2", "theirs"))
        api = NodeApi(KubeApi.from_url(server.url, request_timeout_s=2.0), "gpu-1", options=KubeOptions(**FAST))
        assert api.get_node()["metadata"]["name"] == "gpu-1"
        api.set_node_annotations({"gpuslice.io/inventory": "{}", "keep": None})
        assert server.node("gpu-1")["metadata"]["annotations"] == {"gpuslice.io/inventory": "{}"}
        assert [p["metadata"]["name"] for p in api.list_pods()] == ["mine"]

        seen: list[tuple[str, bool]] = []
        changed = threading.Event()

        def record(key: str, obj: Any) -> None:
            seen.append((key, obj is not None))
            changed.set()

        api.follow_pods(record)
        assert seen == [("default/mine", True)]
        server.put_pod(on("gpu-2", "elsewhere"))
        server.put_pod(on("gpu-1", "new"))
        deadline = time.monotonic() + 5
        while ("default/new", True) not in seen and time.monotonic() < deadline:
            changed.wait(0.1)
            changed.clear()
        assert ("default/new", True) in seen and all("elsewhere" not in k for k, _ in seen)

        api.event(ObjectRef("Pod", "mine", "default", "uid-1"), "Warning", "GpusliceAllocateFailed", "why")
        api.evict(ObjectRef("Pod", "new", "default", "uid-new"))
        (eviction,) = server.evictions
        assert eviction["apiVersion"] == "policy/v1" and eviction["kind"] == "Eviction"
        assert eviction["deleteOptions"] == {"preconditions": {"uid": "uid-new"}}
        assert server.pod("default", "new") is None
        assert api.bound_records() == {}  # no ledger yet: gpuslice bound nothing here
        entry = {"uid": "uid-1", "record": '{"node":"gpu-1"}', "phase": "bound", "time": "2026-01-01T00:00:00Z"}
        server.put_configmap(
            {
                "metadata": {"name": "gpuslice-node-gpu-1", "namespace": "gpuslice"},
                "data": {"ledger": json.dumps({"default/mine": entry})},
            }
        )
        assert api.bound_records() == {"default/mine": ("uid-1", '{"node":"gpu-1"}')}
        api.stop()
        events = server.objects("events")
        (event,) = events
        assert event["involvedObject"] == {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": "mine",
            "namespace": "default",
            "uid": "uid-1",
        }
        assert (event["reason"], event["type"], event["source"]["host"]) == (
            "GpusliceAllocateFailed",
            "Warning",
            "gpu-1",
        )
        assert server.served <= {(v, r) for v, _, r in AGENT_API_CALLS}
        assert server.served == {(v, r) for v, _, r in AGENT_API_CALLS}


def test_the_agents_client_cannot_make_the_services_calls() -> None:
    import pytest

    api = NodeApi(KubeApi.from_url("http://127.0.0.1:1"), "gpu-1")
    with pytest.raises(AssertionError, match="API call create pods/binding is missing from AGENT_API_CALLS"):
        api._api.bind_pod("default", "p", {})


def test_an_eviction_a_budget_refuses_or_of_a_replaced_pod_is_an_error() -> None:
    import pytest

    from scheduler.kube.errors import ApiStatusError, ConflictError

    with FakeApiServer() as server:
        server.put_pod(on("gpu-1", "p"))
        api = NodeApi(KubeApi.from_url(server.url, request_timeout_s=2.0), "gpu-1")
        server.fault(
            "create",
            "pods/eviction",
            status=429,
            message="Cannot evict pod as it would violate the pod's disruption budget.",
        )
        with pytest.raises(ApiStatusError, match="create pods/eviction: HTTP 429"):
            api.evict(ObjectRef("Pod", "p", "default", "uid-p"))
        with pytest.raises(ConflictError, match=r"the UID in the precondition \(uid-of-another-p\) does not match"):
            api.evict(ObjectRef("Pod", "p", "default", "uid-of-another-p"))
        assert server.pod("default", "p") is not None and server.evictions == []
        api.stop()
