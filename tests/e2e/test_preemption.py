"""Row 5: preemption through the real kube-scheduler. A node of two time-slicing GPUs, each holding
a 0.75 GPU pod (priority 20) and a 0.25 GPU pod (priority 1): a 0.5 GPU pod of priority 100 fits
nowhere. kube-scheduler's NodeResourcesFit sees the node short of GPU units (scheduler.core.units),
so DefaultPreemption proposes it, with the victims its own filters need: the two 0.25 pods, one on
each GPU, which free no half of any GPU. gpuslice's preempt verb answers instead the fewest pods on
the right GPU among every pod of lower priority there: one 0.75 pod. kube-scheduler deletes it (a
helper plays the kubelet and ends the pod being deleted) and the pod binds to that GPU."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.core.allocation import decode_record
from scheduler.core.pods import holding_record
from scheduler.core.request import GpuKind, GpuRequest
from scheduler.core.units import pod_units
from tests.e2e.controlplane import Client, ControlPlane, end_terminating, wait_for
from tests.e2e.deployed import Gpuslice, put_node
from tests.e2e.nodes import gpu_node
from tests.e2e.test_scheduling import unschedulable_pod

pytestmark = pytest.mark.controlplane

NS = "e2e-preempt"
NODE = "e2e-preempt-node"
PREFIX = "gpuslice.io/"
CLASSES = {"e2e-low": 1, "e2e-mid": 20, "e2e-high": 100}


def gpu_pod(name: str, fraction: str, priority_class: str) -> dict[str, Any]:
    pod = unschedulable_pod(name, NS, {PREFIX + "gpu-fraction": fraction})
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NODE}  # the other tests' nodes stay out of it
    pod["spec"]["tolerations"].append({"key": NS, "operator": "Exists", "effect": "NoSchedule"})
    pod["spec"]["priorityClassName"] = priority_class
    return pod


def gpu_of(pod: dict[str, Any]) -> int:
    record = holding_record(pod, PREFIX)
    assert record is not None, pod["metadata"]
    (share,) = decode_record(record, pod["metadata"]["name"]).shares
    return share.index


def bound(client: Client, name: str, timeout: float = 60) -> dict[str, Any]:
    def placed() -> dict[str, Any] | None:
        pod: dict[str, Any] = client.get(f"/api/v1/namespaces/{NS}/pods/{name}")
        return pod if pod["spec"].get("nodeName") and holding_record(pod, PREFIX) else None

    found: dict[str, Any] = wait_for(f"{NS}/{name} bound", placed, timeout=timeout)
    return found


@pytest.fixture(scope="module")
def client(control_plane: ControlPlane, gpuslice: Gpuslice) -> Client:
    admin = control_plane.client()
    # the webhook covers the namespace: it gives each pod its GPU units
    namespace = {"name": NS, "labels": {"gpuslice.io/webhook": "enabled"}}
    admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": namespace})
    for name, value in CLASSES.items():
        admin.apply(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": value,
            }
        )
    node = gpu_node(
        NODE, gpus=2, sharing={"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "4"}
    )
    node["spec"]["taints"].append({"key": NS, "value": "yes", "effect": "NoSchedule"})
    put_node(admin, node)
    return admin


def test_the_fewest_victims_on_the_right_gpu_through_the_preempt_verb(client: Client, gpuslice: Gpuslice) -> None:
    # 0.75 + 0.75 > 1: a and b land on different GPUs; c and d then fill each GPU's last quarter
    placed: dict[str, dict[str, Any]] = {}
    for name, fraction, priority in (("a", "0.75", "e2e-mid"), ("b", "0.75", "e2e-mid"), ("c", "0.25", "e2e-low")):
        client.post(f"/api/v1/namespaces/{NS}/pods", gpu_pod(name, fraction, priority))
        placed[name] = bound(client, name)
    client.post(f"/api/v1/namespaces/{NS}/pods", gpu_pod("d", "0.25", "e2e-low"))
    placed["d"] = bound(client, "d")
    gpus = {name: gpu_of(pod) for name, pod in placed.items()}
    units = {
        name: pod["spec"]["containers"][0]["resources"]["limits"].get("gpuslice.io/gpu-units")
        for name, pod in placed.items()
    }
    assert units == {"a": "74", "b": "74", "c": "24", "d": "24"}, units
    assert gpus["a"] != gpus["b"] and gpus["c"] != gpus["d"], gpus
    # units: 2 x 74 + 2 x 24 = 196 of 200; the preemptor's 49 does not fit: kube-scheduler's
    # own filters fail the node, so its preemption proposes it (c and d: its reprieve keeps a, b)
    half = pod_units(GpuRequest(GpuKind.SHARE, 1, fraction_milli=500))
    assert half == 49 and 2 * 74 + 2 * 24 + half > 200

    client.post(f"/api/v1/namespaces/{NS}/pods", gpu_pod("urgent", "0.5", "e2e-high"))
    ended: list[str] = []

    def preempted() -> dict[str, Any] | None:
        ended.extend(end_terminating(client, NS))
        pod: dict[str, Any] = client.get(f"/api/v1/namespaces/{NS}/pods/urgent")
        return pod if pod["spec"].get("nodeName") and holding_record(pod, PREFIX) else None

    try:
        urgent = wait_for("the urgent pod bound after preemption", preempted, timeout=90, interval=0.5)
    except AssertionError as timeout:
        events = [e["message"] for e in client.events(NS, "urgent")]
        raise AssertionError(f"{timeout}; events: {events}\n{gpuslice.log()[-4000:]}") from None
    # exactly one victim: a (a and b tie on every count; a comes first by name), not c and d
    left = sorted(p["metadata"]["name"] for p in client.pods(NS))
    assert ended == ["a"] and left == ["b", "c", "d", "urgent"], (ended, left)
    assert urgent["spec"]["nodeName"] == NODE
    assert gpu_of(urgent) == gpus["a"]
    # kube-scheduler asked gpuslice's preempt verb, and gpuslice answered beyond the proposal
    lines = [line for line in gpuslice.log().splitlines() if "preempt" in line and f"{NS}/urgent" in line]
    assert any("1 beyond the proposal" in line for line in lines), lines
