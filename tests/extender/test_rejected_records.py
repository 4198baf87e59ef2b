"""A record the extender does not count (a forged one claiming a GPU another record holds, one
naming a GPU the node lacks) is refused with its reason: a Warning Event on the Node when the
refusal is new, and ``gpuslice_records_rejected{node}``."""

from __future__ import annotations

from pathlib import Path

from scheduler.core.allocation import Allocation, DeviceShare
from scheduler.core.inventory import SharingMode
from scheduler.extender.client import ExtenderClient
from scheduler.extender.config import load_config
from scheduler.extender.problems import RECORD_REJECTED
from scheduler.extender.server import Server
from scheduler.extender.service import Extender
from scheduler.filebackend import FileBackend

from .kit import PREFIX, cluster_file, k8s_node, k8s_pod
from .test_cache import with_record


def mps(node: str, index: int, memory: int, uuid: str = "") -> Allocation:
    return Allocation(node, (DeviceShare(uuid or f"{node}-gpu{index}", index, SharingMode.MPS, memory, 100),), 0, 0)


def test_a_refused_record_is_a_node_event_and_a_metric(tmp_path: Path) -> None:
    first = with_record(k8s_pod("first"), mps("a", 0, 60000), node="a")
    backend = FileBackend(cluster_file(tmp_path / "c.json", k8s_node("a", gpus=2), first), PREFIX)
    extender = Extender(load_config(env={}, flags={"port": 0}), backend)
    extender.start()
    server = Server(extender).start_in_thread()
    client = ExtenderClient(server.url)
    try:
        assert backend.events == []
        # 60000 MiB more of the same 81920 MiB GPU, and a GPU the node does not have
        backend.put_pod(with_record(k8s_pod("greedy"), mps("a", 0, 60000), node="a"))
        backend.put_pod(with_record(k8s_pod("elsewhere"), mps("a", 1, 1000, uuid="GPU-not-here"), node="a"))
        events = [(node, reason) for node, reason, _ in backend.events]
        assert events == [("a", RECORD_REJECTED)] * 2
        messages = [m for _, _, m in backend.events]
        assert "default/greedy: conflicts on node a" in messages[0]
        assert "default/elsewhere" in messages[1] and "GPU-not-here" in messages[1]
        metrics = client.request("GET", "/metrics")[1].decode()
        assert 'gpuslice_records_rejected{node="a"} 2.0' in metrics
        # an unrelated change on the node says nothing again
        backend.put_pod(with_record(k8s_pod("small"), mps("a", 1, 1000), node="a"))
        assert len(backend.events) == 2
    finally:
        server.stop()
        extender.stop()
