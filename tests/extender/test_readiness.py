"""Readiness is true: the port opens before the backend's first sync, and until that sync is in
/readyz answers 503 and every verb answers "not ready" (an answer would be a guess); then 200.
A first sync that fails stops the service with the reason."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from scheduler.core.errors import GpusliceError
from scheduler.extender.client import ExtenderClient
from scheduler.extender.config import load_config
from scheduler.extender.run import Service, SyncError
from scheduler.filebackend import FileBackend

from .kit import PREFIX, cluster_file, k8s_node, k8s_pod

NOT_READY = "gpuslice is not ready: the cluster state is not synced yet"


class Gated(FileBackend):
    """A cluster file whose first sync waits until :meth:`release` (or fails, if told to)."""

    def __init__(self, path: Path, fail: str = "") -> None:
        super().__init__(path, PREFIX)
        self.gate = threading.Event()
        self.fail = fail

    def release(self) -> None:
        self.gate.set()

    def start(self, on_change: Any) -> None:
        assert self.gate.wait(10)
        if self.fail:
            raise GpusliceError(self.fail)
        super().start(on_change)


def running(backend: Gated) -> tuple[Service, threading.Thread, dict[str, Any]]:
    service = Service(load_config(env={}, flags={"port": 0}), backend, "a test")
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["status"] = service.run()
        except SyncError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return service, thread, outcome


def wait_for(check: Any, what: str) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_not_ready_before_the_first_sync_then_ready(tmp_path: Path) -> None:
    pod = k8s_pod("p", gpu_fraction="0.5")
    backend = Gated(cluster_file(tmp_path / "c.json", k8s_node("a", gpus=1), pod))
    service, thread, _ = running(backend)
    client = ExtenderClient(service.url)
    try:
        # the port answers at once: alive, not ready
        assert client.request("GET", "/healthz") == (200, b"ok")
        assert client.request("GET", "/readyz") == (503, NOT_READY.encode())
        refused = client.filter(pod, ["a"])
        assert (refused["Error"], refused["NodeNames"], refused["Nodes"]) == (NOT_READY, None, None)
        assert client.prioritize(pod, ["a"]) == []
        assert client.bind(pod, "a") == NOT_READY
        preempted = client.post("preempt", {"Pod": pod, "NodeNameToMetaVictims": {"a": {"Pods": []}}})
        assert not preempted["NodeNameToMetaVictims"]  # no candidates
        assert backend.pods()["default/p"]["spec"].get("nodeName") is None  # nothing was bound
        backend.release()
        wait_for(lambda: client.request("GET", "/readyz")[0] == 200, "ready after the sync")
        assert client.filter(pod, ["a"])["NodeNames"] == ["a"]
        assert client.bind(pod, "a") == ""
    finally:
        client.close()
        service.stop()
        thread.join(10)


def test_a_failed_first_sync_stops_the_service_with_the_reason(tmp_path: Path) -> None:
    backend = Gated(cluster_file(tmp_path / "c.json", k8s_node("a", gpus=1)), fail="the API server said no")
    service, thread, outcome = running(backend)
    client = ExtenderClient(service.url)
    try:
        assert client.request("GET", "/readyz")[0] == 503  # listening, not ready
    finally:
        client.close()
    backend.release()
    thread.join(10)
    assert not thread.is_alive()
    assert str(outcome["error"]) == "first sync with a test failed: the API server said no"


def test_the_verbs_answer_not_ready_with_the_header(tmp_path: Path) -> None:
    backend = Gated(cluster_file(tmp_path / "c.json", k8s_node("a", gpus=1)))
    service, thread, _ = running(backend)
    client = ExtenderClient(service.url)
    try:
        for verb in ("filter", "prioritize", "bind", "preempt"):
            conn = client._connection()
            conn.request("POST", f"/{verb}", body=b"{}", headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            assert (response.status, response.getheader("X-Gpuslice-Error")) == (200, NOT_READY), verb
    finally:
        client.close()
        backend.release()
        service.stop()
        thread.join(10)
