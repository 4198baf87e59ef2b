"""The node agent's evictions on the real control plane: webhook validate-agent-evictions.gpuslice.io
lets a token of ServiceAccount gpuslice-agent/gpuslice-agent evict only pods gpuslice placed on the
node the token names. The token is a TokenRequest bound to a pod of the agent's account that is
bound to node A, so the API server (v1.30+, ServiceAccountTokenPodNodeInfo, GA in v1.32) adds the
user-info extra authentication.kubernetes.io/node-name: A. Evictions by anyone else never reach
the webhook (its matchConditions)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.e2e.controlplane import ApiError, Client, ControlPlane, wait_for
from tests.e2e.deployed import Gpuslice, put_node
from tests.e2e.nodes import gpu_node
from tests.e2e.test_scheduling import unschedulable_pod

pytestmark = pytest.mark.controlplane

NS = "e2e-evict"
NODE_A = "e2e-evict-a"
NODE_B = "e2e-evict-b"
TAINT = "e2e-evict"
AGENT_NS = "gpuslice-agent"
AGENT = "gpuslice-agent"
RECORD = "gpuslice.io/allocation"


def pod_path(name: str, namespace: str = NS) -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{name}"


def evict(client: Client, name: str) -> Any:
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": NS}}
    return client.post(f"{pod_path(name)}/eviction", eviction)


def bind(admin: Client, namespace: str, name: str, node: str) -> None:
    """Bind a pod to a node by hand, as any scheduler other than gpuslice would."""
    admin.post(
        f"{pod_path(name, namespace)}/binding",
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        },
    )


def placed_by_gpuslice(admin: Client, name: str, node: str) -> dict[str, Any]:
    """A half-GPU pod that the real kube-scheduler places on ``node`` through gpuslice; once its
    record is written."""
    pod = unschedulable_pod(name, NS, {"gpuslice.io/gpu-fraction": "0.5"})
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    pod["spec"]["tolerations"].append({"key": TAINT, "operator": "Exists", "effect": "NoSchedule"})
    admin.post(f"/api/v1/namespaces/{NS}/pods", pod)

    def recorded() -> dict[str, Any] | None:
        got: dict[str, Any] = admin.get(pod_path(name))
        has_record = RECORD in (got["metadata"].get("annotations") or {})
        return got if got["spec"].get("nodeName") and has_record else None

    found: dict[str, Any] = wait_for(f"{NS}/{name} bound by gpuslice with its record", recorded, timeout=60)
    assert found["spec"]["nodeName"] == node
    return found


def refusal(attempt: Callable[[], Any], until: str) -> ApiError:
    """The refusal of ``attempt`` once its message says ``until`` (gpuslice's watch catches up on a
    pod it has just placed: until then it refuses for another reason). Never allowed on the way."""

    def refused() -> ApiError | None:
        try:
            attempt()
        except ApiError as error:
            return error if until in str(error.body.get("message", "")) else None
        raise AssertionError("the eviction was allowed")

    error: ApiError = wait_for(f"a refusal saying {until!r}", refused, timeout=30, interval=0.5)
    return error


@pytest.fixture(scope="module")
def admin(control_plane: ControlPlane, gpuslice: Gpuslice) -> Client:
    client = control_plane.client()
    client.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    for name in (NODE_A, NODE_B):
        node = gpu_node(
            name, gpus=1, sharing={"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "4"}
        )
        node["spec"]["taints"].append({"key": TAINT, "value": "yes", "effect": "NoSchedule"})
        put_node(client, node)
    return client


@pytest.fixture(scope="module")
def agent_on_a(control_plane: ControlPlane, admin: Client) -> Client:
    """The agent's identity on node A: a token bound to a pod of its account bound to node A."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "e2e-agent-a", "namespace": AGENT_NS},
        "spec": {
            "serviceAccountName": AGENT,
            "containers": [{"name": "agent", "image": "registry.example.com/agent:1"}],
        },
    }
    created = admin.post(f"/api/v1/namespaces/{AGENT_NS}/pods", pod)
    bind(admin, AGENT_NS, "e2e-agent-a", NODE_A)
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "expirationSeconds": 3600,
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": "e2e-agent-a",
                "uid": created["metadata"]["uid"],
            },
        },
    }
    answer = admin.post(f"/api/v1/namespaces/{AGENT_NS}/serviceaccounts/{AGENT}/token", request)
    client = control_plane.client(str(answer["status"]["token"]))
    review = client.post(
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    extra = review["status"]["userInfo"].get("extra") or {}
    assert extra.get("authentication.kubernetes.io/node-name") == [NODE_A], review
    return client


def test_the_agent_of_node_a_may_not_evict_a_pod_gpuslice_placed_on_node_b(admin: Client, agent_on_a: Client) -> None:
    placed_by_gpuslice(admin, "on-b", NODE_B)
    error = refusal(lambda: evict(agent_on_a, "on-b"), until=f"runs on node {NODE_B}")
    assert error.status == 403, error.body
    message = str(error.body.get("message", ""))
    assert "validate-agent-evictions.gpuslice.io" in message, message
    assert f"{NS}/on-b" in message and NODE_A in message and NODE_B in message, message
    still = admin.get(pod_path("on-b"))
    assert still["metadata"].get("deletionTimestamp") is None


def test_the_agent_of_node_a_may_not_evict_a_pod_on_a_that_another_scheduler_bound(
    admin: Client, agent_on_a: Client
) -> None:
    pod = unschedulable_pod("by-hand", NS, {})
    pod["spec"].pop("schedulerName")
    admin.post(f"/api/v1/namespaces/{NS}/pods", pod)
    bind(admin, NS, "by-hand", NODE_A)
    error = refusal(lambda: evict(agent_on_a, "by-hand"), until="holds no allocation record gpuslice counts")
    assert error.status == 403, error.body
    message = str(error.body.get("message", ""))
    assert f"{NS}/by-hand" in message and f"node {NODE_A}" in message, message
    assert admin.get(pod_path("by-hand"))["metadata"].get("deletionTimestamp") is None


def test_a_token_of_the_agent_without_the_node_claim_may_not_evict(
    control_plane: ControlPlane, admin: Client, agent_on_a: Client
) -> None:
    placed_by_gpuslice(admin, "unclaimed", NODE_A)
    plain = control_plane.client(admin.account_token(AGENT_NS, AGENT))
    error = refusal(lambda: evict(plain, "unclaimed"), until="names no node")
    assert error.status == 403, error.body
    assert f"{NS}/unclaimed" in str(error.body.get("message", "")), error.body
    assert admin.get(pod_path("unclaimed"))["metadata"].get("deletionTimestamp") is None


def test_the_agent_of_node_a_may_evict_a_pod_gpuslice_placed_on_node_a(admin: Client, agent_on_a: Client) -> None:
    placed_by_gpuslice(admin, "on-a", NODE_A)

    def allowed() -> bool:
        try:
            evict(agent_on_a, "on-a")
        except ApiError as error:
            # only while gpuslice's watch has not seen the pod, its record or its binding yet
            assert error.status in (403, 503), error.body
            catching_up = ("is not known to gpuslice", "holds no allocation record", "runs on node (none: pending)")
            assert any(text in str(error.body) for text in catching_up), error.body
            return False
        return True

    wait_for("the agent's eviction of a pod gpuslice placed on its node", allowed, timeout=30, interval=0.5)
    assert admin.get(pod_path("on-a"))["metadata"].get("deletionTimestamp") is not None


def test_an_admin_may_still_evict_any_pod(admin: Client) -> None:
    pod = unschedulable_pod("admin-evicts", NS, {})
    pod["spec"].pop("schedulerName")
    admin.post(f"/api/v1/namespaces/{NS}/pods", pod)
    bind(admin, NS, "admin-evicts", NODE_B)
    evict(admin, "admin-evicts")
    assert admin.get(pod_path("admin-evicts"))["metadata"].get("deletionTimestamp") is not None
