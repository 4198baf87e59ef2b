"""``gpuslice agent``: build the agent from its configuration and run it until SIGTERM.

The composition root hands in ``connect``, which builds the cluster side (the Kubernetes
implementation lives in ``scheduler.kube.nodeapi``); the agent itself never imports it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from scheduler.core.errors import GpusliceError
from scheduler.core.k8s import inventory_annotation

from .agent import Agent
from .cluster import NodeCluster
from .config import AgentConfig, load_config
from .fake import FakeGpus
from .gpus import Gpus
from .http import Health, MetricsServer
from .inventory import build_node
from .mps import MpsDaemons, SubprocessRunner
from .plugin import DevicePlugin, PluginError

log = logging.getLogger("gpuslice.agent")


def open_gpus(fake: str | None) -> Gpus:
    """The fake GPUs of a YAML file (``example``: the packaged one), else NVML."""
    if fake:
        return FakeGpus.load(fake)
    from .nvml import NvmlGpus

    return NvmlGpus()


def hardware_inventory(config: AgentConfig, gpus: Gpus) -> str:
    """The inventory the hardware gives, before the agent has made anything (``--dry-run``)."""
    devices = gpus.devices()
    instances = {g.uuid: gpus.mig_instances(g.uuid) for g in devices if g.mig_enabled}
    peers = {g.uuid: gpus.nvlink_peers(g.uuid) for g in devices}
    node, warnings = build_node(config, devices, instances, set(), {}, peers)
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    return inventory_annotation(node)


def run_agent(
    config_path: str | None,
    node: str,
    fake_gpus: str | None,
    dry_run: bool,
    connect: Callable[[AgentConfig], NodeCluster] | None,
    stop: threading.Event | None = None,
) -> None:
    """Run the agent until ``stop`` (or SIGTERM). Bad configuration, or GPUs or a cluster that
    cannot be reached at start, raise a GpusliceError whose message says what and why."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = load_config(config_path, node, os.environ)
    gpus = open_gpus(fake_gpus)
    try:
        if dry_run:
            print(json.dumps(json.loads(hardware_inventory(config, gpus)), indent=2))
            return
        if connect is None:
            raise GpusliceError("no cluster to connect to (use --dry-run to print the inventory without one)")
        _serve(config, gpus, connect(config), stop or threading.Event())
    finally:
        gpus.close()


def _serve(config: AgentConfig, gpus: Gpus, cluster: NodeCluster, stop: threading.Event) -> None:
    from .podresources import KubeletPodResources

    runner = SubprocessRunner()
    mps = MpsDaemons(config.mps, runner)
    pod_resources = KubeletPodResources(config.pod_resources_socket) if config.pod_resources_socket else None
    agent = Agent(config, gpus, cluster, mps, runner, pod_resources)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    plugins = [DevicePlugin(agent)]
    if config.units_resource:
        plugins.append(DevicePlugin(agent, units=True))
    health = Health(config.poll_s, time.monotonic)
    server = None
    if config.metrics.port:
        server = MetricsServer(agent.measure.registry, health, config.metrics.address, config.metrics.port).start()
        log.info("serving /metrics, /healthz and /readyz on %s:%d", config.metrics.address, server.port)
    try:
        agent.start()
        cluster.follow_pods(agent.on_pod)
        health.started = True
        said = ""  # the plugin's last problem: logged once, then only when it changes
        while not stop.is_set():
            agent.tick()
            health.round_done()
            try:
                for plugin in plugins:
                    plugin.check()
                said = ""
            except PluginError as exc:
                if str(exc) != said:
                    log.warning("%s; trying again every %.0fs (logged again only if it changes)", exc, config.poll_s)
                said = str(exc)
            stop.wait(config.poll_s)
    finally:
        if server is not None:
            server.stop()
        for plugin in plugins:
            plugin.stop()
        cluster.stop()
        mps.stop()
