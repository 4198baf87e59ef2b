"""The service over real HTTP (uvicorn on 127.0.0.1, a random port): parallel binds, a
restart, the operations endpoints, and the commands a user runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from scheduler.core.k8s import parse_node
from scheduler.core.request import MILLI
from scheduler.core.state import rebuild
from scheduler.extender.client import ExtenderClient
from scheduler.extender.config import load_config
from scheduler.extender.server import Server
from scheduler.extender.service import Extender
from scheduler.filebackend import FileBackend

from .kit import PREFIX, cluster_file, k8s_node, k8s_pod

REPO = Path(__file__).resolve().parents[2]


def start(path: Path, **flags: Any) -> Server:
    config = load_config(env={}, flags={"port": 0, **flags})
    extender = Extender(config, FileBackend(path, config.prefix))
    extender.start()
    return Server(extender).start_in_thread()


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    running: list[Server] = []
    yield running
    for server in running:
        server.stop()


def records_by_node(backend: FileBackend) -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    for key, pod in backend.pods().items():
        text = pod["metadata"].get("annotations", {}).get(PREFIX + "allocation")
        if text is not None:
            out.setdefault(pod["spec"]["nodeName"], []).append((key, text))
    return out


def test_parallel_binds_never_over_allocate(tmp_path: Path, servers: list[Server]) -> None:
    nodes = [k8s_node(f"n{i}", gpus=2) for i in range(3)]  # 6 H100s under MPS
    pods = [k8s_pod(f"p{i:02d}", gpu_fraction="0.3") for i in range(40)]
    server = start(cluster_file(tmp_path / "c.json", *nodes, *pods))
    servers.append(server)
    client = ExtenderClient(server.url)
    names = [n["metadata"]["name"] for n in nodes]

    def schedule(i: int) -> str:
        # as a requeued pod would: try every node, starting at a different one each time
        pod = pods[i]
        for k in range(len(names)):
            if not client.bind(pod, names[(i + k) % len(names)]):
                return names[(i + k) % len(names)]
        return ""

    with ThreadPoolExecutor(16) as pool:
        placed = list(pool.map(schedule, range(len(pods))))
    # 3 shares of 300 milli per GPU (900 <= 1000), 6 GPUs: exactly 18 pods fit
    assert sum(1 for p in placed if p) == 18

    backend = server.extender.backend
    assert isinstance(backend, FileBackend)
    by_node = records_by_node(backend)
    assert sum(len(r) for r in by_node.values()) == 18  # one record per bound pod
    for name, records in by_node.items():
        state, problems = rebuild(parse_node(backend.nodes()[name]), records)
        assert problems == []
        assert all(u.compute_milli <= MILLI and u.shares <= 3 for u in state.usage)
        assert state == server.extender.cache.state(name)  # the service's view is the records' view
    for i, node in enumerate(placed):
        if node:
            assert backend.pods()[f"default/p{i:02d}"]["spec"]["nodeName"] == node
    client.close()


def test_restart_rebuilds_the_same_state(tmp_path: Path, servers: list[Server]) -> None:
    nodes = [k8s_node("a", gpus=4), k8s_node("b", gpus=2, model="A100-80GB", mode="mig")]
    pods = [k8s_pod(f"m{i}", mig_profile="2g.20gb") for i in range(4)]
    pods += [k8s_pod(f"p{i}", gpu_fraction="0.25", sharing="mps") for i in range(6)]
    first = start(cluster_file(tmp_path / "c.json", *nodes, *pods))
    servers.append(first)
    client = ExtenderClient(first.url)
    done = 0
    for pod in pods:
        names = client.filter(pod, ["a", "b"])["NodeNames"]
        scores = client.prioritize(pod, names)
        if client.bind(pod, max(scores, key=lambda hp: hp["Score"])["Host"]) == "":
            done += 1
        if done == 7:
            break  # stop mid-stream
    before = client.get("/debug/nodes")
    client.close()
    first.stop()
    backend = first.extender.backend
    assert isinstance(backend, FileBackend)
    saved = tmp_path / "after.json"
    saved.write_text(json.dumps(backend.as_list()))

    second = start(saved)
    servers.append(second)
    again = ExtenderClient(second.url)
    assert again.get("/debug/nodes") == before
    assert sum(len(n["pods"]) for n in before["nodes"]) == 7
    again.close()


def test_operations_endpoints(tmp_path: Path, servers: list[Server]) -> None:
    pod = k8s_pod("p", gpu_memory="8Gi")
    server = start(cluster_file(tmp_path / "c.json", k8s_node("a", gpus=2), k8s_node("cpu", gpus=0), pod))
    servers.append(server)
    client = ExtenderClient(server.url)
    assert client.request("GET", "/healthz") == (200, b"ok")
    assert client.request("GET", "/readyz")[0] == 200
    client.filter(pod, ["a", "cpu"])
    assert client.bind(pod, "a") == ""
    node = client.get("/debug/nodes/a")
    gpu0 = node["devices"][0]
    # 8 GiB = 8192 MiB of 81920; compute in proportion: ceil(8192 * 1000 / 81920) = 100 milli
    assert (gpu0["memoryAllocatedMiB"], gpu0["memoryFreeMiB"], gpu0["computeAllocatedMilli"]) == (8192, 73728, 100)
    assert node["pods"][0]["pod"] == "default/p" and node["pods"][0]["shares"][0]["index"] == 0
    status, body = client.request("GET", "/debug/nodes/ghost")
    assert status == 404 and b"unknown" in body
    status, metrics = client.request("GET", "/metrics")
    text = metrics.decode()
    assert status == 200
    assert 'gpuslice_extender_request_seconds_count{verb="filter"} 1.0' in text
    assert 'gpuslice_binds_total{outcome="bound"} 1.0' in text
    assert 'gpuslice_filter_rejections_total{reason="node has no GPUs"} 1.0' in text
    assert 'gpuslice_gpu_memory_mib{mode="mps",node="a",state="allocated"} 8192.0' in text
    # 2 GPUs: 81920 * 2 - 8192 = 155648 MiB free
    assert 'gpuslice_gpu_memory_mib{mode="mps",node="a",state="free"} 155648.0' in text
    assert 'gpuslice_gpu_compute_milli{mode="mps",node="a",state="allocated"} 100.0' in text
    client.close()


def test_not_ready_until_synced(tmp_path: Path, servers: list[Server]) -> None:
    config = load_config(env={}, flags={"port": 0})
    extender = Extender(config, FileBackend(cluster_file(tmp_path / "c.json", k8s_node("a")), config.prefix))
    server = Server(extender).start_in_thread()  # the backend was never started
    servers.append(server)
    client = ExtenderClient(server.url)
    assert client.request("GET", "/readyz")[0] == 503
    assert "not ready" in client.filter(k8s_pod("p", gpu_fraction="0.5"), ["a"])["Error"]
    client.close()


def test_inspect_prints_the_table(tmp_path: Path, servers: list[Server]) -> None:
    from scheduler.cli import app

    pod = k8s_pod("p", gpu_fraction="0.5", node=None)
    server = start(cluster_file(tmp_path / "c.json", k8s_node("gpu-a", gpus=1), pod))
    servers.append(server)
    client = ExtenderClient(server.url)
    assert client.bind(pod, "gpu-a") == ""
    client.close()
    runner = CliRunner()
    result = runner.invoke(app, ["inspect", "--url", server.url], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    header, row = result.output.splitlines()
    assert header.split() == ["NODE", "GPU", "MODE", "MEMORY-MIB", "FREE-MIB", "COMPUTE", "PODS"]
    assert row.split() == ["gpu-a", "0", "mps", "40960/81920", "40960", "50%", "1"]
    result = runner.invoke(app, ["inspect", "--url", server.url, "-o", "wide"])
    assert "default/p" in result.output and "gpu-a-gpu0" in result.output
    result = runner.invoke(app, ["inspect", "gpu-a", "--url", server.url, "-o", "json"])
    assert json.loads(result.output)["name"] == "gpu-a"
    result = runner.invoke(app, ["inspect", "gpu-a", "--url", server.url, "-o", "yaml"])
    assert yaml.safe_load(result.output)["devices"][0]["memoryAllocatedMiB"] == 40960
    result = runner.invoke(app, ["inspect", "--url", "http://127.0.0.1:9"])
    assert result.exit_code == 1 and "cannot reach gpuslice" in result.output


def _gpuslice(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("gpuslice")  # the console script pip installs
    command = [str(script)] if script.exists() else [sys.executable, "-c", "from scheduler.cli import main; main()"]
    return subprocess.run(
        [*command, *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_serve_example_demo_as_a_user_runs_it() -> None:
    done = _gpuslice("serve", "--cluster-file", "example", "--port", "0", "--demo-exit")
    assert done.returncode == 0, done.stderr
    assert "demo/mig-3g" in done.stdout and "a100-mig-static" in done.stdout and "MIG 3g.40gb" in done.stdout
    assert "not scheduled" in done.stdout  # demo/too-big fits nowhere, and says why
    logs = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    listening = next(entry for entry in logs if entry["msg"] == "listening")
    assert listening["url"].startswith("http://127.0.0.1:") and "gpuslice inspect" in listening["try"]
    binds = [entry for entry in logs if entry["msg"] == "bind"]
    assert binds and all(entry["pod"] and entry["node"] for entry in binds)


def test_serve_refuses_bad_configuration(tmp_path: Path) -> None:
    done = _gpuslice("serve", "--cluster-file", "example", "--policy", "nope", "--port", "70000")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "gpuslice serve: invalid configuration:",
        "  --policy: unknown policy 'nope'; accepted: bestfit, binpack, dotprod, fgd, fgd-cpu, fgd-reserve, "
        "gpuclustering, gpupacking, random, spread",
        "  --port '70000': accepted: a whole number from 0 to 65535",
    ]
    bad = tmp_path / "c.json"
    bad.write_text('{"kind": "List", "items": [{"kind": "Node"}]}')
    done = _gpuslice("serve", "--cluster-file", str(bad))
    assert done.returncode == 2 and f"{bad}: items[0]: 'metadata' must be an object" in done.stderr


def test_serve_without_a_cluster_says_how_to_try_it(tmp_path: Path) -> None:
    env = {"KUBECONFIG": str(tmp_path / "missing"), "HOME": str(tmp_path), "KUBERNETES_SERVICE_HOST": ""}
    done = _gpuslice("serve", "--port", "0", env=env)
    assert done.returncode == 1, done.stderr
    assert "gpuslice serve --cluster-file example --demo" in done.stderr
