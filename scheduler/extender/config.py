"""``gpuslice serve`` configuration: defaults < YAML file (``--config``) < environment
(``GPUSLICE_*``) < flags. Validated once at start-up; every bad field is reported by
its path (``policy.workload[1].gpu-fraction: ...``) in one :class:`ConfigError`.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from scheduler.core.defrag import PlanOptions
from scheduler.core.errors import ConfigError
from scheduler.core.policies import REGISTRY, Policy, make_policy, options_of
from scheduler.core.policies.options import unknown_options
from scheduler.core.request import DEFAULT_PREFIX

from . import config_errors
from .defaults import DEFAULT_PORT

DEFAULT_MAX_BODY = 4 * 1024 * 1024
# kube-scheduler calls the extender from its own container in gpuslice's pod: over loopback.
DEFAULT_TRUSTED_NETWORKS = ("127.0.0.0/8", "::1/128")
ENV_PREFIX = "GPUSLICE_"
NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # a Kubernetes namespace name (DNS label)
NAMESPACE_ACCEPTED = "a namespace name (lower-case letters, digits and '-')"


def _underscored(value: Any) -> Any:
    """Option keys as the dataclasses name them: ``gpu-fraction`` is ``gpu_fraction``."""
    if isinstance(value, Mapping):
        return {str(k).replace("-", "_"): _underscored(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_underscored(v) for v in value]
    return value


class OptionErrors(ValueError):
    """Bad options of a policy, each as (path under the policy, message)."""

    def __init__(self, lines: list[tuple[str, str]]) -> None:
        self.lines = lines
        super().__init__("; ".join(f"{path}: {message}" for path, message in lines))


def policy_options(name: str, given: Mapping[str, Any]) -> Any:
    """``given`` validated as the options dataclass of policy ``name`` (:class:`OptionErrors`
    naming each bad field by its path, and the accepted fields for an unknown one)."""
    kind = options_of(name)
    unknown = unknown_options(kind, given)
    if unknown:
        raise OptionErrors(
            [
                (
                    config_errors.dotted(loc),
                    f"not an option of policy {name}"
                    + (f" (did you mean {near!r}?)" if near else "")
                    + f"; accepted: {', '.join(accepted) or 'none'}",
                )
                for loc, accepted, near in unknown
            ]
        )
    values = _underscored(given)
    try:
        return TypeAdapter(kind).validate_python(values)
    except ValidationError as exc:
        raise OptionErrors(
            [(_alias_path(err["loc"]), err["msg"].removeprefix("Value error, ")) for err in exc.errors()]
        ) from None


class PolicyConfig(BaseModel):
    """The policy pods get unless they name another (``name``), its options beside the name
    (see each policy's options), and the options of policies pods may name (``policies``)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = "fgd-reserve"
    policies: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in REGISTRY:
            raise ValueError(f"unknown policy {value!r}; accepted: {', '.join(sorted(REGISTRY))}")
        return value

    @field_validator("policies")
    @classmethod
    def _each(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for name, given in value.items():
            if name not in REGISTRY:
                raise ValueError(f"unknown policy {name!r}; accepted: {', '.join(sorted(REGISTRY))}")
            policy_options(name, given or {})
        return value

    @model_validator(mode="after")
    def _options(self) -> PolicyConfig:
        policy_options(self.name, self.model_extra or {})
        return self

    def options_for(self, name: str) -> Any:
        """The validated options of policy ``name``: its own, else those under ``policies``."""
        if name == self.name:
            return policy_options(name, self.model_extra or {})
        return policy_options(name, self.policies.get(name) or {})


class KubeSettings(BaseModel):
    """The Kubernetes backend's settings (``scheduler.kube.KubeOptions``); unset ones keep its defaults.

    A pod left with an allocation record but no Binding (a bind interrupted by a crash or a
    lost answer) is cleaned within ``stale_allocation_s + sweep_interval_s``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace: str | None = None  # where the node ledgers live
    request_timeout_s: float | None = Field(None, gt=0, le=300)
    stale_allocation_s: float | None = Field(None, gt=0)
    sweep_interval_s: float | None = Field(None, gt=0)
    conflict_retries: int | None = Field(None, gt=0, le=1000)
    watch_timeout_s: int | None = Field(None, gt=0, le=3600)  # each watch ends after this; resumed

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str | None) -> str | None:
        if value is not None and not NAMESPACE.fullmatch(value):
            raise ValueError(f"must be {NAMESPACE_ACCEPTED}, got {value!r}")
        return value

    def options(self) -> dict[str, Any]:
        """The settings given, as ``KubeBackend`` keyword options."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


class DefragSettings(BaseModel):
    """Defragmentation (``gpuslice defrag``, ``/debug/defrag``): which pods may move, and how far
    a plan goes. Only controller-owned pods (not a DaemonSet's, not static pods) in
    ``namespaces`` ever move; with none listed, nothing does."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespaces: tuple[str, ...] = ()
    max_evictions: int = Field(8, ge=0, le=1000)
    min_fall_milli: float = Field(500.0, ge=0)
    max_pending: int = Field(64, ge=0, le=10_000)

    @field_validator("namespaces")
    @classmethod
    def _namespaces(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not NAMESPACE.fullmatch(name):
                raise ValueError(f"{name!r} is not {NAMESPACE_ACCEPTED}")
        return tuple(dict.fromkeys(value))

    def options(self) -> PlanOptions:
        return PlanOptions(
            max_evictions=self.max_evictions, min_fall_milli=self.min_fall_milli, max_pending=self.max_pending
        )


class ServeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: PolicyConfig = PolicyConfig()
    prefix: str = DEFAULT_PREFIX
    mps_compute_oversub_pct: int = Field(100, ge=100, le=1000)
    ts_memory_oversub_pct: int = Field(100, ge=100, le=1000)
    url_prefix: str = ""
    host: str = "127.0.0.1"
    port: int = Field(DEFAULT_PORT, ge=0, le=65535)
    tls_cert: Path | None = None
    tls_key: Path | None = None
    max_body_bytes: int = Field(DEFAULT_MAX_BODY, ge=1024, le=1024**3)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # None: text when stderr is a terminal (a person reads it), JSON lines otherwise (a pipeline does)
    log_format: Literal["text", "json"] | None = None
    # After prioritize, the node ranked first is held for the pod this long (seconds) or until
    # its bind arrives: the pods kube-scheduler filters before that bind see the share taken.
    hold_s: float = Field(10.0, ge=0, le=60, allow_inf_nan=False)
    kube: KubeSettings = KubeSettings()
    # Where the extender verbs (filter, prioritize, bind, preempt) and /debug may be called from;
    # anyone else gets 403. The webhook, /metrics and the probes answer everyone.
    trusted_networks: tuple[str, ...] = DEFAULT_TRUSTED_NETWORKS
    defrag: DefragSettings = DefragSettings()

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?/", value):
            raise ValueError(f"must be a DNS subdomain followed by '/', such as gpuslice.io/, got {value!r}")
        return value

    @field_validator("url_prefix")
    @classmethod
    def _url_prefix(cls, value: str) -> str:
        value = value.rstrip("/")
        if value and not re.fullmatch(r"(/[A-Za-z0-9._~-]+)+", value):
            raise ValueError(f"must be empty or a path such as /gpuslice, got {value!r}")
        return value

    @field_validator("trusted_networks")
    @classmethod
    def _networks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for network in value:
            try:
                ipaddress.ip_network(network)
            except ValueError:
                raise ValueError(
                    f"{network!r} is not a network; accepted: CIDRs such as 127.0.0.0/8, ::1/128, 10.0.0.0/8"
                ) from None
        return value

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            if not re.fullmatch(
                r"(?=.{1,253}$)[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*", value
            ):
                raise ValueError(
                    f"{value!r} is not an address to listen on; accepted: an IP address such as 127.0.0.1, "
                    "0.0.0.0 or ::, or a host name"
                ) from None
        return value

    @field_validator("tls_cert", "tls_key")
    @classmethod
    def _readable(cls, value: Path | None) -> Path | None:
        if value is not None:
            if not value.is_file():
                raise ValueError(f"no such file: {value}")
            if not os.access(value, os.R_OK):
                raise ValueError(f"cannot read {value}: permission denied")
        return value

    @model_validator(mode="after")
    def _tls_pair(self) -> ServeConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key (--tls-cert, --tls-key) go together: give both or neither")
        if self.tls_cert is not None and self.tls_key is not None:
            import ssl

            try:
                ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(self.tls_cert, self.tls_key)
            except (ssl.SSLError, OSError) as exc:
                raise ValueError(
                    f"tls_cert {self.tls_cert} and tls_key {self.tls_key} cannot serve TLS ({exc}); accepted: a PEM "
                    "certificate and the PEM private key that matches it"
                ) from None
        return self

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert else "http"

    def make_policy(self, name: str | None = None) -> Policy:
        """Policy ``name`` (default: the configured one) with its configured options."""
        chosen = name or self.policy.name
        return make_policy(chosen, self.policy.options_for(chosen))


# Environment variables and the config field each sets ("policy" sets policy.name).
ENV_FIELDS = {
    "POLICY": "policy",
    "PREFIX": "prefix",
    "MPS_COMPUTE_OVERSUB_PCT": "mps_compute_oversub_pct",
    "TS_MEMORY_OVERSUB_PCT": "ts_memory_oversub_pct",
    "URL_PREFIX": "url_prefix",
    "HOST": "host",
    "PORT": "port",
    "TLS_CERT": "tls_cert",
    "TLS_KEY": "tls_key",
    "MAX_BODY_BYTES": "max_body_bytes",
    "LOG_LEVEL": "log_level",
    "LOG_FORMAT": "log_format",
}


# What planning reads of the service's settings (``gpuslice defrag``): the rest (address, TLS,
# trusted networks) is the server's, and is ignored there; ``kube`` says where the ledgers live.
PLANNING_FIELDS = frozenset(
    {"policy", "prefix", "mps_compute_oversub_pct", "ts_memory_oversub_pct", "log_level", "log_format"}
    | {"defrag", "kube"}
)


def load_config(
    file: Path | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
    only: frozenset[str] | None = None,
) -> ServeConfig:
    """Merge the sources and validate; ConfigError lists every bad field, each by where it
    was set (``--port``, ``GPUSLICE_PORT`` or ``FILE: port``), its value and what is accepted.

    ``only``: the top-level fields to read from the file and the environment (the others keep
    their defaults): a job that plans reads the service's file without its certificate paths."""
    data: dict[str, Any] = {}
    origins: dict[tuple[str, ...], str] = {}  # path -> where it was set, when not in the file
    if file is not None:
        try:
            loaded = yaml.safe_load(file.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"--config {str(file)!r}: cannot read: {exc.strerror or exc}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"--config {str(file)!r}: not YAML: {' '.join(str(exc).split())}") from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(
                f"--config {str(file)!r}: must hold a mapping of settings; accepted keys: "
                + ", ".join(config_errors.keys(ServeConfig))
            )
        data = dict(loaded or {})
        if isinstance(data.get("policy"), str):
            data["policy"] = {"name": data["policy"]}
    if only is not None:
        data = {k: v for k, v in data.items() if k in only}
    environ = os.environ if env is None else env
    for suffix, name in ENV_FIELDS.items():
        if only is not None and name not in only:
            continue
        value = environ.get(ENV_PREFIX + suffix)
        if value is not None and value != "":
            origins[_set(data, name, value)] = ENV_PREFIX + suffix
    for name, value in (flags or {}).items():
        if value is not None:
            origins[_set(data, name, value)] = "--" + name.replace("_", "-")  # the flag of that name
    try:
        return ServeConfig.model_validate(data)
    except ValidationError as exc:
        lines: list[str] = []
        for err in exc.errors(include_url=False):
            loc = tuple(err["loc"])
            cause = (err.get("ctx") or {}).get("error")
            if isinstance(cause, OptionErrors):  # a policy's options, each by its own path
                where = _where(loc, origins, file)
                lines.extend(f"{where}.{path}: {message}" for path, message in cause.lines)
            else:
                lines.append(config_errors.explain(err, ServeConfig, _where(loc, origins, file)))
        if len(lines) == 1:
            raise ConfigError(lines[0]) from None
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines)) from None


def _alias_path(loc: tuple[int | str, ...]) -> str:
    """A path as the file writes it: a policy option ``gpu_fraction`` is ``gpu-fraction``."""
    return config_errors.dotted(
        tuple(p.replace("_", "-") if isinstance(p, str) and p.startswith(("gpu_", "mig_")) else p for p in loc)
    )


def _where(loc: tuple[int | str, ...], origins: Mapping[tuple[str, ...], str], file: Path | None) -> str:
    """Where the value at ``loc`` was set: a flag, an environment variable, or the file."""
    if not loc:
        return ""
    found = origins.get(tuple(str(p) for p in loc))
    if found is not None:
        return found
    path = config_errors.dotted(loc)
    return f"{file}: {path}" if file is not None else path


def _set(data: dict[str, Any], name: str, value: Any) -> tuple[str, ...]:
    """Set the field ``name`` ("policy" sets policy.name); the path set."""
    if name == "policy":
        policy = data.get("policy")
        data["policy"] = dict(policy, name=value) if isinstance(policy, dict) else {"name": value}
        return ("policy", "name")
    data[name] = value
    return (name,)
