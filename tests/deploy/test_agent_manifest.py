"""The node agent's DaemonSet agrees with the agent's configuration, the command and the service."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.deploy.manifests import container, find


def daemonset() -> dict[str, Any]:
    return find("DaemonSet", "gpuslice-agent")


def agent_container() -> dict[str, Any]:
    (only,) = daemonset()["spec"]["template"]["spec"]["containers"]
    assert only["name"] == "agent"
    return dict(only)


def mounts() -> dict[str, str]:
    return {m["name"]: m["mountPath"] for m in agent_container()["volumeMounts"]}


def host_paths() -> dict[str, str]:
    volumes = daemonset()["spec"]["template"]["spec"]["volumes"]
    return {v["name"]: v["hostPath"]["path"] for v in volumes if "hostPath" in v}


def test_the_config_map_is_a_valid_agent_configuration_at_the_mounted_paths(tmp_path: Path) -> None:
    from scheduler.agent.config import load_config

    text = find("ConfigMap", "gpuslice-agent-config")["data"]["agent.yaml"]
    (tmp_path / "agent.yaml").write_text(text)
    config = load_config(str(tmp_path / "agent.yaml"), "", {"NODE_NAME": "gpu-1"})
    args = agent_container()["args"]
    assert args[:2] == ["agent", "--config"] and args[2] == f"{mounts()['config']}/agent.yaml"
    # the sockets the agent uses are the kubelet's, mounted at the same paths
    assert mounts()["device-plugins"] == host_paths()["device-plugins"] == config.device_plugin_dir
    pod_resources = str(Path(config.pod_resources_socket).parent)
    assert mounts()["pod-resources"] == host_paths()["pod-resources"] == pod_resources
    assert mounts()["mps"] == host_paths()["mps"] == config.mps.root
    assert str(Path(config.mps.external_pipe_directory)).startswith(mounts()["nvidia-mps"])
    assert config.cdi_refresh[0].startswith(mounts()["toolkit"] + "/")
    assert yaml.safe_load(text)["resource"] == config.resource


def test_the_agent_flags_used_exist() -> None:
    import typer.main

    from scheduler.cli import app

    command = typer.main.get_command(app)
    options = {opt for param in command.commands["agent"].params for opt in param.opts}  # type: ignore[attr-defined]
    assert {a for a in agent_container()["args"] if a.startswith("--")} <= options


def test_the_pod_runs_on_gpu_nodes_with_the_host_pid_namespace_and_knows_its_node() -> None:
    spec = daemonset()["spec"]["template"]["spec"]
    assert spec["hostPID"] is True and spec["hostIPC"] is True
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    env = {e["name"]: e for e in agent_container()["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert (
        daemonset()["spec"]["selector"]["matchLabels"].items()
        <= daemonset()["spec"]["template"]["metadata"]["labels"].items()
    )


def test_the_webhook_adds_the_resource_the_agent_serves() -> None:
    from scheduler.webhook import WebhookConfig

    text = find("ConfigMap", "gpuslice-agent-config")["data"]["agent.yaml"]
    env = {e["name"]: e.get("value") for e in container(find("Deployment", "gpuslice"), "gpuslice")["env"]}
    assert env["GPUSLICE_SHARE_RESOURCE"] == yaml.safe_load(text)["resource"]
    assert WebhookConfig.from_env(env).share_resource == "gpuslice.io/share"


def test_the_metrics_port_and_probes_are_the_ones_the_agent_serves(tmp_path: Path) -> None:
    from scheduler.agent.config import load_config

    text = find("ConfigMap", "gpuslice-agent-config")["data"]["agent.yaml"]
    (tmp_path / "agent.yaml").write_text(text)
    config = load_config(str(tmp_path / "agent.yaml"), "", {"NODE_NAME": "gpu-1"})
    agent = agent_container()
    ports = {p["name"]: p["containerPort"] for p in agent["ports"]}
    assert ports == {"metrics": config.metrics.port} and config.metrics.port > 0
    assert agent["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert agent["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    # the kubelet probes (and Prometheus scrapes) the pod's IP: a loopback-only listener fails them
    assert not daemonset()["spec"]["template"]["spec"].get("hostNetwork", False)
    assert config.metrics.address == "0.0.0.0" and not config.metrics.pod_names
    annotations = daemonset()["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(config.metrics.port)
    assert annotations["prometheus.io/path"] == "/metrics"
    # report only unless the operator says evict
    assert config.overrun.action == "report" and dict(config.overrun.namespaces) == {}
