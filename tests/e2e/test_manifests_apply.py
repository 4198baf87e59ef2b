"""Row 1: the manifests apply as shipped to a real v1.37 API server (the kustomization,
server-side apply), and its controllers create the extender's and the agent's pods, which Pod
Security admits in the namespaces the manifests give them."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.manifests import MANIFESTS
from tests.e2e.controlplane import Client, ControlPlane, wait_for
from tests.e2e.deployed import put_node
from tests.e2e.kustomize import render
from tests.e2e.nodes import gpu_node

pytestmark = pytest.mark.controlplane


def failed_creates(client: Client, namespace: str) -> list[str]:
    events = client.get(f"/api/v1/namespaces/{namespace}/events")["items"]
    return [f"{e['involvedObject']['name']}: {e['message']}" for e in events if e["reason"] == "FailedCreate"]


def test_every_object_applies_and_the_controllers_pods_are_admitted(
    control_plane: ControlPlane, applied: list[dict[str, Any]]
) -> None:
    client = control_plane.client()
    shipped = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in render(MANIFESTS)]
    assert [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in applied] == shipped
    assert all(o["metadata"]["uid"] for o in applied)
    nodes = [gpu_node(f"e2e-apply-gpu-{i}") for i in range(2)]
    for node in nodes:
        put_node(client, node)

    def agent_pods() -> list[dict[str, Any]]:
        pods = client.pods("gpuslice-agent", labelSelector="app.kubernetes.io/name=gpuslice-agent")
        placed = {p["spec"].get("nodeName") for p in pods} | {t["values"][0] for p in pods for t in node_affinity(p)}
        return pods if {n["metadata"]["name"] for n in nodes} <= placed else []

    def service_pods() -> list[dict[str, Any]]:
        pods = client.pods("gpuslice", labelSelector="app.kubernetes.io/name=gpuslice")
        return pods if len(pods) >= 2 else []

    try:
        agents = wait_for("the agent's pods on every GPU node", agent_pods, timeout=60)
        services = wait_for("the Deployment's two gpuslice pods", service_pods, timeout=60)
    except AssertionError as timeout:
        refused = failed_creates(client, "gpuslice-agent") + failed_creates(client, "gpuslice")
        raise AssertionError(f"{timeout}; refused: {refused}") from None
    finally:  # the later tests place pods on the examples' nodes only
        for node in nodes:
            client.delete(f"/api/v1/nodes/{node['metadata']['name']}")
    assert all(p["spec"]["securityContext"] is not None for p in agents + services)
    assert failed_creates(client, "gpuslice-agent") == []
    assert failed_creates(client, "gpuslice") == []


def node_affinity(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """The matchFields terms naming the pod's node (where the daemon set controller names it so)."""
    affinity = pod["spec"].get("affinity", {}).get("nodeAffinity", {})
    terms = affinity.get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", [])
    return [field for term in terms for field in term.get("matchFields", [])]
