"""The defrag CronJob: suspended, nothing opted in, reading the service's settings, restricted."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.deploy.manifests import find


def job_spec() -> dict:  # type: ignore[type-arg]
    spec: dict = find("CronJob", "gpuslice-defrag")["spec"]  # type: ignore[type-arg]
    return spec


def test_it_is_suspended_and_nothing_is_opted_in() -> None:
    assert job_spec()["suspend"] is True
    assert job_spec()["concurrencyPolicy"] == "Forbid"  # never two runs evicting at once
    settings = yaml.safe_load(find("ConfigMap", "gpuslice-config")["data"]["gpuslice.yaml"])
    assert settings["defrag"]["namespaces"] == []


def test_its_flags_exist_and_it_reads_the_mounted_service_file(tmp_path: Path) -> None:
    import typer.main

    from scheduler.cli import app
    from scheduler.extender.config import PLANNING_FIELDS, load_config

    pod = job_spec()["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container["args"]
    command = typer.main.get_command(app).commands["defrag"]  # type: ignore[attr-defined]
    options = {opt for param in command.params for opt in param.opts}
    assert args[0] == "defrag" and {a for a in args[1:] if a.startswith("--")} <= options
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "config"]
    config_path = args[args.index("--config") + 1]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "config"]
    assert volume["configMap"]["name"] == "gpuslice-config"
    (item,) = volume["configMap"]["items"]
    assert config_path == f"{mount['mountPath']}/{item['path']}"
    # the file as mounted: its TLS paths do not exist in this pod, and planning does not read them
    path = tmp_path / item["path"]
    path.write_text(find("ConfigMap", "gpuslice-config")["data"][item["key"]])
    config = load_config(path, {}, {}, only=PLANNING_FIELDS)
    assert config.defrag.max_evictions == 8 and config.tls_cert is None


def test_the_pod_meets_the_restricted_pod_security_standard() -> None:
    pod = job_spec()["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert not {"hostNetwork", "hostPID", "hostIPC"} & set(pod)
    assert all("hostPath" not in v for v in pod["volumes"])
    (container,) = pod["containers"]
    context = container["securityContext"]
    assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"] is True
    assert context["capabilities"]["drop"] == ["ALL"]
    assert container["image"] == find("Deployment", "gpuslice")["spec"]["template"]["spec"]["containers"][0]["image"]
