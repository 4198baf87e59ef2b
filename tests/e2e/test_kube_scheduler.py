"""End to end, as kube-scheduler really drives an extender: the benchmark's own model of its
loop (benchmarks/extender_driver.py: rotating node sampling, binds sent asynchronously while
the next pods are filtered, back-off and retries, many request shapes, pods that fit nowhere)
against the service over HTTP, through the file backend and through the Kubernetes backend on
a fake API server. Bind failures stay under 1%, nothing is over-allocated, every bound pod is
held once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from scheduler.cli.serving import service_mounts
from scheduler.core.k8s import parse_node
from scheduler.core.pods import holding_record, key_of
from scheduler.core.state import rebuild
from scheduler.extender.config import load_config
from scheduler.extender.server import Server
from scheduler.extender.service import Extender
from scheduler.filebackend import FileBackend
from scheduler.kube import KubeBackend
from tests.fakes import FakeApiServer
from tests.fakes.driver import driver

PREFIX = "gpuslice.io/"


def serve(backend: Any, **flags: Any) -> Server:
    config = load_config(env={}, flags={"port": 0, **flags})
    extender = Extender(config, backend)
    extender.start()
    return Server(extender, service_mounts(config)).start_in_thread()


def check_no_over_allocation(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> list[str]:
    """Rebuild every node from the pods' records, as a restarted service would: no record
    conflicts with another. Returns the keys of the pods holding a share."""
    by_node: dict[str, list[tuple[str, str]]] = {}
    for pod in pods:
        text = holding_record(pod, PREFIX)
        if text is not None:
            by_node.setdefault(pod["spec"]["nodeName"], []).append((key_of(pod), text))
    held = []
    for node in nodes:
        name = node["metadata"]["name"]
        _, problems = rebuild(parse_node(node, PREFIX), by_node.get(name, []))
        assert problems == [], problems
        held.extend(k for k, _ in by_node.get(name, []))
    return held


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.mark.parametrize("sampling", [0, 100])
def test_asynchronous_binds_through_the_file_backend(tmp_path: Path, sampling: int) -> None:
    path = tmp_path / "cluster.json"
    cluster = driver.write_cluster(path, 150, 400, seed=5, mix="many")
    server = serve(FileBackend(path, PREFIX))
    try:
        scheduler = driver.KubeScheduler(server.port, cluster.nodes, cluster.running, percentage=sampling, binders=8)
        got = scheduler.run(cluster.pending, warmup=0)
        backend = server.extender.backend
        assert isinstance(backend, FileBackend)
        pods = list(backend.pods().values())
    finally:
        server.stop()
        server.extender.stop()
    assert got.binds >= 300 and got.bound > 0
    assert got.bind_errors <= 0.01 * got.binds, (got.bind_errors, got.binds, scheduler.errors[:5])
    assert got.unschedulable > 0  # the mix has pods that fit nowhere, retried again and again
    held = check_no_over_allocation(cluster.nodes, pods)
    assert len(held) == len(set(held)) == got.bound


def test_asynchronous_binds_through_the_kubernetes_backend(apiserver: FakeApiServer, tmp_path: Path) -> None:
    cluster = driver.write_cluster(tmp_path / "cluster.json", 40, 250, seed=6, mix="many")
    for node in cluster.nodes:
        apiserver.put_node(node)
    for pod in cluster.pending:
        apiserver.put_pod(pod)
    server = serve(KubeBackend.from_url(apiserver.url, prefix=PREFIX, conflict_backoff_s=0.001))
    try:
        scheduler = driver.KubeScheduler(server.port, cluster.nodes, [], percentage=0, binders=8)
        got = scheduler.run(cluster.pending, warmup=0)
    finally:
        server.stop()
        server.extender.stop()
    assert got.binds >= 150 and got.bound > 0
    assert got.bind_errors <= 0.01 * got.binds, (got.bind_errors, got.binds, scheduler.errors[:5])
    pods = [orjson.loads(orjson.dumps(p)) for p in apiserver.pods()]
    held = check_no_over_allocation(apiserver.nodes(), pods)
    assert len(held) == len(set(held)) == got.bound
