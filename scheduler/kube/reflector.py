"""List + watch of one resource, reported as :class:`~scheduler.backend.Change` s.

A reflector lists (page by page), reports every object that is new or changed since
the last list and a deletion for every object that vanished, then watches from the
list's resourceVersion. When the server ends a watch (its timeout) the watch resumes
from the last resourceVersion seen; on ``410 Gone`` it relists at once; on any other
error it relists after a jittered, doubling backoff. It counts as broken from the
first error until a new watch is accepted, which is what ``ready()`` looks at.
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Callable, Mapping
from typing import Any

from scheduler.backend import Change, Kind

from .api import KubeApi, WatchStream
from .clock import Clock
from .errors import ApiProtocolError, GoneError, KubeError, status_error
from .options import KubeOptions

log = logging.getLogger("gpuslice.kube.watch")

RESOURCE_OF = {Kind.NODE: "nodes", Kind.POD: "pods", Kind.QUOTA: "gpuquotas", Kind.LEDGER: "configmaps"}


def object_key(kind: Kind, obj: Mapping[str, Any]) -> str | None:
    """The node name, or ``namespace/name`` for a pod, a quota or a ledger's ConfigMap; None if the
    object has no name."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str) or not meta["name"]:
        return None
    if kind is Kind.NODE:
        return str(meta["name"])
    return f"{meta.get('namespace') or 'default'}/{meta['name']}"


def slim(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """``obj`` without ``metadata.managedFields``, as kube-scheduler's own informers keep objects.

    Nothing here reads who manages which field; a pod that kubelets and controllers update
    carries one field list per manager. The object is not changed in place (a shallow copy
    along the one path)."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or "managedFields" not in meta:
        return obj
    return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


def _version(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("resourceVersion") or "") if isinstance(meta, Mapping) else ""


class Reflector:
    def __init__(
        self,
        api: KubeApi,
        kind: Kind,
        emit: Callable[[Change], None],
        options: KubeOptions,
        clock: Clock,
        stop: threading.Event,
        rng: random.Random,
        field_selector: str | None = None,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
    ) -> None:
        self.kind = kind
        self.field_selector = field_selector  # the node agent follows only its node's pods
        self.namespace = namespace  # the ledgers: gpuslice's namespace, its ConfigMaps by label
        self.label_selector = label_selector
        self.resource = RESOURCE_OF[kind]
        self._api = api
        self._emit = emit
        self._options = options
        self._clock = clock
        self._stop = stop
        self._rng = rng
        self.known: dict[str, str] = {}  # key -> resourceVersion last reported
        self.broken_since: float | None = None
        self.last_error = ""
        self.relists = 0
        self._stream: WatchStream | None = None

    # ------------------------------------------------------------ list

    def relist(self) -> str:
        """List everything, report what changed and what vanished; return the list's resourceVersion."""
        items: list[Mapping[str, Any]] = []
        token: str | None = None
        version = ""
        while True:
            try:
                page = self._api.list(
                    self.resource,
                    field_selector=self.field_selector,
                    limit=self._options.list_page_size,
                    continue_token=token,
                    namespace=self.namespace,
                    label_selector=self.label_selector,
                )
            except GoneError:
                if token is None:
                    raise
                log.info("list of %s: continue token expired; listing again from the start", self.resource)
                items, token = [], None
                continue
            raw_meta = page.get("metadata")
            meta: Mapping[str, Any] = raw_meta if isinstance(raw_meta, Mapping) else {}
            if token is None:
                version = str(meta.get("resourceVersion") or "")
            raw_items = page.get("items")
            if not isinstance(raw_items, list):
                raise ApiProtocolError(f"list {self.resource}", "response has no 'items' list")
            items.extend(i for i in raw_items if isinstance(i, Mapping))
            token = meta.get("continue") or None
            if not token:
                break
        if not version:
            raise ApiProtocolError(f"list {self.resource}", "response has no metadata.resourceVersion")
        seen = set()
        for obj in items:
            key = object_key(self.kind, obj)
            if key is None:
                log.warning("list of %s: skipping an object without metadata.name", self.resource)
                continue
            seen.add(key)
            rv = _version(obj)
            if self.known.get(key) != rv or not rv:
                self.known[key] = rv
                self._emit(Change(self.kind, key, slim(obj)))
        for key in sorted(set(self.known) - seen):
            del self.known[key]
            self._emit(Change(self.kind, key, None))
        self.relists += 1
        return version

    # ------------------------------------------------------------ watch

    def _apply(self, event: Mapping[str, Any], version: str) -> str:
        kind, obj = event["type"], event["object"]
        if kind == "ERROR":
            code = obj.get("code")
            raise status_error(
                f"watch {self.resource}",
                code if isinstance(code, int) else 500,
                json.dumps(obj),
                str(obj.get("reason") or ""),
            )
        new_version = _version(obj) or version
        if kind == "BOOKMARK":
            return new_version
        key = object_key(self.kind, obj)
        if key is None:
            raise ApiProtocolError(f"watch {self.resource}", f"{kind} event for an object without metadata.name")
        if kind in ("ADDED", "MODIFIED"):
            self.known[key] = _version(obj)
            self._emit(Change(self.kind, key, slim(obj)))
        elif kind == "DELETED":
            if self.known.pop(key, None) is not None:
                self._emit(Change(self.kind, key, None))
        else:
            raise ApiProtocolError(f"watch {self.resource}", f"unknown event type {kind!r}")
        return new_version

    def run(self, version: str) -> None:
        """Follow changes from ``version`` until stopped (the reflector's thread)."""
        backoff = self._options.backoff_initial_s
        must_list = False
        gone_in_a_row = 0
        while not self._stop.is_set():
            try:
                if must_list:
                    version = self.relist()
                    must_list = False
                stream = self._api.watch(
                    self.resource,
                    version,
                    self._options.watch_timeout_s,
                    self._options.watch_read_slack_s,
                    self.field_selector,
                    namespace=self.namespace,
                    label_selector=self.label_selector,
                )
                self._stream = stream
                if self._stop.is_set():
                    stream.close()
                    break
                self.broken_since = None
                backoff = self._options.backoff_initial_s
                for event in stream:
                    version = self._apply(event, version)
                    gone_in_a_row = 0
            except GoneError as exc:
                log.info("watch of %s: %s; relisting", self.resource, exc)
                must_list = True
                gone_in_a_row += 1
                if gone_in_a_row > 1:  # a fresh list was too old at once: do not hammer the server
                    self._stop.wait(self._rng.uniform(0.5, 1.0) * backoff)
            except Exception as exc:  # a KubeError, or a bug: either way relist, and let ready() tell
                if self._stop.is_set():
                    break
                if self.broken_since is None:
                    self.broken_since = self._clock.monotonic()
                self.last_error = str(exc)
                must_list = True
                wait = self._rng.uniform(0.5, 1.0) * backoff
                log.warning(
                    "watch of %s broken (%s); relisting in %.2fs",
                    self.resource,
                    exc,
                    wait,
                    exc_info=not isinstance(exc, KubeError),
                )
                backoff = min(backoff * 2, self._options.backoff_max_s)
                self._stop.wait(wait)
            finally:
                self._stream = None

    def close(self) -> None:
        stream = self._stream
        if stream is not None:
            stream.close()
