"""``gpuslice agent --demo``: the node agent without a cluster, on the packaged fake GPUs.

A local stand-in plays the API server (this node's Node object and the pods bound to it, in
memory) and the kubelet (it calls Allocate as kubelet would, for one container). The demo shows
what the agent publishes (the inventory annotation) and the GPU units it advertises, one
admission (the pod's allocation record in, the CDI devices and environment handed to its
container out), and its ``/metrics``, served on 127.0.0.1 at a free port; then it exits.
"""

from __future__ import annotations

import importlib.resources
import json
import logging
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from .agent import Agent, share_ids
from .cluster import Json, ObjectRef
from .config import AgentConfig
from .gpus import Gpus
from .http import Health, MetricsServer
from .mps import MpsDaemons, SubprocessRunner

DEMO_POD = "demo/notebook"
DEMO_GPU = 2  # the fake node's time-sliced T4: a share needs no MPS daemon to be handed over
DEMO_MEMORY_MIB = 3840
DEMO_COMPUTE_MILLI = 250
METRIC_PREFIXES = ("gpuslice_agent_", "gpuslice_share_", "gpuslice_gpu_")


class LocalCluster:
    """The API server's side of the agent, in memory: this node, the pods bound to it, the
    Events recorded (:class:`~.cluster.NodeCluster`)."""

    def __init__(self, node: str) -> None:
        self.node: dict[str, Any] = {"kind": "Node", "metadata": {"name": node, "annotations": {}}}
        self.pods: dict[str, Json] = {}
        self.events: list[tuple[str, str, str]] = []
        self._on_change: Callable[[str, Json | None], None] | None = None

    def get_node(self) -> Json:
        return self.node

    def set_node_annotations(self, annotations: Mapping[str, str | None]) -> None:
        current = self.node["metadata"]["annotations"]
        for key, value in annotations.items():
            if value is None:
                current.pop(key, None)
            else:
                current[key] = value

    def list_pods(self) -> list[Json]:
        return list(self.pods.values())

    def follow_pods(self, on_change: Callable[[str, Json | None], None]) -> None:
        self._on_change = on_change
        for key, obj in self.pods.items():
            on_change(key, obj)

    def put_pod(self, key: str, obj: Json) -> None:
        self.pods[key] = obj
        if self._on_change is not None:
            self._on_change(key, obj)

    def event(self, about: ObjectRef, kind: str, reason: str, message: str) -> None:
        self.events.append((kind, reason, message))

    def evict(self, pod: ObjectRef) -> None:
        self.pods.pop(f"{pod.namespace}/{pod.name}", None)

    def bound_records(self) -> Mapping[str, tuple[str, str]] | None:
        return None  # no per-node ledger here, as with a cluster file: the records are checked on their own

    def stop(self) -> None:
        self._on_change = None


def demo_pod(config: AgentConfig, gpu_uuid: str) -> Json:
    """A pod as gpuslice's bind leaves it: bound to this node, its record naming a time-slicing
    share of GPU :data:`DEMO_GPU`, one container asking for the agent's extended resource."""
    namespace, name = DEMO_POD.split("/")
    record = {
        "cpuMilli": 1000,
        "devices": [
            {
                "computeMilli": DEMO_COMPUTE_MILLI,
                "index": DEMO_GPU,
                "memoryMiB": DEMO_MEMORY_MIB,
                "mig": None,
                "mode": "time-slicing",
                "uuid": gpu_uuid,
            }
        ],
        "memoryMiB": 4096,
        "node": config.node,
        "timestamp": "2025-01-01T12:00:00Z",
    }
    return {
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": "5e0d7c00-0004-4f00-8000-000000000001",
            "annotations": {
                config.prefix + "allocation": json.dumps(record, separators=(",", ":")),
                config.prefix + "bind-phase": "bound",
            },
        },
        "spec": {
            "nodeName": config.node,
            "containers": [{"name": "main", "resources": {"limits": {config.resource: "1"}}}],
        },
        "status": {"phase": "Pending"},
    }


def run_demo(config: AgentConfig, gpus: Gpus, say: Callable[[str], None] = print) -> None:
    """Start the agent on ``gpus`` against a :class:`LocalCluster`, admit one pod, read
    ``/metrics``, stop. Everything it shows goes through ``say``."""
    cluster = LocalCluster(config.node)
    runner = SubprocessRunner()
    mps = MpsDaemons(config.mps, runner)
    agent = Agent(config, gpus, cluster, mps, runner)
    health = Health(config.poll_s, lambda: 0.0)
    server = MetricsServer(agent.measure.registry, health, "127.0.0.1", 0).start()
    try:
        agent.start()
        _show_inventory(cluster, config, say)
        if config.units_resource:
            say(f"advertised to the kubelet ({config.units_resource}, a second device plugin): {agent.gpu_units()}")
        uuid = next(g.uuid for g in gpus.devices() if g.index == DEMO_GPU)
        cluster.put_pod(DEMO_POD, demo_pod(config, uuid))
        ids = share_ids(1)
        answer = agent.allocate(ids)
        say("")
        say(f"kubelet: Allocate({', '.join(ids)}) for {DEMO_POD} (its record: GPU {DEMO_GPU} time-slicing, ")
        say(f"         {DEMO_MEMORY_MIB} MiB, {DEMO_COMPUTE_MILLI / 10:g}% compute) -> the agent answers")
        for device in answer.cdi_devices:
            say(f"  CDI device  {device}")
        for name, value in sorted(answer.envs.items()):
            say(f"  env         {name}={value}")
        agent.tick()
        health.started = True
        health.round_done()
        say("")
        url = f"http://127.0.0.1:{server.port}/metrics"
        say(f"GET {url} (gpuslice lines):")
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        for line in text.splitlines():
            if line.startswith(METRIC_PREFIXES):
                say(f"  {line}")
    finally:
        server.stop()
        cluster.stop()
        mps.stop()


def _show_inventory(cluster: LocalCluster, config: AgentConfig, say: Callable[[str], None]) -> None:
    published = cluster.node["metadata"]["annotations"].get(config.prefix + "inventory", "")
    say(f"gpuslice agent demo: node {config.node}, fake GPUs, a local stand-in for the API server and kubelet")
    say("")
    say(f"published on the Node ({config.prefix}inventory):")
    for device in json.loads(published).get("devices", []) if published else []:
        mig = ", ".join(f"{i['profile']}@{i['start']}" for i in device.get("migInstances", []))
        extra = f" MIG instances: {mig}" if mig else ""
        say(f"  GPU {device['index']}  {device['model']:<10} {device['mode']:<13} {device['uuid']}{extra}")


def example_config() -> str:
    """The packaged agent configuration of the example's fake node (scheduler/examples/agent.yaml)."""
    return str(importlib.resources.files("scheduler") / "examples" / "agent.yaml")


def run_demo_agent(config_path: str | None, node: str, fake_gpus: str) -> None:
    """``gpuslice agent --demo``: the configuration given (default: the example's), the fake GPUs
    given (default: the example's), warnings and errors only in the log."""
    from .config import load_config
    from .main import open_gpus

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    config = load_config(config_path or example_config(), node, {})
    gpus = open_gpus(fake_gpus)
    try:
        run_demo(config, gpus)
    finally:
        gpus.close()


__all__ = ["LocalCluster", "demo_pod", "example_config", "run_demo", "run_demo_agent"]
