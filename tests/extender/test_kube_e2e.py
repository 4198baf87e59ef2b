"""End to end: two service instances share one (fake) API server through the Kubernetes
backend, and kube-scheduler's binds are fired at both in parallel over HTTP."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from scheduler.core.k8s import parse_node
from scheduler.core.request import MILLI
from scheduler.core.state import rebuild
from scheduler.extender.client import ExtenderClient
from scheduler.extender.config import load_config
from scheduler.extender.server import Server
from scheduler.extender.service import Extender
from scheduler.kube import KubeBackend
from tests.fakes import FakeApiServer

from .kit import PREFIX, k8s_node, k8s_pod


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


def test_two_instances_never_give_a_share_twice(apiserver: FakeApiServer) -> None:
    nodes = [k8s_node(f"n{i}", gpus=2) for i in range(3)]  # 6 H100s under MPS
    pods = [k8s_pod(f"p{i:02d}", gpu_fraction="0.3") for i in range(30)]
    for node in nodes:
        apiserver.put_node(node)
    for pod in pods:
        apiserver.put_pod(pod)
    servers: list[Server] = []
    try:
        for _ in range(2):
            config = load_config(env={}, flags={"port": 0})
            backend = KubeBackend.from_url(apiserver.url, prefix=config.prefix, conflict_backoff_s=0.001)
            extender = Extender(config, backend)
            extender.start()
            servers.append(Server(extender).start_in_thread())
        clients = [ExtenderClient(s.url) for s in servers]
        names = [n["metadata"]["name"] for n in nodes]

        def schedule(i: int) -> str:
            client = clients[i % 2]  # every other pod through the other replica
            for k in range(len(names)):
                node = names[(i + k) % len(names)]
                if client.bind(pods[i], node) == "":
                    return node
            return ""

        with ThreadPoolExecutor(12) as pool:
            placed = list(pool.map(schedule, range(len(pods))))
        # 3 shares of 300 milli per GPU, 6 GPUs: exactly 18 of the 30 pods fit
        assert sum(1 for p in placed if p) == 18

        records: dict[str, list[tuple[str, str]]] = {}
        for pod in apiserver.pods():
            meta = pod["metadata"]
            text = (meta.get("annotations") or {}).get(PREFIX + "allocation")
            node = pod["spec"].get("nodeName")
            assert (text is None) == (node is None), meta["name"]  # a record exactly when bound
            if node:
                records.setdefault(node, []).append((f"{meta['namespace']}/{meta['name']}", text))
        assert sum(len(r) for r in records.values()) == 18
        expected = {}
        for name, recs in records.items():
            state, problems = rebuild(parse_node(apiserver.node(name)), recs)
            assert problems == []
            assert all(u.compute_milli <= MILLI and u.shares <= 3 for u in state.usage)
            expected[name] = state
        # both replicas' views converge on the API server's records
        deadline = time.monotonic() + 10
        for server in servers:
            cache = server.extender.cache
            while any(cache.state(n) != s for n, s in expected.items()) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert all(cache.state(n) == s for n, s in expected.items())
        for client in clients:
            client.close()
    finally:
        for server in servers:
            server.stop()
            server.extender.stop()
