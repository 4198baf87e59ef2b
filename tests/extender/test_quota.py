"""GPU quotas where placement is decided: filter refuses a pod that would take its namespace
over on every node with one reason; bind checks again; a restart counts the records; a
lowered quota evicts nothing."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient

from scheduler.extender import wire
from scheduler.extender.app import create_app
from scheduler.extender.config import load_config
from scheduler.extender.inspection import render_quotas
from scheduler.extender.service import Extender
from scheduler.filebackend import ClusterFileError, FileBackend

from .kit import binding, cluster_file, filter_args, holding, k8s_node, k8s_pod

NODES = ["x", "y"]


def gpu_quota(namespace: str, name: str = "q", **limits: Any) -> dict[str, Any]:
    return {
        "apiVersion": "gpuslice.io/v1alpha1",
        "kind": "GPUQuota",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"limits": limits},
    }


def served(
    tmp_path: Path, *items: dict[str, Any], nodes: tuple[dict[str, Any], ...] | None = None
) -> tuple[Extender, FileBackend]:
    """An extender over a cluster file of ``nodes`` (default: x and y, 2 MPS H100s each) and ``items``."""
    nodes = (k8s_node("x", gpus=2), k8s_node("y", gpus=2)) if nodes is None else nodes
    path = cluster_file(tmp_path / "c.json", *nodes, *items)
    config = load_config(env={}, flags={"policy": "binpack", "hold_s": 0})
    backend = FileBackend(path, config.prefix)
    extender = Extender(config, backend)
    extender.start()
    return extender, backend


def filtered(extender: Extender, pod: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = orjson.loads(extender.filter(wire.parse_args(orjson.dumps(filter_args(pod, NODES)))))
    return out


def bind(extender: Extender, pod: dict[str, Any], node: str) -> str:
    return extender.bind(wire.parse_binding(orjson.dumps(binding(pod, node))))


def place(extender: Extender, pod: dict[str, Any]) -> str:
    """Filter, then bind on the first node passed; the bind's error, or "" once bound."""
    passed = filtered(extender, pod)["NodeNames"] or []
    assert passed, filtered(extender, pod)
    return bind(extender, pod, passed[0])


# 0.5 of an H100 (81920 MiB): 40960 MiB, 500 milli each
HALF = {"gpu_fraction": "0.5"}


def test_filter_refuses_a_pod_over_its_quota_on_every_node_with_one_reason(tmp_path: Path) -> None:
    a1, a2, a3 = (k8s_pod(f"a{i}", namespace="team-a", **HALF) for i in (1, 2, 3))
    extender, _ = served(tmp_path, gpu_quota("team-a", gpuCompute="1"), a1, a2, a3)
    assert place(extender, a1) == ""
    assert place(extender, a2) == ""
    # 500 + 500 used; 500 more would make 1500 > 1000 milli
    out = filtered(extender, a3)
    assert out["NodeNames"] == []
    reason = "GPUQuota team-a/q: allows gpuCompute 1 GPUs (used: 81920 MiB, 1 GPUs of compute, 0 whole GPUs)"
    assert out["FailedNodes"] == {"x": reason, "y": reason}
    assert not out.get("FailedAndUnresolvableNodes")
    refusals = extender.metrics.registry.get_sample_value("gpuslice_quota_refusals_total", {"namespace": "team-a"})
    assert refusals == 1.0


def test_other_namespaces_are_not_held_back(tmp_path: Path) -> None:
    a1, a2 = (k8s_pod(f"a{i}", namespace="team-a", **HALF) for i in (1, 2))
    b1 = k8s_pod("b1", namespace="team-b", **HALF)
    extender, _ = served(tmp_path, gpu_quota("team-a", gpuCompute="0.5"), a1, a2, b1)
    assert place(extender, a1) == ""
    assert filtered(extender, a2)["NodeNames"] == []
    assert filtered(extender, b1)["NodeNames"] == NODES


