"""``KubeBackend``: the :class:`~scheduler.backend.Backend` of a live cluster.

    backend = KubeBackend.from_environment()                 # in-cluster, else ~/.kube/config
    backend = KubeBackend.from_kubeconfig("kubeconfig.yaml", context="prod", namespace="gpuslice")
    backend = KubeBackend.from_url("http://127.0.0.1:8001")  # kubectl proxy, or a test's fake server
    backend.start(on_change)   # returns after the first full list of nodes and pods
    backend.bind(PodRef(ns, name, uid), node, decide)
    backend.sweep()            # what the sweeper thread does every sweep_interval_s

Options are :class:`~scheduler.kube.options.KubeOptions` fields, by keyword.
"""

from __future__ import annotations

import logging
import os
import random
import threading
from collections.abc import Callable, Mapping
from typing import Any

from scheduler.backend import Admit, BindResult, Change, Decide, Kind, PodRef
from scheduler.core.pods import annotations_of, has_ended, node_of, uid_of

from .api import KubeApi
from .binder import LEDGER_SELECTOR, POD_OUTPUT_KEYS, Binder, Sweep, WatchedPod
from .clock import SYSTEM_CLOCK, Clock
from .errors import KubeError, NotFoundError
from .events import NODE_EVENTS_NAMESPACE, node_event
from .ledger import decode_entries, ledger_name
from .options import KubeOptions
from .reflector import Reflector

log = logging.getLogger("gpuslice.kube")


def ledger_change(change: Change, prefix: str, nodes: dict[str, str]) -> Change:
    """A ledger ConfigMap's change as the node's :data:`Kind.LEDGER` change: pod key -> uid, record.
    ``nodes`` remembers each ConfigMap's node, for its deletion (which carries no object)."""
    obj = change.obj
    if obj is None:
        return Change(Kind.LEDGER, nodes.pop(change.key, ""), None)
    meta = obj.get("metadata")
    notes = meta.get("annotations") if isinstance(meta, Mapping) else None
    node = notes.get(prefix + "node") if isinstance(notes, Mapping) else None
    if not isinstance(node, str) or not node:
        node = ""  # not one of ours after all (the label alone): it vouches for nothing
    nodes[change.key] = node
    data = obj.get("data")
    entries = decode_entries(node, data.get("ledger") if isinstance(data, Mapping) else None) if node else {}
    return Change(Kind.LEDGER, node, {k: {"uid": e.uid, "record": e.record} for k, e in entries.items()})


