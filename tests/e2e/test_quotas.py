"""GPU quotas on the real control plane: the shipped CRD refuses a bad GPUQuota with the field
path; gpuslice enforces one through the real kube-scheduler (the pod over quota Unschedulable
with a FailedScheduling event naming it) and keeps its status current; a lowered quota leaves
the running pod alone and reports the namespace over."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.controlplane import ApiError, Client, ControlPlane, wait_for
from tests.e2e.deployed import Gpuslice, put_node
from tests.e2e.nodes import gpu_node
from tests.e2e.test_scheduling import scheduling_failure, unschedulable_pod

pytestmark = pytest.mark.controlplane

NS = "e2e-quota"
NODE = "e2e-quota-node"
QUOTAS = f"/apis/gpuslice.io/v1alpha1/namespaces/{NS}/gpuquotas"


def quota(name: str, limits: Any) -> dict[str, Any]:
    return {
        "apiVersion": "gpuslice.io/v1alpha1",
        "kind": "GPUQuota",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"limits": limits},
    }


def half_gpu_pod(name: str) -> dict[str, Any]:
    pod = unschedulable_pod(name, NS, {"gpuslice.io/gpu-fraction": "0.5"})
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NODE}  # the other tests' nodes stay out of it
    pod["spec"]["tolerations"].append({"key": "e2e-quota", "operator": "Exists", "effect": "NoSchedule"})
    return pod


@pytest.fixture(scope="module")
def client(control_plane: ControlPlane, gpuslice: Gpuslice) -> Client:
    admin = control_plane.client()
    admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    node = gpu_node(
        NODE, gpus=1, sharing={"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "4"}
    )
    node["spec"]["taints"].append({"key": "e2e-quota", "value": "yes", "effect": "NoSchedule"})
    put_node(admin, node)
    return admin


@pytest.mark.parametrize(
    ("limits", "field"),
    [
        ({"gpus": -1}, "spec.limits.gpus"),
        ({"gpuMemory": "lots"}, "spec.limits.gpuMemory"),
        ({"gpuCompute": "-1"}, "spec.limits.gpuCompute"),
        ({}, "spec.limits"),
    ],
    ids=["negative gpus", "memory not a quantity", "negative compute", "no limit"],
)
def test_the_api_server_refuses_a_bad_quota_with_the_field_path(client: Client, limits: Any, field: str) -> None:
    with pytest.raises(ApiError) as refused:
        client.post(QUOTAS, quota("bad", limits))
    assert refused.value.status == 422, refused.value.body
    assert field in str(refused.value.body.get("message", "")), refused.value.body


def test_a_quota_is_enforced_through_the_real_scheduler_and_its_status_kept(client: Client) -> None:
    client.post(QUOTAS, quota("team", {"gpuCompute": "0.5"}))
    client.post(f"/api/v1/namespaces/{NS}/pods", half_gpu_pod("first"))
    bound = wait_for(
        "the first half GPU bound",
        lambda: client.get(f"/api/v1/namespaces/{NS}/pods/first")["spec"].get("nodeName"),
        timeout=60,
    )
    assert bound == NODE
    client.post(f"/api/v1/namespaces/{NS}/pods", half_gpu_pod("second"))
    reason, message = scheduling_failure(client, NS, "second")
    assert reason == "Unschedulable", (reason, message)
    assert f"GPUQuota {NS}/team" in message and "gpuCompute" in message, message

    def used() -> Any:
        status = client.get(f"{QUOTAS}/team").get("status") or {}
        return status if (status.get("used") or {}).get("gpuCompute") == "500m" else None

    status = wait_for("status.used.gpuCompute 500m", used, timeout=30)
    assert not status.get("overQuota"), status

    # lowered under what is held: nothing is evicted, the namespace is reported over
    client.merge_patch(f"{QUOTAS}/team", {"spec": {"limits": {"gpuCompute": "0.25"}}})
    over = wait_for(
        "status.overQuota", lambda: (client.get(f"{QUOTAS}/team").get("status") or {}).get("overQuota"), timeout=30
    )
    assert over is True
    first = client.get(f"/api/v1/namespaces/{NS}/pods/first")
    assert first["spec"]["nodeName"] == NODE and first["metadata"].get("deletionTimestamp") is None
