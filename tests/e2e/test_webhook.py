"""Row 3: the real API server calls gpuslice's webhooks over TLS, through the Service the
manifests name and with the caBundle set as manifests/tls/make-serving-cert.sh sets it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.controlplane import ApiError, ControlPlane
from tests.e2e.deployed import Gpuslice

pytestmark = pytest.mark.controlplane

NAMESPACE = "e2e-webhook"


@pytest.fixture(scope="module")
def namespace(control_plane: ControlPlane, gpuslice: Gpuslice) -> str:
    control_plane.client().apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": NAMESPACE, "labels": {"gpuslice.io/webhook": "enabled"}},
        }
    )
    return NAMESPACE


def gpu_pod(name: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"containers": [{"name": "main", "image": "registry.example.com/app:1"}]},
    }


def test_a_gpu_pod_gets_the_scheduler_name_and_its_share_resource(control_plane: ControlPlane, namespace: str) -> None:
    created = control_plane.client().post(
        f"/api/v1/namespaces/{namespace}/pods", gpu_pod("half", {"gpuslice.io/gpu-fraction": "0.5"})
    )
    assert created["spec"]["schedulerName"] == "gpuslice"
    assert created["spec"]["containers"][0]["resources"]["limits"]["gpuslice.io/share"] == "1"


def test_a_pod_without_a_gpu_passes_unchanged(control_plane: ControlPlane, namespace: str) -> None:
    created = control_plane.client().post(f"/api/v1/namespaces/{namespace}/pods", gpu_pod("web", {}))
    assert created["spec"]["schedulerName"] == "default-scheduler"
    assert "resources" not in created["spec"]["containers"][0] or not created["spec"]["containers"][0]["resources"]


def test_a_malformed_request_is_refused_at_creation_with_the_parsers_message(
    control_plane: ControlPlane, namespace: str
) -> None:
    with pytest.raises(ApiError) as refused:
        control_plane.client().post(
            f"/api/v1/namespaces/{namespace}/pods", gpu_pod("bad", {"gpuslice.io/gpu-fraction": "1.5"})
        )
    message = str(refused.value.body.get("message"))
    assert refused.value.status == 422, message  # the webhook's code: Unprocessable Entity
    assert 'admission webhook "mutate.gpuslice.io" denied the request' in message, message
    assert "gpuslice.io/gpu-fraction" in message and "accepted" in message, message


def test_forged_records_are_stripped_at_creation(control_plane: ControlPlane, namespace: str) -> None:
    forged = {
        "gpuslice.io/gpu-fraction": "0.5",
        "gpuslice.io/allocation": '{"gpus": [0]}',
        "gpuslice.io/bind-phase": "bound",
    }
    created = control_plane.client().post(f"/api/v1/namespaces/{namespace}/pods", gpu_pod("forged", forged))
    annotations = created["metadata"]["annotations"]
    assert "gpuslice.io/allocation" not in annotations and "gpuslice.io/bind-phase" not in annotations
    assert annotations["gpuslice.io/gpu-fraction"] == "0.5"


def test_an_update_of_the_records_by_another_account_is_refused(control_plane: ControlPlane, namespace: str) -> None:
    # A tenant's account that may update pods: RBAC allows it, the validating webhook refuses.
    admin = control_plane.client()
    admin.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "tenant", "namespace": namespace}})
    admin.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "tenant-edit", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
            "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": namespace}],
        }
    )
    admin.post(f"/api/v1/namespaces/{namespace}/pods", gpu_pod("target", {"gpuslice.io/gpu-fraction": "0.5"}))
    tenant = control_plane.client(admin.account_token(namespace, "tenant"))
    tenant.merge_patch(f"/api/v1/namespaces/{namespace}/pods/target", {"metadata": {"labels": {"team": "a"}}})
    with pytest.raises(ApiError) as refused:
        tenant.merge_patch(
            f"/api/v1/namespaces/{namespace}/pods/target",
            {"metadata": {"annotations": {"gpuslice.io/allocation": '{"gpus": [0]}'}}},
        )
    assert refused.value.status in (400, 403)
    assert "written by the gpuslice scheduler only" in str(refused.value.body.get("message")), refused.value.body


def test_with_the_webhook_down_gpu_pods_are_refused_and_updates_go_through(
    control_plane: ControlPlane, gpuslice: Gpuslice, namespace: str
) -> None:
    admin = control_plane.client()
    admin.post(f"/api/v1/namespaces/{namespace}/pods", gpu_pod("before-outage", {"gpuslice.io/gpu-fraction": "0.5"}))
    gpuslice.stop()
    try:
        with pytest.raises(ApiError) as refused:
            admin.post(f"/api/v1/namespaces/{namespace}/pods", gpu_pod("during", {"gpuslice.io/gpu-fraction": "0.5"}))
        assert refused.value.status == 500, refused.value.body
        assert "failed calling webhook" in str(refused.value.body.get("message")), refused.value.body
        # failurePolicy Ignore for updates: labels still change while gpuslice is down
        admin.merge_patch(
            f"/api/v1/namespaces/{namespace}/pods/before-outage", {"metadata": {"labels": {"during": "outage"}}}
        )
    finally:
        gpuslice.start()
