"""The agent's HTTP endpoint, over real HTTP on 127.0.0.1: /metrics, and the kubelet's probes."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

from scheduler.agent.http import Health, MetricsServer
from tests.agent.kit import Cluster, FakeProc, fake_gpus, make_agent


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_metrics_and_probes_over_http(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    gpus = fake_gpus({"model": "L4", "uuid": "GPU-l4-0"})
    proc = FakeProc(tmp_path / "proc")
    agent = make_agent(tmp_path, gpus, cluster, gpus={"0": {"mode": "time-slicing", "replicas": 2}})
    key = cluster.create_pod("web", gpu_memory="4Gi")
    cluster.schedule(key)
    cluster.start_containers(key)
    gpus.add_process(0, 300, 1500, sm_percent=12)
    proc.pod_process(300, "web")
    agent.tick()
    now = [0.0]
    health = Health(poll_s=2, clock=lambda: now[0])
    server = MetricsServer(agent.measure.registry, health, "127.0.0.1", 0).start()
    try:
        status, body = get(server.port, "/metrics")
        assert status == 200
        assert 'gpuslice_share_memory_used_mib{gpu="0",mig_profile="",mode="time-slicing",model="L4"' in body
        assert body.count('pod="web"') == 6  # allocated and used memory and compute, processes, overrun
        assert get(server.port, "/readyz") == (503, "starting")
        health.started = True
        assert get(server.port, "/readyz") == (200, "ready")
        assert get(server.port, "/healthz") == (200, "ok")
        now[0] += 31  # no round for longer than max(30 s, 10 rounds of 2 s)
        assert get(server.port, "/healthz") == (503, "no round finished lately")
        health.round_done()
        assert get(server.port, "/healthz") == (200, "ok")
        assert get(server.port, "/other")[0] == 404
    finally:
        server.stop()
