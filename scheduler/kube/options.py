"""The Kubernetes side's settings, validated once at construction (bad field -> ConfigError with its path)."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

from scheduler.core.errors import ConfigError
from scheduler.core.request import DEFAULT_PREFIX

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/$")


@dataclass(frozen=True, slots=True)
class KubeOptions:
    """How the backend talks to the API server.

    namespace:            where the per-node ledger ConfigMaps live
    prefix:               annotation prefix of requests and records (``gpuslice.io/``)
    request_timeout_s:    limit of one API call (a bind makes about six)
    watch_timeout_s:      the server ends each watch after this long; it is then resumed
    watch_read_slack_s:   a watch silent this long past its timeout is broken (a stall)
    watch_grace_s:        ``ready()`` stays true this long after the watch broke
    backoff_initial_s / backoff_max_s: waits between relists after errors (doubling, jittered)
    start_timeout_s:      ``start()`` gives up if the first full list fails for this long
    list_page_size:       items per list page (``limit`` / ``continue``)
    conflict_retries:     compare-and-set attempts on a node's ledger before a bind gives up
    conflict_backoff_s:   first jittered wait between those attempts (doubling)
    stale_allocation_s:   a ledger entry of a pod still unbound after this long is dropped
    sweep_interval_s:     how often every ledger and every unbound pod's record is checked for what
                          an interrupted bind left behind (stale entries, records without a Binding);
                          such leftovers are gone within stale_allocation_s + sweep_interval_s
    """

    namespace: str = "gpuslice"
    prefix: str = DEFAULT_PREFIX
    request_timeout_s: float = 5.0
    watch_timeout_s: int = 300
    watch_read_slack_s: float = 10.0
    watch_grace_s: float = 30.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    start_timeout_s: float = 60.0
    list_page_size: int = 500
    conflict_retries: int = 10
    conflict_backoff_s: float = 0.02
    stale_allocation_s: float = 60.0
    sweep_interval_s: float = 30.0

    def __post_init__(self) -> None:
        if not _DNS_LABEL.match(self.namespace):
            raise ConfigError(
                f"kube.namespace: {self.namespace!r} is not a namespace name "
                "(lower-case letters, digits and '-', at most 63)"
            )
        if not _PREFIX.match(self.prefix):
            raise ConfigError(
                f"kube.prefix: {self.prefix!r} must be a DNS subdomain followed by '/', such as 'gpuslice.io/'"
            )
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("float", "int"):
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                    raise ConfigError(f"kube.{f.name}: must be a positive number, got {value!r}")
                if f.type == "int" and not isinstance(value, int):
                    raise ConfigError(f"kube.{f.name}: must be a whole number, got {value!r}")

    @classmethod
    def build(cls, **options: Any) -> KubeOptions:
        """Options by name; an unknown name is a ConfigError listing the accepted ones."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigError(f"kube.{unknown[0]}: unknown option; accepted: {', '.join(sorted(known))}")
        return cls(**options)
