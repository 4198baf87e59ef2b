"""Configuration: sources in order, every bad field reported by its path."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.core.errors import ConfigError
from scheduler.core.policies.fgd import Fgd
from scheduler.core.policies.random import Random
from scheduler.extender.config import DEFAULT_MAX_BODY, DEFAULT_PORT, load_config


def test_defaults() -> None:
    config = load_config(env={})
    assert (config.policy.name, config.prefix, config.port, config.host) == (
        "binpack",
        "gpuslice.io/",
        DEFAULT_PORT,
        "127.0.0.1",
    )
    assert config.max_body_bytes == DEFAULT_MAX_BODY == 4 * 1024 * 1024
    assert config.url_prefix == "" and config.scheme == "http"


def test_file_then_environment_then_flags(tmp_path: Path) -> None:
    path = tmp_path / "gpuslice.yaml"
    path.write_text("policy: {name: spread}\nport: 9000\nhost: 0.0.0.0\nurl_prefix: /ext\n")
    env = {"GPUSLICE_PORT": "9100", "GPUSLICE_POLICY": "bestfit", "GPUSLICE_MAX_BODY_BYTES": "65536"}
    config = load_config(path, env, {"port": 9200, "host": None})
    assert config.port == 9200  # flag over environment over file
    assert config.policy.name == "bestfit" and config.max_body_bytes == 65536  # environment over file
    assert config.host == "0.0.0.0" and config.url_prefix == "/ext"  # file over defaults


def test_fgd_workload_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "policy:\n  name: fgd\n  workload:\n"
        "    - {gpu-fraction: '0.5', cpu: 4, weight: 3}\n"
        "    - {gpu-count: '1', weight: 1}\n"
        "    - {mig-profile: 3g.40gb, weight: 1}\n"
    )
    policy = load_config(path, {}).make_policy()
    assert isinstance(policy, Fgd)
    shapes = policy.fragmentation.workload.shapes
    assert [round(p, 2) for _, p in shapes] == [0.6, 0.2, 0.2]  # 3 / 5, 1 / 5, 1 / 5
    assert shapes[0][0].cpu_milli == 4000 and shapes[0][0].gpu.fraction_milli == 500


def test_random_seed() -> None:
    policy = load_config(env={}, flags={"policy": "random"}).make_policy()
    assert isinstance(policy, Random)


def test_every_bad_field_is_reported_by_its_path(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "policy:\n  name: fgd\n  workload:\n    - {gpu-fraction: '0.5', weight: 1}\n"
        "    - {gpu-fraction: '2', weight: 1}\n"
        "prefix: Gpuslice\nport: 70000\nbogus: 1\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(path, {"GPUSLICE_MAX_BODY_BYTES": "12"})
    text = str(info.value)
    for expected in (
        "policy.workload[1]: gpu-fraction: invalid value '2'",
        "prefix: Value error, must be a DNS subdomain followed by '/'",
        "port: Input should be less than or equal to 65535",
        "bogus: Extra inputs are not permitted",
        "max_body_bytes: Input should be greater than or equal to 1024",
    ):
        assert expected in text, text
    assert text.count(str(path)) == 5


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"policy": "nope"}, "policy.name: Value error, unknown policy 'nope'; accepted: "),
        ({"url_prefix": "no-slash"}, "url_prefix: Value error, must be empty or a path"),
        ({"tls_cert": "/nonexistent/cert.pem"}, "tls_cert: Value error, no such file"),
        ({"log_level": "loud"}, "log_level: Input should be 'debug', 'info', 'warning' or 'error'"),
        ({"mps_compute_oversub_pct": 50}, "mps_compute_oversub_pct: Input should be greater than or equal to 100"),
    ],
)
def test_bad_flags(flags: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError, match="invalid configuration") as info:
        load_config(env={}, flags=flags)
    assert expected in str(info.value)


def test_tls_needs_both(tmp_path: Path) -> None:
    cert = tmp_path / "cert.pem"
    cert.write_text("x")
    with pytest.raises(ConfigError, match="tls_cert and tls_key go together"):
        load_config(env={}, flags={"tls_cert": cert})


def test_options_of_another_policy_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("policy: {name: binpack, workload: [{gpu-count: '1', weight: 1}], seed: 3}\n")
    with pytest.raises(ConfigError, match=r"policy.seed: not an option of policy binpack; accepted: none"):
        load_config(path, {})


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--config: cannot read"):
        load_config(tmp_path / "missing.yaml", {})
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(bad, {})
