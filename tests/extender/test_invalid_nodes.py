"""A node whose GPU inventory cannot be read is not served, and says so everywhere an operator
looks: the log, /debug/nodes, ``gpuslice inspect``, a metric and a Warning Event on the Node;
every other node keeps working, and the node is served again once fixed."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler.core.k8s import DEVICE_KEYS
from scheduler.extender.client import ExtenderClient
from scheduler.extender.config import load_config
from scheduler.extender.inspection import inspect
from scheduler.extender.problems import INVALID_INVENTORY
from scheduler.extender.server import Server
from scheduler.extender.service import Extender
from scheduler.filebackend import FileBackend
from scheduler.kube import KubeBackend
from tests.fakes import FakeApiServer

from .kit import PREFIX, cluster_file, k8s_node, k8s_pod

PROBLEM = (
    f"node bad: inventory device 0: unknown key 'mdoe' (did you mean 'mode'?); accepted keys: {', '.join(DEVICE_KEYS)}"
)


def misspelt(name: str) -> dict[str, Any]:
    """A node whose inventory says ``mdoe`` for ``mode`` (it used to be served as an exclusive GPU)."""
    node = k8s_node(name, gpus=1)
    inventory = json.loads(node["metadata"]["annotations"][PREFIX + "inventory"])
    inventory["devices"][0]["mdoe"] = inventory["devices"][0].pop("mode")
    node["metadata"]["annotations"][PREFIX + "inventory"] = json.dumps(inventory)
    return node


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def cache_log(restore_logging: None) -> Iterator[Lines]:
    handler = Lines()
    logger = logging.getLogger("gpuslice.cache")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)  # whatever a command run in-process before set
    yield handler


def test_an_invalid_node_is_shown_everywhere_and_gets_no_pods_until_fixed(tmp_path: Path, cache_log: Lines) -> None:
    pod = k8s_pod("p", gpu_fraction="0.5")
    backend = FileBackend(cluster_file(tmp_path / "c.json", misspelt("bad"), k8s_node("good", gpus=1), pod), PREFIX)
    extender = Extender(load_config(env={}, flags={"port": 0}), backend)
    extender.start()
    server = Server(extender).start_in_thread()
    client = ExtenderClient(server.url)
    try:
        # the log line, once
        assert [(r.getMessage(), r.__dict__.get("node"), r.__dict__.get("reason")) for r in cache_log.records] == [
            ("node unusable", "bad", PROBLEM)
        ]
        # /debug/nodes
        described = client.get("/debug/nodes/bad")
        assert (described["usable"], described["problem"]) == (False, PROBLEM)
        # gpuslice inspect
        text = inspect(server.url)
        assert text.splitlines()[1].split() == ["bad", "-", "INVALID", "-", "-", "-", "-"]
        assert text.splitlines()[-1] == f"bad: not served until fixed: {PROBLEM}"
        # the metric
        metrics = client.request("GET", "/metrics")[1].decode()
        assert 'gpuslice_node_inventory_invalid{node="bad"} 1.0' in metrics
        assert 'node="good"} 1.0' not in metrics.split("gpuslice_node_inventory_invalid", 1)[1]
        # the Node event (the file backend keeps it)
        assert backend.events == [
            (
                "bad",
                INVALID_INVENTORY,
                f"gpuslice places no pods on this node until its GPU inventory is fixed: {PROBLEM}",
            )
        ]
        # no pod on it; the other node keeps working
        result = client.filter(pod, ["bad", "good"])
        assert result["NodeNames"] == ["good"]
        assert result["FailedAndUnresolvableNodes"] == {"bad": PROBLEM}
        assert client.bind(pod, "bad") == f"node bad: {PROBLEM}"
        assert client.bind(pod, "good") == ""
        # fixed: served again, the metric clears, no second event
        backend.put_node(k8s_node("bad", gpus=1))
        assert client.get("/debug/nodes/bad")["usable"] is True
        metrics = client.request("GET", "/metrics")[1].decode()
        assert "gpuslice_node_inventory_invalid{" not in metrics
        assert len(backend.events) == 1
        assert client.filter(k8s_pod("q", gpu_fraction="0.5"), ["bad", "good"])["NodeNames"] == ["bad", "good"]
    finally:
        client.close()
        server.stop()
        extender.stop()


def test_in_a_cluster_the_node_gets_a_warning_event() -> None:
    with FakeApiServer() as api:
        api.put_node(misspelt("bad"))
        api.put_node(k8s_node("good", gpus=1))
        extender = Extender(load_config(env={}, flags={"port": 0}), KubeBackend.from_url(api.url, prefix=PREFIX))
        extender.start()
        try:
            deadline = time.monotonic() + 10
            while not api.events() and time.monotonic() < deadline:
                time.sleep(0.02)
            (event,) = api.events()
            assert event["metadata"]["namespace"] == "default"
            assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "bad", "uid": "bad"}
            assert (event["type"], event["reason"]) == ("Warning", INVALID_INVENTORY)
            assert event["message"].endswith(PROBLEM)
        finally:
            extender.stop()
