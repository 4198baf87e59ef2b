"""The node agent's evictions: the API server asks gpuslice's webhook, which allows only pods that
gpuslice placed on the agent's own node (the node named in its token), as its cluster state shows
them. AdmissionReview bodies are shaped as the API server sends them for ``pods/eviction``: the
request names the pod, the object is the ``policy/v1`` Eviction."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from scheduler.backend import Placement
from scheduler.core.allocation import Allocation, DeviceShare
from scheduler.core.inventory import SharingMode
from scheduler.extender.app import create_app
from scheduler.extender.config import load_config
from scheduler.extender.service import Extender
from scheduler.filebackend import FileBackend
from scheduler.webhook import WebhookConfig, validate_eviction
from scheduler.webhook.review import NODE_NAME_EXTRA
from scheduler.webhook.routes import mount
from tests.deploy.manifests import find
from tests.deploy.reviews import AGENT, EVICTION_UID, eviction_review
from tests.deploy.test_rbac import account
from tests.extender.kit import PREFIX, cluster_file, k8s_node, k8s_pod
from tests.extender.test_cache import with_record


def config_with(placements: dict[str, Placement], synced: bool = True) -> WebhookConfig:
    def placement(namespace: str, name: str) -> Placement:
        if not synced:
            return Placement(synced=False)
        return placements.get(f"{namespace}/{name}", Placement(synced=True))

    return WebhookConfig(placement=placement)


COUNTED = Placement(synced=True, known=True, node="gpu-a", counted=True)


def answer(body: dict[str, Any], config: WebhookConfig) -> dict[str, Any]:
    reply = validate_eviction(body, config)
    assert reply.status == 200
    assert reply.response["uid"] == EVICTION_UID
    return reply.response


def denial(body: dict[str, Any], config: WebhookConfig) -> str:
    response = answer(body, config)
    assert response["allowed"] is False
    message: str = response["status"]["message"]
    return message


# ---------------------------------------------------------------- the decision


def test_the_agent_may_evict_a_pod_gpuslice_placed_on_its_own_node() -> None:
    response = answer(eviction_review(nodes=["gpu-a"]), config_with({"team-a/train": COUNTED}))
    assert response == {"uid": EVICTION_UID, "allowed": True}


def test_a_pod_on_another_node_is_refused_naming_both_nodes() -> None:
    config = config_with({"team-a/train": COUNTED})
    message = denial(eviction_review(nodes=["gpu-b"]), config)
    assert "team-a/train runs on node gpu-a, not on node gpu-b" in message


def test_a_token_without_its_node_is_refused() -> None:
    config = config_with({"team-a/train": COUNTED})
    message = denial(eviction_review(nodes=None), config)
    assert "names no node" in message and NODE_NAME_EXTRA in message and "team-a/train" in message
    assert "several nodes" in denial(eviction_review(nodes=["gpu-a", "gpu-b"]), config)
    assert "names no node" in denial(eviction_review(nodes=[""]), config)


def test_a_pod_gpuslice_does_not_know_is_refused() -> None:
    message = denial(eviction_review(nodes=["gpu-a"]), config_with({}))
    assert "pod team-a/train is not known to gpuslice" in message and "gpu-a" in message


def test_a_pod_without_a_counted_record_is_refused_saying_why() -> None:
    why = "its record is rejected: conflicts on node gpu-a"
    placed = Placement(synced=True, known=True, node="gpu-a", why_not=why)
    message = denial(eviction_review(nodes=["gpu-a"]), config_with({"team-a/train": placed}))
    assert "team-a/train on node gpu-a holds no allocation record gpuslice counts" in message
    assert why in message


def test_before_the_first_sync_every_eviction_is_refused() -> None:
    response = answer(eviction_review(nodes=["gpu-a"]), config_with({"team-a/train": COUNTED}, synced=False))
    assert response["allowed"] is False and response["status"]["code"] == 503
    assert "not synced" in response["status"]["message"] and "team-a/train" in response["status"]["message"]


def test_without_cluster_state_every_eviction_is_refused() -> None:
    message = denial(eviction_review(nodes=["gpu-a"]), WebhookConfig())
    assert "keeps no cluster state" in message


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"sub_resource": "status"}, "is not a pod's eviction"),
        ({"sub_resource": ""}, "subresource (none)"),
        ({"operation": "UPDATE"}, "UPDATE of subresource eviction"),
        ({"name": ""}, "(no name)"),
    ],
)
def test_anything_but_an_eviction_is_refused(changes: dict[str, str], fragment: str) -> None:
    config = config_with({"team-a/train": COUNTED})
    assert fragment in denial(eviction_review(nodes=["gpu-a"], **changes), config)  # type: ignore[arg-type]


def test_a_malformed_review_is_a_400_saying_what_is_accepted() -> None:
    reply = validate_eviction({"apiVersion": "v1", "kind": "Pod"}, config_with({}))
    assert reply.status == 400 and reply.response["allowed"] is False
    assert "admission.k8s.io/v1" in reply.response["status"]["message"]


# ---------------------------------------------------------------- against the service's cluster state


def mps(node: str, index: int, memory: int) -> Allocation:
    return Allocation(node, (DeviceShare(f"{node}-gpu{index}", index, SharingMode.MPS, memory, 100),), 0, 0)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Extender, FileBackend]]:
    placed = with_record(k8s_pod("train", "team-a", phase="Running"), mps("gpu-a", 0, 40000), node="gpu-a")
    stranger = k8s_pod("stranger", "team-a", node="gpu-a", phase="Running")  # bound by another scheduler
    backend = FileBackend(cluster_file(tmp_path / "c.json", k8s_node("gpu-a", gpus=2), placed, stranger), PREFIX)
    extender = Extender(load_config(env={}, flags={"port": 0}), backend)
    extender.start()
    try:
        yield extender, backend
    finally:
        extender.stop()


def over_http(extender: Extender, body: dict[str, Any]) -> dict[str, Any]:
    """POST /validate-eviction to the service's app as ``gpuslice serve`` builds it (the webhook
    mounted; the extender hands it the cluster state)."""
    app = create_app(extender, [lambda a: mount(a, WebhookConfig())])

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, client=("10.0.0.7", 43210))
        async with httpx.AsyncClient(transport=transport, base_url="https://gpuslice") as client:
            return await client.post("/validate-eviction", json=body)

    response = asyncio.run(go())
    assert response.status_code == 200
    reply: dict[str, Any] = response.json()["response"]
    return reply


def test_the_service_allows_its_own_pod_on_the_agents_node(served: tuple[Extender, FileBackend]) -> None:
    extender, _ = served
    assert over_http(extender, eviction_review(nodes=["gpu-a"]))["allowed"] is True
    assert "not on node gpu-b" in over_http(extender, eviction_review(nodes=["gpu-b"]))["status"]["message"]


def test_the_service_refuses_a_pod_another_scheduler_bound(served: tuple[Extender, FileBackend]) -> None:
    extender, _ = served
    message = over_http(extender, eviction_review("stranger", nodes=["gpu-a"]))["status"]["message"]
    assert "team-a/stranger on node gpu-a holds no allocation record gpuslice counts (no bound record" in message
    message = over_http(extender, eviction_review("gone", nodes=["gpu-a"]))["status"]["message"]
    assert "team-a/gone is not known to gpuslice" in message


def test_the_service_refuses_a_record_it_rejects(served: tuple[Extender, FileBackend]) -> None:
    extender, backend = served
    # a second record for the same GPU beyond its size, written by hand: the first record (by pod
    # key) keeps counting, this one is rejected
    backend.put_pod(with_record(k8s_pod("zealous", "team-a", phase="Running"), mps("gpu-a", 0, 60000), node="gpu-a"))
    assert extender.placement("team-a", "train").counted
    placed = extender.placement("team-a", "zealous")
    assert placed.known and placed.node == "gpu-a" and not placed.counted
    assert "rejected" in placed.why_not
    message = over_http(extender, eviction_review("zealous", nodes=["gpu-a"]))["status"]["message"]
    assert "holds no allocation record gpuslice counts" in message and "rejected" in message


def test_the_service_refuses_while_it_is_not_synced(served: tuple[Extender, FileBackend]) -> None:
    extender, _ = served
    extender.synced = False
    reply = over_http(extender, eviction_review(nodes=["gpu-a"]))
    assert reply["allowed"] is False and "not synced" in reply["status"]["message"]


# ---------------------------------------------------------------- the registration


def eviction_hook() -> dict[str, Any]:
    (hook,) = [
        w
        for w in find("ValidatingWebhookConfiguration", "gpuslice")["webhooks"]
        if w["rules"][0]["resources"] == ["pods/eviction"]
    ]
    return hook


def test_the_api_server_asks_the_webhook_of_every_eviction_by_the_agent() -> None:
    hook = eviction_hook()
    (rule,) = hook["rules"]
    assert rule == {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": ["CREATE"],
        "resources": ["pods/eviction"],
        "scope": "Namespaced",
    }
    assert hook["failurePolicy"] == "Fail"  # while gpuslice is down the agent cannot evict
    assert hook["clientConfig"]["service"]["path"] == "/validate-eviction"
    # every namespace: a pod gpuslice places may live in any
    assert "namespaceSelector" not in hook and "objectSelector" not in hook


def test_only_the_agents_own_service_account_is_sent_to_the_webhook() -> None:
    agent = account("gpuslice-agent")  # its namespace and name, as manifests/agent.yaml gives them
    (condition,) = eviction_hook()["matchConditions"]
    expected = f"system:serviceaccount:{agent['namespace']}:{agent['name']}"
    assert condition["expression"] == f"request.userInfo.username == '{expected}'"
    assert expected == AGENT
