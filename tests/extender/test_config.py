"""Configuration: sources in order, every bad field reported by its path."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from scheduler.core.errors import ConfigError
from scheduler.core.policies.fgd import Fgd
from scheduler.core.policies.random import Random
from scheduler.extender.config import DEFAULT_MAX_BODY, DEFAULT_PORT, ServeConfig, load_config


def test_defaults() -> None:
    config = load_config(env={})
    assert (config.policy.name, config.prefix, config.port, config.host) == (
        "fgd-reserve",
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


def test_every_bad_field_is_reported_by_where_it_was_set(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "policy:\n  name: fgd\n  workload:\n    - {gpu-fraction: '0.5', weight: 1}\n"
        "    - {gpu-fraction: '2', weight: 1}\n"
        "prefix: Gpuslice\nport: 70000\nbogus: 1\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(path, {"GPUSLICE_MAX_BODY_BYTES": "12"})
    lines = str(info.value).splitlines()
    assert lines[0] == "invalid configuration:"
    assert sorted(line.strip() for line in lines[1:]) == sorted(
        [
            f"{path}: policy.workload[1]: gpu-fraction: invalid value '2'; accepted: a number in (0, 1], "
            "such as 0.25 or 0.5",
            f"{path}: prefix: must be a DNS subdomain followed by '/', such as gpuslice.io/, got 'Gpuslice'",
            f"{path}: port 70000: accepted: a whole number from 0 to 65535",
            "GPUSLICE_MAX_BODY_BYTES '12': accepted: a whole number from 1024 to 1073741824",
            f"{path}: bogus: unknown key; accepted: {', '.join(ServeConfig.model_fields)}",
        ]
    )


# Each bad value, from a flag, the environment or the file, gets one line: where it was set,
# the value, what is accepted (a file's line starts with the file's name, left out here).
@pytest.mark.parametrize(
    ("source", "key", "value", "message"),
    [
        ("flag", "port", "abc", "--port 'abc': accepted: a whole number from 0 to 65535"),
        ("flag", "port", "-1", "--port '-1': accepted: a whole number from 0 to 65535"),
        ("env", "PORT", "1e9", "GPUSLICE_PORT '1e9': accepted: a whole number from 0 to 65535"),
        ("flag", "policy", "nope", "--policy: unknown policy 'nope'; accepted: bestfit, binpack, dotprod, fgd"),
        ("flag", "url_prefix", "no-slash", "--url-prefix: must be empty or a path such as /gpuslice"),
        ("flag", "host", "not a host", "--host: 'not a host' is not an address to listen on; accepted: an IP"),
        ("flag", "tls_cert", "/nonexistent/cert.pem", "--tls-cert: no such file: /nonexistent/cert.pem"),
        ("flag", "log_level", "loud", "--log-level 'loud': accepted: debug, info, warning or error"),
        ("flag", "log_format", "xml", "--log-format 'xml': accepted: text or json"),
        ("flag", "max_body_bytes", "1.5", "--max-body-bytes '1.5': accepted: a whole number from 1024 to"),
        ("flag", "mps_compute_oversub_pct", "50", "--mps-compute-oversub-pct '50': accepted: a whole number from 100"),
        ("env", "TS_MEMORY_OVERSUB_PCT", "inf", "GPUSLICE_TS_MEMORY_OVERSUB_PCT 'inf': accepted: a whole number"),
        ("file", "prot", "8686", "prot: unknown key (did you mean 'port'?); accepted: policy, prefix,"),
        ("file", "trusted_networks", "10.0.0.0/8", "trusted_networks '10.0.0.0/8': accepted: a list"),
        ("file", "trusted_networks", ["10.0.0.0/33"], "trusted_networks: '10.0.0.0/33' is not a network; accepted:"),
        ("file", "kube", {"namespce": "x"}, "kube.namespce: unknown key (did you mean 'namespace'?); accepted: "),
        ("file", "kube", {"request_timeout_s": "inf"}, "kube.request_timeout_s 'inf': accepted: a number greater"),
        ("file", "kube", 3, "kube 3: accepted: a mapping with the keys namespace, request_timeout_s,"),
        ("file", "kube", {"watch_timeout_s": 0}, "kube.watch_timeout_s 0: accepted: a whole number greater than 0,"),
        ("file", "kube", {"watch_timeout_s": 2.5}, "kube.watch_timeout_s 2.5: accepted: a whole number greater than 0"),
        (
            "file",
            "policy",
            {"name": "fgd", "workload": [{"weight": 1, "gpu-fractoin": "0.5"}]},
            "policy.workload[0].gpu-fractoin: not an option of policy fgd (did you mean 'gpu-fraction'?); accepted: "
            "weight, cpu,",
        ),
    ],
)
def test_a_bad_value_gets_one_line_naming_where_the_value_and_what_is_accepted(
    tmp_path: Path, source: str, key: str, value: object, message: str
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({key: value}) if source == "file" else "{}\n")
    env = {f"GPUSLICE_{key}": str(value)} if source == "env" else {}
    flags = {key: value} if source == "flag" else {}
    with pytest.raises(ConfigError) as info:
        load_config(path, env, flags)
    text = str(info.value)
    assert "\n" not in text
    expected = f"{path}: {message}" if source == "file" else message
    assert text.startswith(expected), text


def test_tls_needs_both(tmp_path: Path) -> None:
    cert = tmp_path / "cert.pem"
    cert.write_text("x")
    with pytest.raises(ConfigError, match=r"tls_cert and tls_key \(--tls-cert, --tls-key\) go together"):
        load_config(env={}, flags={"tls_cert": cert})


def test_options_of_another_policy_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("policy: {name: binpack, workload: [{gpu-count: '1', weight: 1}], seed: 3}\n")
    with pytest.raises(ConfigError, match=r"policy.seed: not an option of policy binpack; accepted: none"):
        load_config(path, {})


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--config '.*missing.yaml': cannot read: No such file"):
        load_config(tmp_path / "missing.yaml", {})
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="must hold a mapping of settings; accepted keys: policy, prefix"):
        load_config(bad, {})
