"""The agent's start-up: its configuration, the fake GPU file, NVML without a driver, the command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scheduler.agent.config import load_config
from scheduler.agent.fake import FakeGpus
from scheduler.agent.gpus import GpuError
from scheduler.core.errors import ConfigError
from scheduler.core.inventory import SharingMode
from tests.agent.kit import no_nvml_library, write


def config(tmp: Path, body: Any, node: str = "n1") -> Any:
    return load_config(write(tmp, "agent.yaml", body), node, {})


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"nodes": "x"}, "agent.nodes: unknown key; accepted: node, prefix"),
        ({"sharing": {"mode": "shared"}}, "agent.sharing.mode: 'shared'; accepted: exclusive, mps, time-slicing, mig"),
        ({"sharing": {"replicas": 0}}, "agent.sharing.replicas: must be a whole number 1..64, got 0"),
        ({"sharing": {"migStrategy": "auto"}}, "agent.sharing.migStrategy: 'auto'; accepted: dynamic, static"),
        ({"gpus": {"first": {}}}, "agent.gpus.first: keys are GPU indices"),
        ({"gpus": {"0": {"colour": 1}}}, "agent.gpus.0.colour: unknown key"),
        ({"resource": "share"}, "agent.resource: 'share' must be an extended resource name"),
        ({"mps": {"daemon": "mine"}}, "agent.mps.daemon: 'mine'; accepted: auto, agent, external"),
        ({"mps": {"defaultThreadPercentage": 150}}, "agent.mps.defaultThreadPercentage: must be a whole number 1..100"),
        ({"shareSlots": "many"}, "agent.shareSlots: must be a whole number 1..4096, got 'many'"),
        ({"pollSeconds": 0}, "agent.pollSeconds: must be a number of seconds in (0, 600], got 0"),
        ({"cdiRefresh": "nvidia-ctk cdi generate"}, "agent.cdiRefresh: must be a command as a list of strings"),
        (
            {"oversubscription": {"mpsComputePct": 50}},
            "agent.oversubscription.mpsComputePct: must be a whole number >= 100",
        ),
        ({"nvidiaDevicePluginConfig": "/nonexistent/config.yaml"}, "nvidiaDevicePluginConfig: cannot read"),
        ({"metrics": {"port": 70000}}, "agent.metrics.port: must be a whole number 0..65535, got 70000"),
        ({"metrics": {"path": "/m"}}, "agent.metrics.path: unknown key; accepted: address, port"),
        ({"measure": {"publishSeconds": 0}}, "agent.measure.publishSeconds: must be a number of seconds in (0, 3600]"),
        ({"measure": {"strayRoundMiB": 0}}, "agent.measure.strayRoundMiB: must be a whole number 1..65536, got 0"),
        ({"measure": {"procroot": "/proc"}}, "agent.measure.procroot: unknown key; accepted: procRoot"),
        ({"overrun": {"action": "kill"}}, "agent.overrun.action: 'kill'; accepted: report, evict"),
        ({"overrun": {"namespaces": {"team-a": "delete"}}}, "agent.overrun.namespaces.team-a: 'delete'; accepted"),
        (
            {"overrun": {"namespaces": {"Team_A": "evict"}}},
            "agent.overrun.namespaces: 'Team_A' is not a namespace name",
        ),
        ({"overrun": {"namespaces": ["team-a"]}}, "agent.overrun.namespaces: must be a mapping of namespace"),
        ({"overrun": {"graceSeconds": -5}}, "agent.overrun.graceSeconds: must be a number of seconds in (0, 86400]"),
        ({"overrun": {"toleranceMiB": 1.5}}, "agent.overrun.toleranceMiB: must be a whole number >= 0, got 1.5"),
    ],
)
def test_a_bad_field_is_named_with_what_is_accepted(tmp_path: Path, body: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config(tmp_path, body)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_measuring_settings_and_their_defaults(tmp_path: Path) -> None:
    default = load_config(None, "n1", {})
    assert (default.metrics.port, default.overrun.action, default.overrun.grace_s) == (9402, "report", 60.0)
    assert default.overrun.action_for("team-a") == "report"  # report only, unless configured
    body = {
        "overrun": {"action": "report", "namespaces": {"batch": "evict"}, "graceSeconds": 5},
        "metrics": {"port": 0},
    }
    settings = config(tmp_path, body)
    assert settings.overrun.action_for("batch") == "evict" and settings.overrun.action_for("prod") == "report"
    assert settings.metrics.port == 0 and settings.overrun.grace_s == 5.0


def test_the_node_name_comes_from_the_flag_the_file_or_the_environment(tmp_path: Path) -> None:
    assert config(tmp_path, {"node": "from-file"}, node="").node == "from-file"
    assert config(tmp_path, {"node": "from-file"}, node="flag").node == "flag"
    assert load_config(None, "", {"NODE_NAME": "env"}).node == "env"
    with pytest.raises(ConfigError, match=r"agent\.node: no node name"):
        load_config(None, "", {})


def test_the_nvidia_device_plugins_sharing_config_sets_the_modes(tmp_path: Path) -> None:
    plugin = {
        "version": "v1",
        "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}},
    }
    settings = config(tmp_path, {"nvidiaDevicePluginConfig": write(tmp_path, "dp.yaml", plugin)})
    assert (settings.sharing.mode, settings.sharing.replicas) == (SharingMode.TIME_SLICING, 4)
    mps = {"sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 10, "devices": [1]}]}}}
    settings = config(
        tmp_path, {"nvidiaDevicePluginConfig": write(tmp_path, "dp.yaml", mps), "gpus": {"2": {"mode": "mps"}}}
    )
    assert settings.sharing.mode is SharingMode.EXCLUSIVE
    assert (settings.sharing_of(1).mode, settings.sharing_of(1).mps_client_limit) == (SharingMode.MPS, 10)
    assert settings.sharing_of(2).mode is SharingMode.MPS


@pytest.mark.parametrize(
    ("gpus", "message"),
    [
        ([{"model": "B300"}], "gpus[0].model: 'B300' is not a catalogue model"),
        ([{"model": "L4", "mig": True}], "gpus[0].mig: must be true or false (true only for a MIG-capable model)"),
        (
            [{"model": "A100-80GB", "mig": True, "instances": [{"profile": "3g.40gb", "start": 2}]}],
            "gpus[0].instances[0]: '3g.40gb' at 2: 3g.40gb cannot start at slot 2",
        ),
        ([{"model": "L4", "colour": "red"}], "gpus[0].colour: unknown key"),
        ([{"model": "L4", "nvlink": "all"}], "gpus[0].nvlink: must be a list of whole numbers"),
        ([{"model": "L4", "processes": [{"pid": 1, "smPercent": 150}]}], "gpus[0].processes[0].smPercent: 0..100"),
        ([{"model": "L4", "processes": [{"pid": 1, "memory": 5}]}], "gpus[0].processes[0].memory: unknown key"),
    ],
)
def test_a_bad_fake_gpu_file_is_named(gpus: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        FakeGpus.from_mapping({"gpus": gpus}, "fake.yaml")
    assert message in str(caught.value)


def test_the_packaged_example_loads() -> None:
    gpus = FakeGpus.load("example")
    assert [g.name for g in gpus.devices()] == ["NVIDIA A100-80GB", "NVIDIA L4", "NVIDIA T4"]
    (made,) = gpus.mig_instances(gpus.devices()[0].uuid)
    assert made.start == 6
    (process,) = gpus.processes(gpus.devices()[0].uuid)
    assert (process.pid, process.used_memory_mib, process.instance_uuid) == (4242, 2048, made.uuid)


def test_nvml_without_a_driver_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from scheduler.agent.nvml import NvmlGpus

    no_nvml_library(monkeypatch)
    with pytest.raises(GpuError) as raised:
        NvmlGpus()
    assert str(raised.value) == "NVML is not available (no NVIDIA driver here?): NVML Shared Library Not Found"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    code = "from scheduler.cli import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, "agent", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_command_prints_the_example_inventory_without_a_cluster() -> None:
    done = run_cli("--fake-gpus", "example", "--node", "gpu-1", "--dry-run")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert [d["model"] for d in body["devices"]] == ["A100-80GB", "L4", "T4"]
    assert body["devices"][0]["migTaken"][0]["start"] == 6


def test_the_command_reports_bad_configuration_in_one_line(tmp_path: Path) -> None:
    done = run_cli(
        "--fake-gpus", "example", "--node", "n", "--config", write(tmp_path, "a.yaml", {"sharing": {"mode": "x"}})
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "gpuslice agent: agent.sharing.mode: 'x'; accepted: exclusive, mps, time-slicing, mig"
    ]


def test_every_key_is_in_the_docs_table() -> None:
    from scheduler.agent.config import _TOP_KEYS

    docs = (Path(__file__).resolve().parents[2] / "docs" / "node-agent.md").read_text(encoding="utf-8")
    import re

    first_cells = [line.split("|")[1] for line in docs.splitlines() if line.startswith("| `")]
    documented = {name for cell in first_cells for name in re.findall(r"`([A-Za-z]+)`", cell)}
    assert set(_TOP_KEYS) - documented == set()


def test_the_gpu_units_resource_is_on_by_default_and_checked(tmp_path: Path) -> None:
    assert load_config(None, "n1", {}).units_resource == "gpuslice.io/gpu-units"
    assert config(tmp_path, {"unitsResource": ""}).units_resource == ""  # not advertised
    for bad in ("units", "gpuslice.io/share"):
        with pytest.raises(ConfigError, match=r"agent\.unitsResource: .* other than agent\.resource"):
            config(tmp_path, {"unitsResource": bad})
