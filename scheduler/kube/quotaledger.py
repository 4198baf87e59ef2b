"""The per-namespace quota ledger: the compare-and-set that serialises binds of one namespace
with a GPU quota across replicas.

A ConfigMap ``gpuslice-quota-<namespace>`` in gpuslice's namespace, ``data.ledger`` in the
node ledgers' format (:mod:`.ledger`): the pods of the namespace acquiring a share that are not
yet seen bound. A bind in a namespace with a quota, once its node's ledger holds its share:

1. reads the namespace's ledger and lists the namespace's pods;
2. hands ``admit`` the records of the live pods that hold a share (bound by gpuslice) and of
   the entries still acquiring (their pod alive, of the same uid, not yet bound, and younger
   than ``stale_allocation_s``), with the allocation decided;
3. writes the ledger with the pod's entry, guarded by the resourceVersion read. 409 -> again.

Why no namespace goes over: every pod of the namespace that holds a share either shows its
record on the pod (it is bound), or has an entry here (written before its Binding, kept until
the pod is seen bound). Of two binds deciding against the same read, only the first write
lands; the second reads again and sees the first. Binds of namespaces without a quota never
come here, and cost nothing more.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from scheduler.backend import Admit, PodRef
from scheduler.core.allocation import Allocation, encode_record
from scheduler.core.pods import ALLOCATING, has_ended, holding_record, key_of, uid_of

from .api import KubeApi
from .clock import Clock, parse_rfc3339
from .errors import ApiProtocolError, ConflictError, NotFoundError
from .ledger import MANAGED_BY, Entry, decode_entries, encode_entries
from .options import KubeOptions

log = logging.getLogger("gpuslice.kube.quota")

LABELS = {**MANAGED_BY, "app.kubernetes.io/component": "quota-ledger"}


def quota_ledger_name(namespace: str) -> str:
    """``gpuslice-quota-<namespace>`` (a namespace name is at most 63 characters: it fits)."""
    return f"gpuslice-quota-{namespace}"


class QuotaLedgers:
    def __init__(self, api: KubeApi, options: KubeOptions, clock: Clock, pause: Callable[[int], None]) -> None:
        self._api = api
        self._options = options
        self._clock = clock
        self._pause = pause

    def _read(self, namespace: str) -> tuple[str | None, dict[str, Entry]]:
        try:
            obj = self._api.get_configmap(self._options.namespace, quota_ledger_name(namespace))
        except NotFoundError:
            return None, {}
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if not isinstance(rv, str) or not rv:
            raise ApiProtocolError("get configmaps", f"{quota_ledger_name(namespace)} has no metadata.resourceVersion")
        data = obj.get("data") or {}
        return rv, decode_entries(namespace, data.get("ledger") if isinstance(data, Mapping) else None)

    def _write(self, namespace: str, version: str | None, entries: Mapping[str, Entry]) -> None:
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": quota_ledger_name(namespace),
                "namespace": self._options.namespace,
                "labels": dict(LABELS),
            },
            "data": {"ledger": encode_entries(entries)},
        }
        if version is None:
            self._api.create_configmap(self._options.namespace, body)
        else:
            body["metadata"]["resourceVersion"] = version
            self._api.replace_configmap(self._options.namespace, quota_ledger_name(namespace), body)

    def _pods(self, namespace: str) -> dict[str, Mapping[str, Any]]:
        listed = self._api.list("pods", field_selector=f"metadata.namespace={namespace}")
        items = listed.get("items")
        return {
            key_of(p): p
            for p in (items if isinstance(items, list) else [])
            if isinstance(p, Mapping) and not has_ended(p)
        }

    def _acquiring(self, entry: Entry, live: Mapping[str, Any] | None) -> bool:
        """Whether an entry still stands for a share its pod is acquiring (not yet seen bound)."""
        if live is None or uid_of(live) != entry.uid or holding_record(live, self._options.prefix) is not None:
            return False
        started = parse_rfc3339(entry.time)
        return started is not None and self._clock.now() - started <= timedelta(
            seconds=self._options.stale_allocation_s
        )

    def admit(self, pod: PodRef, alloc: Allocation, stamp: str, admit: Admit) -> str | None:
        """Ask ``admit`` about ``alloc`` against the namespace as it stands, and write the pod's
        entry by compare-and-set; None once written, else why not."""
        namespace = pod.namespace
        for attempt in range(self._options.conflict_retries):
            version, entries = self._read(namespace)
            live = self._pods(namespace)
            records = {
                k: text
                for k, p in live.items()
                if k != pod.key and (text := holding_record(p, self._options.prefix)) is not None
            }
            kept = {k: e for k, e in entries.items() if k != pod.key and self._acquiring(e, live.get(k))}
            for k, e in kept.items():
                records.setdefault(k, e.record)
            refused = admit(sorted(records.items()), alloc)
            if refused is not None:
                return refused
            kept[pod.key] = Entry(pod.uid, encode_record(alloc, stamp), ALLOCATING, stamp)
            try:
                self._write(namespace, version, kept)
                return None
            except ConflictError:
                self._pause(attempt)
        return f"the quota ledger of namespace {namespace} changed under {self._options.conflict_retries} attempts"

    def release(self, pod: PodRef) -> None:
        """Drop the pod's entry (its bind was undone); best effort: a stale entry ages out."""
        for attempt in range(self._options.conflict_retries):
            try:
                version, entries = self._read(pod.namespace)
                entry = entries.get(pod.key)
                if entry is None or entry.uid != pod.uid:
                    return
                self._write(pod.namespace, version, {k: e for k, e in entries.items() if k != pod.key})
                return
            except ConflictError:
                self._pause(attempt)
