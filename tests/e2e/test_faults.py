"""Row 6: faults under the real control plane. gpuslice killed (SIGKILL) while it binds and
started again rebuilds from the API server with no share lost or counted twice; the API server
restarted under a running gpuslice, which carries on by itself (kube-scheduler, which exits
once it cannot renew its Lease, is restarted as its kubelet would).

The nodes here carry a taint only these tests' pods tolerate, so the other tests' pods never
land on them."""

from __future__ import annotations

import signal
import subprocess
import time
from dataclasses import replace
from typing import Any

import pytest

from scheduler.core.allocation import decode_record, encode_record
from scheduler.core.k8s import parse_node
from scheduler.core.pods import holding_record, key_of
from tests.e2e.controlplane import Client, ControlPlane, wait_for
from tests.e2e.deployed import Gpuslice, put_node
from tests.e2e.nodes import gpu_node
from tests.e2e.test_kube_scheduler import PREFIX, check_no_over_allocation

pytestmark = pytest.mark.controlplane

NAMESPACE = "e2e-faults"
TAINT = {"key": "e2e-faults", "value": "yes", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def nodes(control_plane: ControlPlane, gpuslice: Gpuslice) -> list[dict[str, Any]]:
    client = control_plane.client()
    client.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    made = []
    for i in range(2):
        node = gpu_node(
            f"e2e-faults-{i}",
            gpus=4,
            sharing={"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "4"},
        )
        node["metadata"]["labels"]["e2e-faults"] = "yes"
        node["spec"]["taints"].append(TAINT)
        put_node(client, node)
        made.append(node)
    return made


def pod(name: str, fraction: str, label: str = "e2e-faults") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "annotations": {"gpuslice.io/gpu-fraction": fraction}},
        "spec": {
            "schedulerName": "gpuslice",
            "nodeSelector": {label: "yes"},
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "main", "image": "registry.example.com/app:1"}],
        },
    }


def settled(client: Client, names: set[str], timeout: float = 120.0) -> list[dict[str, Any]]:
    """The pods once every one of ``names`` is bound."""

    def all_bound() -> list[dict[str, Any]]:
        pods = [p for p in client.pods(NAMESPACE) if p["metadata"]["name"] in names]
        return pods if len(pods) == len(names) and all(p["spec"].get("nodeName") for p in pods) else []

    try:
        found: list[dict[str, Any]] = wait_for(f"{len(names)} pods bound", all_bound, timeout=timeout)
    except AssertionError as late:
        pending = {
            p["metadata"]["name"]: [e["message"] for e in client.events(NAMESPACE, p["metadata"]["name"])][-2:]
            for p in client.pods(NAMESPACE)
            if p["metadata"]["name"] in names and not p["spec"].get("nodeName")
        }
        raise AssertionError(f"{late}; pending: {pending}") from None
    return found


def test_gpuslice_killed_while_binding_rebuilds_with_no_share_lost_or_counted_twice(
    control_plane: ControlPlane, gpuslice: Gpuslice, nodes: list[dict[str, Any]]
) -> None:
    client = control_plane.client()
    names = {f"kill-{i}" for i in range(12)}  # 12 x 0.5 of 8 GPUs: 6 GPUs' worth, room for all
    for name in sorted(names):
        client.post(f"/api/v1/namespaces/{NAMESPACE}/pods", pod(name, "0.5"))
    wait_for("a first bind", lambda: any(p["spec"].get("nodeName") for p in client.pods(NAMESPACE)), timeout=60)
    gpuslice.stop(signal.SIGKILL)
    gpuslice.start()
    pods = settled(client, names)
    held = check_no_over_allocation(nodes, pods)
    assert sorted(held) == sorted(f"{NAMESPACE}/{n}" for n in names)


def test_the_api_server_restarted_under_gpuslice_and_the_scheduler(
    control_plane: ControlPlane, gpuslice: Gpuslice, nodes: list[dict[str, Any]]
) -> None:
    control_plane.stop("kube-apiserver")
    control_plane.start_apiserver()
    scheduler = control_plane.processes["kube-scheduler"]
    try:  # it gives up its Lease and exits once it cannot renew it (10 s); its kubelet restarts it
        scheduler.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pass
    else:
        assert "Leaderelection lost" in control_plane.log("kube-scheduler")
        control_plane.stop("kube-scheduler")
        gpuslice.start_scheduler()
    client = control_plane.client()
    client.post(f"/api/v1/namespaces/{NAMESPACE}/pods", pod("after-restart", "0.25"))
    pods = settled(client, {"after-restart"})
    assert gpuslice.process is not None and gpuslice.process.poll() is None
    everything = [p for p in client.pods(NAMESPACE) if p["spec"].get("nodeName")]
    check_no_over_allocation(nodes, everything)
    assert pods[0]["metadata"]["annotations"].get("gpuslice.io/bind-phase") == "bound"


def test_forged_bound_records_claim_nothing_before_or_after_a_restart(
    control_plane: ControlPlane, gpuslice: Gpuslice
) -> None:
    # A node of its own (2 GPUs, time-sliced by 4): gpuslice binds one half GPU there; then every
    # other half of the node is claimed by hand, bind-phase "bound" included, on pods placed by name
    # in a namespace the webhook does not cover. gpuslice is killed and started again: the
    # forgeries claim nothing (three more halves bind), the genuine half still counts (a fourth does not).
    client = control_plane.client()
    client.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    node = gpu_node(
        "e2e-forged-0",
        gpus=2,
        sharing={"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "4"},
    )
    node["metadata"]["labels"]["e2e-forged"] = "yes"
    node["spec"]["taints"].append(TAINT)
    put_node(client, node)
    client.post(f"/api/v1/namespaces/{NAMESPACE}/pods", pod("forged-template", "0.5", "e2e-forged"))
    (template,) = settled(client, {"forged-template"})
    text = holding_record(template, PREFIX)
    assert text is not None
    real = decode_record(text, key_of(template))
    (half,) = real.shares
    others = [d for d in parse_node(node, PREFIX).devices if d.index != half.index]
    claims = [half] + [replace(half, index=d.index, uuid=d.uuid) for d in others for _ in range(2)]
    for i, share in enumerate(claims):
        squatter = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"squatter-{i}",
                "namespace": NAMESPACE,
                "annotations": {
                    PREFIX + "allocation": encode_record(replace(real, shares=(share,)), "2026-01-01T00:00:00Z"),
                    PREFIX + "bind-phase": "bound",
                },
            },
            "spec": {
                "nodeName": "e2e-forged-0",
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "main", "image": "registry.example.com/app:1"}],
            },
        }
        client.post(f"/api/v1/namespaces/{NAMESPACE}/pods", squatter)
    gpuslice.stop(signal.SIGKILL)
    gpuslice.start()
    names = {f"after-forgery-{i}" for i in range(3)}
    for name in sorted(names):
        client.post(f"/api/v1/namespaces/{NAMESPACE}/pods", pod(name, "0.5", "e2e-forged"))
    placed = settled(client, names)
    assert {p["spec"]["nodeName"] for p in placed} == {"e2e-forged-0"}
    held = check_no_over_allocation([node], [template, *placed])
    assert sorted(held) == sorted(f"{NAMESPACE}/{n}" for n in {"forged-template", *names})
    client.post(f"/api/v1/namespaces/{NAMESPACE}/pods", pod("one-too-many", "0.5", "e2e-forged"))
    time.sleep(5)  # kube-scheduler has tried it (and found the node full) by now
    (late,) = [p for p in client.pods(NAMESPACE) if p["metadata"]["name"] == "one-too-many"]
    assert not late["spec"].get("nodeName")
