"""The agent's HTTP endpoint, over real HTTP on 127.0.0.1: /metrics, and the kubelet's probes."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest

from scheduler.agent.http import Health, MetricsServer
from scheduler.core.errors import ConfigError
from tests.agent.kit import Cluster, FakeProc, agent_config, fake_gpus, make_agent, pod_uid


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
        # by default the series name no pod: the pod label is its UID
        assert 'pod="web"' not in body
        assert body.count(f'pod="{pod_uid("web")}"') == 6  # allocated and used memory and compute, processes, overrun
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


def test_the_running_agent_serves_metrics_and_probes_on_its_configured_port(tmp_path: Path) -> None:
    import socket
    import threading
    import time

    from scheduler.agent.main import run_agent
    from tests.agent.kit import NODE, write

    with socket.socket() as probe:  # a port free now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cluster = Cluster(tmp_path)
    FakeProc(tmp_path / "proc").host_process(4242, "python3")
    config = write(
        tmp_path,
        "agent.yaml",
        {
            "node": NODE,
            "devicePluginDir": str(tmp_path / "dp"),
            "podResourcesSocket": "",
            "pollSeconds": 0.05,
            "metrics": {"address": "127.0.0.1", "port": port},
            "measure": {"procRoot": str(tmp_path / "proc")},
        },
    )
    stop = threading.Event()
    thread = threading.Thread(target=run_agent, args=(config, "", "example", False, lambda _: cluster, stop))
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if get(port, "/readyz")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.05)
        assert get(port, "/readyz") == (200, "ready")
        assert get(port, "/healthz") == (200, "ok")
        status, body = get(port, "/metrics")
        # the example's hand-made MIG instance runs PID 4242, which no pod of this cluster accounts for
        assert status == 200
        assert (
            'gpuslice_stray_processes{gpu="0",node="gpu-1",uuid="GPU-5d3c1a2e-a100-0000-0000-000000000000"} 1.0' in body
        )
    finally:
        stop.set()
        thread.join(timeout=20)
    assert not thread.is_alive()
    with pytest.raises(OSError):
        get(port, "/metrics")  # stopped with the agent


def test_the_endpoint_listens_on_loopback_and_names_no_pod_unless_configured(tmp_path: Path) -> None:
    from scheduler.agent.config import MetricsSettings

    default = agent_config(tmp_path).metrics
    assert (default.address, default.pod_names) == ("127.0.0.1", False) == (MetricsSettings().address, False)
    chosen = agent_config(tmp_path, metrics={"address": "0.0.0.0", "podNames": True}).metrics
    assert (chosen.address, chosen.pod_names) == ("0.0.0.0", True)
    with pytest.raises(ConfigError, match=r"agent\.metrics\.podNames: 'yes'; accepted: true or false"):
        agent_config(tmp_path, metrics={"podNames": "yes"})
