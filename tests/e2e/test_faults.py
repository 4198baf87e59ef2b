"""Row 6: faults under the real control plane. gpuslice killed (SIGKILL) while it binds and
started again rebuilds from the API server with no share lost or counted twice; the API server
restarted under a running gpuslice, which carries on by itself (kube-scheduler, which exits
once it cannot renew its Lease, is restarted as its kubelet would).

The nodes here carry a taint only these tests' pods tolerate, so the other tests' pods never
land on them."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from dataclasses import replace
from typing import Any

import pytest

from scheduler.core.allocation import decode_record, encode_record
from scheduler.core.k8s import parse_node
from scheduler.core.pods import holding_record, key_of
from tests.e2e.controlplane import Client, ControlPlane, end_pod, wait_for
from tests.e2e.deployed import Gpuslice, put_node
from tests.e2e.nodes import gpu_node
from tests.e2e.test_fake_parity import expired_watch_of_the_fake, watch_answer
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


def pod(name: str, fraction: str, selector: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "annotations": {"gpuslice.io/gpu-fraction": fraction}},
        "spec": {
            "schedulerName": "gpuslice",
            "nodeSelector": selector or {"e2e-faults": "yes"},
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


def restart_apiserver(control_plane: ControlPlane, gpuslice: Gpuslice, *flags: str) -> None:
    """kube-apiserver stopped and started again (with ``flags`` added) under a running gpuslice and
    kube-scheduler. kube-scheduler gives up its Lease and exits once it cannot renew it (10 s);
    its kubelet would restart it, and so does this."""
    control_plane.stop("kube-apiserver")
    control_plane.start_apiserver(*flags)
    scheduler = control_plane.processes["kube-scheduler"]
    try:
        scheduler.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pass
    else:
        assert "Leaderelection lost" in control_plane.log("kube-scheduler")
        control_plane.stop("kube-scheduler")
        gpuslice.start_scheduler()


def test_the_api_server_restarted_under_gpuslice_and_the_scheduler(
    control_plane: ControlPlane, gpuslice: Gpuslice, nodes: list[dict[str, Any]]
) -> None:
    restart_apiserver(control_plane, gpuslice)
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
    client.post(f"/api/v1/namespaces/{NAMESPACE}/pods", pod("forged-template", "0.5", {"e2e-forged": "yes"}))
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
        client.post(f"/api/v1/namespaces/{NAMESPACE}/pods", pod(name, "0.5", {"e2e-forged": "yes"}))
    placed = settled(client, names)
    assert {p["spec"]["nodeName"] for p in placed} == {"e2e-forged-0"}
    held = check_no_over_allocation([node], [template, *placed])
    assert sorted(held) == sorted(f"{NAMESPACE}/{n}" for n in {"forged-template", *names})
    client.post(f"/api/v1/namespaces/{NAMESPACE}/pods", pod("one-too-many", "0.5", {"e2e-forged": "yes"}))
    time.sleep(5)  # kube-scheduler has tried it (and found the node full) by now
    (late,) = [p for p in client.pods(NAMESPACE) if p["metadata"]["name"] == "one-too-many"]
    assert not late["spec"].get("nodeName")


WATCH_TIMEOUT_S = 3
GONE = re.compile(r"watch of pods: watch pods: HTTP 410 Expired: .*; relisting")


def test_a_watch_that_expires_is_listed_again(
    control_plane: ControlPlane, gpuslice: Gpuslice, nodes: list[dict[str, Any]]
) -> None:
    """The API server serves watches from etcd (no watch cache), gpuslice's watches end every
    few seconds and are resumed from the last resourceVersion seen. gpuslice is paused while its
    pods watch has ended; behind its back a pod is deleted and etcd compacted: resumed, the
    watch is refused (410 Gone, an ERROR event in v1.37), and only the list that follows can
    show the deletion. On a node of one GPU that two halves filled, gpuslice then counts the
    kept half once and the deleted one not at all; a new half binds there, and a further half
    finds no room (no share lost).

    (A pod created during the pause is left out: kube-scheduler's filter calls, queued while
    gpuslice is paused, are answered from its view before that list, and a pod refused so
    waits in kube-scheduler's unschedulable pool for a cluster event or its 5-minute flush.)"""
    client = control_plane.client()
    node = gpu_node(
        "e2e-expiry",
        gpus=1,
        sharing={"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "4"},
    )
    node["metadata"]["labels"]["e2e-expiry"] = "yes"
    node["spec"]["taints"].append(TAINT)
    put_node(client, node)
    selector = {"e2e-expiry": "yes"}
    restart_apiserver(control_plane, gpuslice, "--watch-cache=false")
    gpuslice.stop()
    try:
        gpuslice.start(kube={"watch_timeout_s": WATCH_TIMEOUT_S})
        for name in ("expiry-kept", "expiry-deleted"):
            client.post(f"/api/v1/namespaces/{NAMESPACE}/pods", pod(name, "0.5", selector))
        settled(client, {"expiry-kept", "expiry-deleted"})
        assert gpuslice.process is not None
        logged = len(GONE.findall(gpuslice.log()))
        before = client.get(f"/api/v1/namespaces/{NAMESPACE}/pods")["metadata"]["resourceVersion"]
        gpuslice.process.send_signal(signal.SIGSTOP)
        try:
            time.sleep(WATCH_TIMEOUT_S + 2)  # the API server has ended the pods watch it had open
            end_pod(client, {"metadata": {"namespace": NAMESPACE, "name": "expiry-deleted"}})
            # a later write, so that the revision compacted is past the first one the resumed
            # watch asks for (at exactly that one, v1.37 answers 500: the event's previous
            # value is gone, not its history)
            client.apply(
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "expiry", "namespace": NAMESPACE}}
            )
            control_plane.compact_etcd()
        finally:
            gpuslice.process.send_signal(signal.SIGCONT)
        wait_for("gpuslice's pods watch refused with 410 Gone", lambda: len(GONE.findall(gpuslice.log())) > logged)
        # v1.37 refuses such a watch with an ERROR event in a 200 stream, not with an HTTP 410;
        # the fake API server answers the same
        path = f"/api/v1/namespaces/{NAMESPACE}/pods"
        expired = watch_answer(client.http, path, before)
        assert expired[0] == 200 and [e["type"] for e in expired[1]] == ["ERROR"], expired
        assert expired[1][0]["object"]["code"] == 410 and expired[1][0]["object"]["reason"] == "Expired", expired
        assert expired_watch_of_the_fake(path) == expired

        def counted() -> list[tuple[str, bool]]:
            return [(p["pod"], p["inFlight"]) for p in gpuslice.debug("/debug/nodes/e2e-expiry")["pods"]]

        wait_for(
            "the kept half counted once, the deleted one not",
            lambda: counted() == [(f"{NAMESPACE}/expiry-kept", False)],
            timeout=30,
        )
        client.post(f"/api/v1/namespaces/{NAMESPACE}/pods", pod("expiry-new", "0.5", selector))
        (placed,) = settled(client, {"expiry-new"})
        assert placed["spec"]["nodeName"] == "e2e-expiry"
        client.post(f"/api/v1/namespaces/{NAMESPACE}/pods", pod("expiry-no-room", "0.5", selector))
        wait_for(
            "a FailedScheduling event for the pod with no room",
            lambda: [e for e in client.events(NAMESPACE, "expiry-no-room") if e["reason"] == "FailedScheduling"],
        )
        on_node = [p for p in client.pods(NAMESPACE) if p["spec"].get("nodeName") == "e2e-expiry"]
        assert sorted(p["metadata"]["name"] for p in on_node) == ["expiry-kept", "expiry-new"]
        check_no_over_allocation([node], on_node)
    finally:
        end_pod(client, {"metadata": {"namespace": NAMESPACE, "name": "expiry-no-room"}})
        gpuslice.stop()
        restart_apiserver(control_plane, gpuslice)
        gpuslice.start()
