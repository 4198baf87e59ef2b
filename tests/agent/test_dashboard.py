"""The Grafana dashboard uses only metrics the node agent and the extender export (read from a real
scrape of each, in-process over HTTP), uses the ones the issue asks for, and every panel is
described in docs/observability.md."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from scheduler.agent.http import Health, MetricsServer
from scheduler.extender.server import Server
from tests.agent.kit import Cluster, FakeProc, fake_gpus, make_agent

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "manifests" / "grafana" / "gpuslice-dashboard.json"
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"), "gauge": ("",)}
METRIC = re.compile(r"\b(gpuslice_[a-z0-9_]+)\b")


def exported(url: str) -> set[str]:
    """Every metric name a scrape of ``url`` offers: its samples' names, and each family's names
    by its type (a counter that has counted nothing yet still has its ``_total``)."""
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    names = set()
    for family in text_string_to_metric_families(text):
        names.update(s.name for s in family.samples)
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
    return names


def panels(body: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in body["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return [p for p in out if p.get("type") != "row"]


def expressions(body: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in panels(body) for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in body["templating"]["list"] if isinstance(v.get("query"), dict)]
    return exprs


def scrape_both(tmp_path: Path) -> set[str]:
    cluster = Cluster(tmp_path, flags={"port": 0})
    gpus = fake_gpus({"model": "L4", "uuid": "GPU-l4-0"}, {"model": "A100-80GB", "uuid": "GPU-a100-1", "mig": True})
    agent = make_agent(tmp_path, gpus, cluster, gpus={"0": {"mode": "time-slicing", "replicas": 4}})
    key = cluster.create_pod("web", gpu_memory="4Gi")
    cluster.schedule(key)
    cluster.start_containers(key)
    gpus.add_process(0, 300, 1500, sm_percent=12)
    FakeProc(tmp_path / "proc").pod_process(300, "web")
    agent.tick()
    health = Health(2, lambda: 0.0)
    agent_http = MetricsServer(agent.measure.registry, health, "127.0.0.1", 0).start()
    extender_http = Server(cluster.extender).start_in_thread()
    try:
        return exported(f"http://127.0.0.1:{agent_http.port}/metrics") | exported(f"{extender_http.url}/metrics")
    finally:
        agent_http.stop()
        extender_http.stop()


def test_the_dashboard_references_only_exported_metrics(tmp_path: Path) -> None:
    body = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    names = scrape_both(tmp_path)
    used = {m for e in expressions(body) for m in METRIC.findall(e)}
    assert used, "no metric in the dashboard"
    assert used <= names, f"not exported: {sorted(used - names)}"
    # what the dashboard is for: allocated, used, idle allocated, stray use, overruns, per node and GPU
    for needed in (
        "gpuslice_share_memory_allocated_mib",
        "gpuslice_share_memory_used_mib",
        "gpuslice_stray_memory_mib",
        "gpuslice_share_overrun",
        "gpuslice_agent_overruns_total",
        "gpuslice_gpu_memory_mib",
    ):
        assert needed in used, needed


def test_a_name_the_exporters_do_not_have_would_be_caught(tmp_path: Path) -> None:
    names = scrape_both(tmp_path)
    assert "gpuslice_share_memory_used_mib" in names and "gpuslice_binds_total" in names
    assert "gpuslice_share_memory_used_bytes" not in names and "gpuslice_binds" not in names


def test_every_panel_has_its_line_in_the_docs() -> None:
    body = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    docs = (REPO / "docs" / "observability.md").read_text(encoding="utf-8")
    described = set(re.findall(r"^- \*\*(.+?)\*\*: \S", docs, flags=re.MULTILINE))
    titles = {p["title"] for p in panels(body)}
    assert titles == described
    assert all(p.get("description") for p in panels(body))
    assert len({p["id"] for p in body["panels"]}) == len(body["panels"])
