"""What ``gpuslice defrag`` does in a live cluster: list the node ledgers, nodes and pods it plans
from, and evict pods through the Eviction API (policy/v1), which honours PodDisruptionBudgets.

Every call is in :data:`~scheduler.kube.api.DEFRAG_API_CALLS`, which the ``gpuslice-defrag``
ClusterRole (nodes, pods, ``pods/eviction``) and Role (the ledger ConfigMaps, in gpuslice's
namespace) grant exactly. No watch, no write but evictions: planning needs one consistent look,
and the plan is made again each run. As in the extender, a pod's bound record counts only where
its node's ledger holds it: a record written by hand claims no GPU in the plan.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from scheduler.backend import Change, Kind

from .api import DEFRAG_API_CALLS, KubeApi
from .backend import ledger_change
from .binder import LEDGER_SELECTOR
from .clock import SYSTEM_CLOCK
from .errors import ConflictError, NotFoundError, TooManyRequestsError
from .options import KubeOptions
from .reflector import Reflector


class Outcome(StrEnum):
    EVICTED = "evicted"
    GONE = "gone"  # the pod no longer exists, or was replaced by one of the same name
    REFUSED = "refused"  # a PodDisruptionBudget forbids it now (or the API server throttles)


@dataclass(frozen=True, slots=True)
class Eviction:
    pod: str
    outcome: Outcome
    message: str = ""


class Evictor:
    """The cluster side of ``gpuslice defrag``."""

    keeps_ledgers = True  # like the extender's backend: only records its ledgers hold count

    def __init__(self, api: KubeApi, options: KubeOptions | None = None) -> None:
        api.calls, api.calls_name = DEFRAG_API_CALLS, "DEFRAG_API_CALLS"
        self._api = api
        self._options = options or KubeOptions()

    @classmethod
    def connect(cls, kubeconfig: str | None = None, url: str | None = None, **options: Any) -> Evictor:
        """``url`` (reached without credentials) or a kubeconfig when one is named; else the pod's
        service account inside a cluster; else the default kubeconfig. ``options``:
        :class:`~scheduler.kube.options.KubeOptions` fields (the ledgers' ``namespace``, ...)."""
        opts = KubeOptions.build(**options)
        if url:
            return cls(KubeApi.from_url(url, request_timeout_s=opts.request_timeout_s), opts)
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            return cls(KubeApi.in_cluster(opts.request_timeout_s), opts)
        return cls(KubeApi.from_kubeconfig(kubeconfig, request_timeout_s=opts.request_timeout_s), opts)

    def snapshot(self, on_change: Callable[[Change], None]) -> None:
        """The node ledgers, every node, then every pod, reported through ``on_change`` as a first
        list would be (the ledgers first: each pod's bound record is weighed against them)."""
        stop = threading.Event()
        nodes: dict[str, str] = {}
        Reflector(
            self._api,
            Kind.LEDGER,
            lambda change: on_change(ledger_change(change, self._options.prefix, nodes)),
            self._options,
            SYSTEM_CLOCK,
            stop,
            random.Random(0),
            namespace=self._options.namespace,
            label_selector=LEDGER_SELECTOR,
        ).relist()
        for kind in (Kind.NODE, Kind.POD):
            Reflector(self._api, kind, on_change, self._options, SYSTEM_CLOCK, stop, random.Random(0)).relist()

    def evict(self, key: str, uid: str = "", dry_run: bool = False) -> Eviction:
        """Evict pod ``namespace/name`` (only the pod of ``uid``, when given; with ``dry_run`` the
        API server checks, PodDisruptionBudgets included, and changes nothing). Errors other than
        a refusal or a pod gone are raised (:class:`~scheduler.kube.errors.KubeError`)."""
        namespace, _, name = key.partition("/")
        try:
            self._api.evict_pod(namespace, name, uid, dry_run)
        except TooManyRequestsError as exc:
            return Eviction(key, Outcome.REFUSED, exc.message or str(exc))
        except (NotFoundError, ConflictError) as exc:
            return Eviction(key, Outcome.GONE, exc.message or str(exc))
        return Eviction(key, Outcome.EVICTED)
