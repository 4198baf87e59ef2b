"""Row 4: the real kube-scheduler, with the shipped configuration, schedules every example of
manifests/examples through gpuslice, the webhook admitting the pods over TLS on the way; what
fits nowhere, or reaches the scheduler malformed, is Unschedulable with a FailedScheduling
event as kube-scheduler prints it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.manifests import MANIFESTS
from tests.deploy.test_examples import WORKLOADS, companion_node, pod_of
from tests.e2e.controlplane import Client, ControlPlane, wait_for
from tests.e2e.deployed import Gpuslice, put_node
from tests.e2e.kustomize import render
from tests.e2e.nodes import example_nodes
from tests.e2e.test_kube_scheduler import check_no_over_allocation

pytestmark = pytest.mark.controlplane

DEMO = "gpu-demo"
PREFIX = "gpuslice.io/"


def base_name(workload: str) -> str:
    pod, _ = pod_of(workload)
    return str(pod["metadata"].get("name") or pod["metadata"]["generateName"].rstrip("-"))


def workload_of(pod: dict[str, Any]) -> str:
    name = pod["metadata"]["name"]
    (found,) = [w for w in WORKLOADS if name == base_name(w) or name.startswith(base_name(w) + "-")]
    return found


@pytest.fixture(scope="module")
def examples(control_plane: ControlPlane, gpuslice: Gpuslice) -> list[dict[str, Any]]:
    """Every example applied, as `kubectl apply -k manifests/examples` would, on its nodes;
    the pods once all of them are bound."""
    client = control_plane.client()
    nodes = example_nodes()
    for node in nodes:
        put_node(client, node)
    for obj in render(MANIFESTS / "examples"):
        client.apply(obj)
    expected = sum(pod_of(w)[1] for w in WORKLOADS)

    def bound() -> list[dict[str, Any]]:
        pods = [p for p in client.pods(DEMO) if p["metadata"].get("deletionTimestamp") is None]
        return pods if len(pods) == expected and all(p["spec"].get("nodeName") for p in pods) else []

    try:
        pods: list[dict[str, Any]] = wait_for(f"{expected} example pods bound", bound, timeout=120)
    except AssertionError as timeout:
        pending = [
            (p["metadata"]["name"], [e["message"] for e in client.events(DEMO, p["metadata"]["name"])])
            for p in client.pods(DEMO)
            if not p["spec"].get("nodeName")
        ]
        raise AssertionError(f"{timeout}; pending: {pending}\n{gpuslice.log()[-3000:]}") from None
    return pods


def test_every_example_lands_on_the_node_its_header_names(examples: list[dict[str, Any]]) -> None:
    landed = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in examples}
    expected = {p["metadata"]["name"]: companion_node(workload_of(p))["metadata"]["name"] for p in examples}
    assert landed == expected


def test_every_example_pod_went_through_the_webhook_and_holds_a_record(examples: list[dict[str, Any]]) -> None:
    for pod in examples:
        assert pod["spec"]["schedulerName"] == "gpuslice", pod["metadata"]["name"]
        limits = [c.get("resources", {}).get("limits", {}) for c in pod["spec"]["containers"]]
        assert any(limit.get("gpuslice.io/share") == "1" for limit in limits), pod["metadata"]["name"]
    nodes = example_nodes()
    held = check_no_over_allocation(nodes, examples)
    assert sorted(held) == sorted(f"{DEMO}/{p['metadata']['name']}" for p in examples)


def unschedulable_pod(name: str, namespace: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {
            "schedulerName": "gpuslice",
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "main", "image": "registry.example.com/none:1"}],
        },
    }


def scheduling_failure(client: Client, namespace: str, name: str) -> tuple[str, str]:
    """The pod's PodScheduled reason and its FailedScheduling event's message, once both exist."""

    def failed() -> tuple[str, str] | None:
        pod = client.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        conditions = [c for c in pod["status"].get("conditions", []) if c["type"] == "PodScheduled"]
        events = [e["message"] for e in client.events(namespace, name) if e["reason"] == "FailedScheduling"]
        if conditions and conditions[0]["status"] == "False" and events:
            return conditions[0]["reason"], events[-1]
        return None

    result: tuple[str, str] = wait_for(f"FailedScheduling for {namespace}/{name}", failed, timeout=60)
    return result


def test_a_pod_that_fits_nowhere_is_unschedulable_with_an_event_that_reads_right(
    control_plane: ControlPlane, examples: list[dict[str, Any]]
) -> None:
    client = control_plane.client()
    client.post(
        f"/api/v1/namespaces/{DEMO}/pods",
        unschedulable_pod("fits-nowhere", DEMO, {"gpuslice.io/gpu-count": "16", "gpuslice.io/gpu-model": "H100-80GB"}),
    )
    reason, message = scheduling_failure(client, DEMO, "fits-nowhere")
    assert reason == "Unschedulable"
    nodes = len(client.get("/api/v1/nodes")["items"])
    assert message.startswith(f"0/{nodes} nodes are available: "), message
    assert "%!" not in message and "MISSING" not in message, message
    # 16 whole GPUs ask 1600 GPU units, more than any node advertises: kube-scheduler's own
    # NodeResourcesFit says so before asking gpuslice (docs/serving.md, Preemption)
    assert "Insufficient gpuslice.io/gpu-units" in message, message


def test_a_malformed_pod_that_reaches_the_scheduler_is_unschedulable_not_an_error(
    control_plane: ControlPlane, examples: list[dict[str, Any]]
) -> None:
    # A namespace the webhook does not cover, so nothing refuses the pod before the scheduler.
    client = control_plane.client()
    client.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "e2e-no-webhook"}})
    client.post(
        "/api/v1/namespaces/e2e-no-webhook/pods",
        unschedulable_pod("malformed", "e2e-no-webhook", {"gpuslice.io/gpu-fraction": "1.5"}),
    )
    reason, message = scheduling_failure(client, "e2e-no-webhook", "malformed")
    assert reason == "Unschedulable", (reason, message)
    assert message.startswith("0/"), message
    assert "gpuslice cannot schedule this pod" in message and "gpuslice.io/gpu-fraction" in message, message