def test_bind_checks_the_quota_again(tmp_path: Path) -> None:
    # both pass filter before either binds; the second bind is refused by the quota
    a1, a2 = (k8s_pod(f"a{i}", namespace="team-a", **HALF) for i in (1, 2))
    extender, backend = served(tmp_path, gpu_quota("team-a", gpuMemory="40Gi"), a1, a2)
    assert filtered(extender, a1)["NodeNames"] == NODES
    assert filtered(extender, a2)["NodeNames"] == NODES
    assert bind(extender, a1, "x") == ""
    error = bind(extender, a2, "y")
    assert error.startswith("GPUQuota team-a/q: allows gpuMemory 40960 MiB (used: 40960 MiB")
    assert "nodeName" not in backend.pods()["team-a/a2"]["spec"]


def test_concurrent_binds_of_one_namespace_never_go_over(tmp_path: Path) -> None:
    pods = [k8s_pod(f"a{i}", namespace="team-a", **HALF) for i in range(8)]
    extender, backend = served(tmp_path, gpu_quota("team-a", gpuCompute="2"), *pods)
    errors: list[str] = []
    threads = [
        threading.Thread(target=lambda p=p, n=n: errors.append(bind(extender, p, n)))
        for p, n in zip(pods, ["x", "y"] * 4, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bound = [k for k, p in backend.pods().items() if p["spec"].get("nodeName")]
    # 4 x 500 = 2000 milli = the quota: exactly four bound, four refused by it
    assert len(bound) == 4
    assert sum(e.startswith("GPUQuota team-a/q") for e in errors) == 4


def test_a_restart_counts_the_records(tmp_path: Path) -> None:
    a1, a2 = (k8s_pod(f"a{i}", namespace="team-a", **HALF) for i in (1, 2))
    extender, backend = served(tmp_path, gpu_quota("team-a", gpuCompute="0.5"), a1, a2)
    assert place(extender, a1) == ""
    # a new process reads the cluster as the first left it (the bound pod carries its record)
    path = tmp_path / "after.json"
    path.write_text(orjson.dumps(backend.as_list()).decode())
    config = load_config(env={}, flags={"policy": "binpack", "hold_s": 0})
    again = Extender(config, FileBackend(path, config.prefix))
    again.start()
    assert filtered(again, a2)["NodeNames"] == []
    assert again.cache.namespace_use("team-a").total.compute_milli == 500


def test_lowering_a_quota_evicts_nothing_and_reports_over_quota(tmp_path: Path) -> None:
    a1, a2 = (k8s_pod(f"a{i}", namespace="team-a", **HALF) for i in (1, 2))
    extender, backend = served(tmp_path, gpu_quota("team-a", gpuCompute="2"), a1, a2)
    assert place(extender, a1) == "" and place(extender, a2) == ""
    backend.put_quota(gpu_quota("team-a", gpuCompute="0.5"))
    assert all(p["spec"].get("nodeName") for p in backend.pods().values())
    ((quota, used),) = extender.cache.quota_use()
    assert (quota.limits.compute_milli, used.total.compute_milli) == (500, 1000)
    metrics = extender.metrics.registry.get_sample_value("gpuslice_quota_over", {"namespace": "team-a", "quota": "q"})
    assert metrics == 1.0
    # a pod leaving brings it back within: 500 <= 500
    backend.delete_pod("team-a/a2")
    assert extender.metrics.registry.get_sample_value("gpuslice_quota_over", {"namespace": "team-a", "quota": "q"}) == 0


def test_deleting_the_quota_lifts_it(tmp_path: Path) -> None:
    a1, a2 = (k8s_pod(f"a{i}", namespace="team-a", **HALF) for i in (1, 2))
    extender, backend = served(tmp_path, gpu_quota("team-a", gpuCompute="0.5"), a1, a2)
    assert place(extender, a1) == ""
    assert filtered(extender, a2)["NodeNames"] == []
    backend.delete_quota("team-a/q")
    assert filtered(extender, a2)["NodeNames"] == NODES


def test_a_quota_arriving_later_counts_what_is_already_bound(tmp_path: Path) -> None:
    a1, a2 = (k8s_pod(f"a{i}", namespace="team-a", **HALF) for i in (1, 2))
    extender, backend = served(tmp_path, a1, a2)
    assert place(extender, a1) == ""
    backend.put_quota(gpu_quota("team-a", gpuCompute="0.5"))
    assert filtered(extender, a2)["NodeNames"] == []


def test_per_model_limits(tmp_path: Path) -> None:
    a1, a2 = (k8s_pod(f"a{i}", namespace="team-a", gpu_count="1") for i in (1, 2))
    nodes = (k8s_node("x", gpus=2, mode="exclusive"), k8s_node("y", gpus=1, model="A100-80GB", mode="exclusive"))
    extender, _ = served(tmp_path, gpu_quota("team-a", models={"H100-80GB": {"gpus": 1}}), a1, a2, nodes=nodes)
    assert bind(extender, a1, "x") == ""
    out = filtered(extender, a2)
    assert out["NodeNames"] == ["y"]  # the A100 is not limited; the H100 is spoken for
    assert out["FailedNodes"]["x"].startswith("GPUQuota team-a/q: H100-80GB allows gpus 1 (used:")


def test_a_bad_quota_in_the_cluster_file_is_refused_with_its_field_path(tmp_path: Path) -> None:
    path = cluster_file(tmp_path / "c.json", k8s_node("x"), gpu_quota("team-a", gpus=-1))
    with pytest.raises(ClusterFileError, match=r"items\[1\]: GPUQuota team-a/q spec\.limits\.gpus: invalid value -1"):
        FileBackend(path)


def test_without_quotas_nothing_changes(tmp_path: Path) -> None:
    # a namespace with no quota: no use is counted, nothing asked of any quota
    a1 = k8s_pod("a1", namespace="team-a", **HALF)
    extender, _ = served(tmp_path, a1)
    assert place(extender, a1) == ""
    assert extender.cache.namespace_charges("team-a") == {}
    assert extender.cache.quota_use() == []


# ---------------------------------------------------------------- preemption


def preempt(extender: Extender, pod: dict[str, Any], victims: dict[str, list[dict[str, Any]]]) -> Any:
    proposal = {
        node: {"Pods": [{"UID": p["metadata"]["uid"]} for p in pods], "NumPDBViolations": 0}
        for node, pods in victims.items()
    }
    body = {"Pod": pod, "NodeNameToMetaVictims": proposal, "NodeNameToVictims": None}
    out = orjson.loads(extender.preempt(wire.parse_preemption(orjson.dumps(body))))
    return out["NodeNameToMetaVictims"]


def uids(*pods: dict[str, Any]) -> dict[str, Any]:
    return {"Pods": [{"UID": p["metadata"]["uid"]} for p in pods], "NumPDBViolations": 0}


def test_preempt_never_offers_other_namespaces_victims_to_a_pod_held_back_by_its_quota(tmp_path: Path) -> None:
    # x's GPU 0: a1 (team-a, 0.5) and b1 (team-b, 0.5); team-a may hold 0.5 GPU of compute.
    # a2 (team-a, 0.5) is held back by the quota, not by room: evicting b1 frees room but no quota;
    # evicting a1 frees both. b1 is the less important: by room alone it would go first.
    a1 = holding("a1", "x", 0, 500, namespace="team-a", priority=5)
    b1 = holding("b1", "x", 0, 500, namespace="team-b", priority=0)
    a2 = k8s_pod("a2", namespace="team-a", gpu_fraction="0.5")
    extender, _ = served(tmp_path, gpu_quota("team-a", gpuCompute="0.5"), a1, b1, a2, nodes=(k8s_node("x", gpus=1),))
    assert preempt(extender, a2, {"x": [b1]}) is None  # b1 alone: the node is dropped
    assert preempt(extender, a2, {"x": [b1, a1]}) == {"x": uids(a1)}


def test_preempt_adds_own_victims_until_the_quota_admits(tmp_path: Path) -> None:
    # x: GPU 0 a1 (0.25) + a2 (0.25) of team-a; GPU 1 free. Quota 0.5: a3 (0.5) fits on GPU 1 by
    # room, but only once both a1 and a2 are gone is team-a within 0.5 GPU (0 + 500 <= 500).
    a1 = holding("a1", "x", 0, 250, namespace="team-a", priority=1)
    a2 = holding("a2", "x", 0, 250, namespace="team-a", priority=0)
    a3 = k8s_pod("a3", namespace="team-a", gpu_fraction="0.5")
    extender, _ = served(tmp_path, gpu_quota("team-a", gpuCompute="0.5"), a1, a2, a3, nodes=(k8s_node("x", gpus=2),))
    assert preempt(extender, a3, {"x": [a1]}) is None  # a1 alone frees 250: 250 + 500 > 500
    assert preempt(extender, a3, {"x": [a1, a2]}) == {"x": uids(a1, a2)}


def test_preempt_without_quota_trouble_is_unchanged(tmp_path: Path) -> None:
    # team-b has a roomy quota: its pod gets the usual fewest victims, of any namespace
    a1 = holding("a1", "x", 0, 500, namespace="team-a")
    a2 = holding("a2", "x", 0, 500, namespace="team-a")
    b1 = k8s_pod("b1", namespace="team-b", gpu_fraction="0.5")
    extender, _ = served(tmp_path, gpu_quota("team-b", gpus=8), a1, a2, b1, nodes=(k8s_node("x", gpus=1),))
    got = preempt(extender, b1, {"x": [a1, a2]})
    assert got is not None and len(got["x"]["Pods"]) == 1


def test_the_status_of_each_quota_is_written_when_it_changes(tmp_path: Path) -> None:
    a1 = k8s_pod("a1", namespace="team-a", **HALF)
    extender, backend = served(tmp_path, gpu_quota("team-a", gpuCompute="0.5"), a1)
    assert extender.report_quotas() == 1
    used = {"gpuMemory": "0Mi", "gpuCompute": "0m", "gpus": 0}
    assert backend.quotas()["team-a/q"]["status"] == {"used": used, "overQuota": False}
    assert extender.report_quotas() == 0  # nothing changed: nothing written
    assert place(extender, a1) == ""
    assert extender.report_quotas() == 1
    # 0.5 of 81920 MiB = 40960 MiB, 500 milli
    used = {"gpuMemory": "40960Mi", "gpuCompute": "500m", "gpus": 0}
    assert backend.quotas()["team-a/q"]["status"] == {"used": used, "overQuota": False}


# ---------------------------------------------------------------- where operators look


def test_inspect_quotas_shows_used_and_allowed_per_scope(serve: Any) -> None:
    a1 = holding("a1", "x", 0, 500, namespace="team-a")
    quota = gpu_quota("team-a", gpuMemory="80Gi", gpuCompute="0.5", models={"H100-80GB": {"gpus": 1}})
    svc = serve(k8s_node("x", gpus=1), quota, a1)
    response = svc.http.get("/debug/quotas")
    assert response.status_code == 200
    (shown,) = response.json()["quotas"]
    assert shown["used"]["gpuCompute"] == "500m" and shown["overQuota"] is False
    # 0.5 x 81920 = 40960 MiB of 80 x 1024 = 81920; 0.5 of 0.5 GPUs; 0 of 1 whole H100
    assert render_quotas(response.json()["quotas"]).splitlines() == [
        "NAMESPACE   QUOTA   MODEL       MEMORY            COMPUTE   GPUS   OVER",
        "team-a      q       *           40960/81920 MiB   0.5/0.5   0/-    no",
        "                    H100-80GB   40960/- MiB       0.5/-     0/1",
    ]


def test_the_webhook_warns_of_a_pod_its_quota_can_never_admit(serve: Any) -> None:
    from scheduler.cli.serving import service_mounts
    from tests.deploy.reviews import review

    svc = serve(k8s_node("x", gpus=4, mode="exclusive"), gpu_quota("team-a", gpus=2))
    svc.http = TestClient(create_app(svc.extender, service_mounts(svc.config)))

    def warnings(pod: dict[str, Any]) -> list[str]:
        body = review(pod)
        body["request"]["namespace"] = pod["metadata"]["namespace"]
        response = svc.http.post("/validate", json=body)
        assert response.status_code == 200 and response.json()["response"]["allowed"] is True
        return list(response.json()["response"].get("warnings") or [])

    # 3 whole GPUs > the 2 the quota allows, whatever else runs: warned at creation
    (warned,) = warnings(k8s_pod("big", namespace="team-a", gpu_count="3"))
    assert warned == (
        "this pod (3 whole GPUs) can never be scheduled in namespace team-a: "
        "GPUQuota team-a/q: allows gpus 2 (used: 0 MiB, 0 GPUs of compute, 0 whole GPUs)"
    )
    assert warnings(k8s_pod("ok", namespace="team-a", gpu_count="2")) == []
    assert warnings(k8s_pod("other", namespace="team-b", gpu_count="3")) == []