class KubeBackend:
    bind_waits = True  # compare-and-set, patches and the Binding: calls to the API server
    keeps_ledgers = True  # the node ledgers (ConfigMaps gpuslice-node-<node>), followed by a watch

    def __init__(
        self,
        api: KubeApi,
        options: KubeOptions | None = None,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
    ) -> None:
        self.api = api
        self.options = options or KubeOptions()
        self._clock = clock
        self._rng = rng or random.Random()
        self._stop = threading.Event()
        self._emit_lock = threading.Lock()
        self._reflectors: list[Reflector] = []
        self._threads: list[threading.Thread] = []
        self._synced = False
        self._ledger_nodes: dict[str, str] = {}  # ledger ConfigMap key -> its node
        self._output_keys = tuple(self.options.prefix + k for k in POD_OUTPUT_KEYS)
        self._pods: dict[str, WatchedPod] = {}  # pod key -> the pod as watched (live ones: not ended)
        self._binder = Binder(api, self.options, clock, self._rng, self._ledger_absent, self._pods.get)

    # ------------------------------------------------------------ construction

    @classmethod
    def from_url(
        cls,
        url: str,
        token: str | None = None,
        ca_file: str | None = None,
        verify_tls: bool = True,
        *,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
        **options: Any,
    ) -> KubeBackend:
        opts = KubeOptions.build(**options)
        return cls(KubeApi.from_url(url, token, ca_file, verify_tls, opts.request_timeout_s), opts, clock, rng)

    @classmethod
    def from_kubeconfig(
        cls,
        path: str | None = None,
        context: str | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
        **options: Any,
    ) -> KubeBackend:
        opts = KubeOptions.build(**options)
        return cls(KubeApi.from_kubeconfig(path, context, opts.request_timeout_s), opts, clock, rng)

    @classmethod
    def in_cluster(
        cls, *, clock: Clock = SYSTEM_CLOCK, rng: random.Random | None = None, **options: Any
    ) -> KubeBackend:
        opts = KubeOptions.build(**options)
        return cls(KubeApi.in_cluster(opts.request_timeout_s), opts, clock, rng)

    @classmethod
    def from_environment(cls, kubeconfig: str | None = None, context: str | None = None, **options: Any) -> KubeBackend:
        """A kubeconfig when one is named; else the pod's service account inside a cluster; else the
        default kubeconfig (``$KUBECONFIG`` or ``~/.kube/config``)."""
        if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            return cls.in_cluster(**options)
        return cls.from_kubeconfig(kubeconfig, context, **options)

    @classmethod
    def from_config(cls, kubeconfig: str | None = None, context: str | None = None, **options: Any) -> KubeBackend:
        """What ``gpuslice serve`` calls (``prefix=..., kubeconfig=...``): :meth:`from_environment`."""
        return cls.from_environment(kubeconfig, context, **options)

    # ------------------------------------------------------------ the Backend protocol

    def start(self, on_change: Callable[[Change], None]) -> None:
        if self._reflectors:
            raise RuntimeError("KubeBackend.start() was already called")

        def emit(change: Change) -> None:
            with self._emit_lock:  # one change at a time, in order, whichever thread reports it
                try:
                    on_change(change)
                except Exception:
                    log.exception("on_change failed for %s %s", change.kind, change.key)

        ledgers = Reflector(
            self.api,
            Kind.LEDGER,
            lambda change: emit(self._ledger_change(change)),
            self.options,
            self._clock,
            self._stop,
            self._rng,
            namespace=self.options.namespace,
            label_selector=LEDGER_SELECTOR,
        )
        sinks: tuple[tuple[Kind, Callable[[Change], None]], ...] = (
            (Kind.NODE, emit),
            (Kind.POD, lambda change: emit(self._pod_change(change))),
        )
        self._reflectors = [
            Reflector(self.api, kind, sink, self.options, self._clock, self._stop, self._rng) for kind, sink in sinks
        ]
        # The ledgers first: each pod's bound record is then weighed against them as it arrives.
        ledger_version = self._first_list(ledgers)
        versions = [self._first_list(r) for r in self._reflectors]
        self._reflectors.append(ledgers)
        versions.append(ledger_version)
        quotas = Reflector(self.api, Kind.QUOTA, emit, self.options, self._clock, self._stop, self._rng)
        try:
            versions.append(quotas.relist())
            self._reflectors.append(quotas)
        except NotFoundError:  # no GPUQuota CRD: quotas are not enforced until it is installed and gpuslice restarted
            log.warning("the GPUQuota CRD is not installed (manifests/gpuquota-crd.yaml): no GPU quotas are enforced")
        self._synced = True
        for reflector, version in zip(self._reflectors, versions, strict=True):
            thread = threading.Thread(
                target=reflector.run, args=(version,), daemon=True, name=f"gpuslice-watch-{reflector.resource}"
            )
            thread.start()
            self._threads.append(thread)
        sweeper = threading.Thread(target=self._sweep_loop, daemon=True, name="gpuslice-sweep")
        sweeper.start()
        self._threads.append(sweeper)
        log.info("synced: %d nodes, %d pods", len(self._reflectors[0].known), len(self._reflectors[1].known))

    def _pod_change(self, change: Change) -> Change:
        """``change``, what the binder reads of its pod remembered (while the pod lives)."""
        obj = change.obj
        if obj is not None and not has_ended(obj):
            notes = annotations_of(obj)
            ours = any(key in notes for key in self._output_keys)
            self._pods[change.key] = WatchedPod(uid_of(obj), node_of(obj), ours)
        else:
            self._pods.pop(change.key, None)
        return change

    def _ledger_change(self, change: Change) -> Change:
        return ledger_change(change, self.options.prefix, self._ledger_nodes)

    def _ledger_absent(self, node: str) -> bool:
        """Whether the ledgers' watch, synced, knows no ledger ConfigMap of ``node``."""
        return self._synced and f"{self.options.namespace}/{ledger_name(node)}" not in self._ledger_nodes

    def _first_list(self, reflector: Reflector) -> str:
        deadline = self._clock.monotonic() + self.options.start_timeout_s
        wait = self.options.backoff_initial_s
        while True:
            try:
                return reflector.relist()
            except KubeError as exc:
                if self._stop.is_set() or self._clock.monotonic() + wait > deadline:
                    raise KubeError(
                        "", f"first list of {reflector.resource} failed for {self.options.start_timeout_s:g}s: {exc}"
                    ) from exc
                log.warning("first list of %s failed (%s); retrying in %.2fs", reflector.resource, exc, wait)
                self._stop.wait(wait)
                wait = min(wait * 2, self.options.backoff_max_s)

    def ready(self) -> bool:
        if not self._synced or self._stop.is_set():
            return False
        now = self._clock.monotonic()
        return all(t.is_alive() for t in self._threads) and all(
            r.broken_since is None or now - r.broken_since <= self.options.watch_grace_s for r in self._reflectors
        )

    def problems(self) -> list[str]:
        """Why the watch is broken, per resource (empty when healthy)."""
        return [f"{r.resource}: {r.last_error}" for r in self._reflectors if r.broken_since is not None]

    def stop(self) -> None:
        self._stop.set()
        for reflector in self._reflectors:
            reflector.close()
        for thread in self._threads:
            thread.join(timeout=self.options.request_timeout_s + 1)
        self.api.close()

    def bind(self, pod: PodRef, node: str, decide: Decide, admit: Admit | None = None) -> BindResult:
        return self._binder.bind(pod, node, decide, admit)

    def quota_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """Patch a GPUQuota's status subresource; best effort (the next report tries again)."""
        try:
            self.api.patch_quota_status(namespace, name, status)
        except KubeError as exc:
            log.warning("status of GPUQuota %s/%s not written: %s", namespace, name, exc)

    def node_event(self, node: str, reason: str, message: str) -> None:
        """A Warning Event on the Node, created from a thread of its own: the caller is the
        watch, which must not wait on the API server. Best effort: a failure is logged."""
        body = node_event(node, "Warning", reason, message, self._clock.now())

        def post() -> None:
            try:
                self.api.create_event(NODE_EVENTS_NAMESPACE, body)
            except KubeError as exc:
                log.warning("event about node %s not recorded: %s", node, exc)

        threading.Thread(target=post, name="gpuslice-event", daemon=True).start()

    def sweep(self) -> Sweep:
        """One pass of the cleanup the sweeper thread runs every ``sweep_interval_s``
        (:meth:`Binder.sweep <scheduler.kube.binder.Binder.sweep>`)."""
        return self._binder.sweep()

    def _sweep_loop(self) -> None:
        while not self._stop.wait(self.options.sweep_interval_s):
            try:
                self.sweep()
            except Exception:  # the thread must live on: ready() watches it
                log.exception("sweep failed")
