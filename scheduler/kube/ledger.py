"""The per-node ledger: the object whose compare-and-set serialises binds to one node across replicas.

A ConfigMap ``gpuslice-node-<node>`` in gpuslice's namespace, ``data.ledger`` = JSON
``{"<namespace>/<pod>": {"uid", "record", "phase", "time"}}``: every pod holding or acquiring
a share on the node, as of the last bind. Writes carry the resourceVersion that was read,
so of two replicas deciding against the same ledger only the first write lands; the
other gets 409 Conflict, re-reads and decides again. The ledger is also the source of truth of
what gpuslice bound: only gpuslice writes it (in its own namespace), while any namespace can
write its pods' annotations, so a bound record on a pod counts (in a bind's decision, in the
extender's view, at the node agent's handover) only where the ledger holds that pod, by uid,
and then as the ledger has it. Deleting a ledger forgets the binds it held.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from scheduler.core.pods import ALLOCATING, BOUND

from .api import KubeApi
from .errors import ApiProtocolError, ConflictError, KubeError, NotFoundError

log = logging.getLogger("gpuslice.kube.ledger")

PHASES = (ALLOCATING, BOUND)
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpuslice", "app.kubernetes.io/component": "node-ledger"}
_MAX_NAME = 253


def ledger_name(node: str) -> str:
    """``gpuslice-node-<node>``; a name too long for an object is cut and made unique by a hash."""
    name = f"gpuslice-node-{node}"
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:12]
    return f"{name[: _MAX_NAME - 13].rstrip('-.')}-{digest}"


@dataclass(frozen=True, slots=True)
class Entry:
    uid: str
    record: str
    phase: str
    time: str

    def to_json(self) -> dict[str, str]:
        return {"uid": self.uid, "record": self.record, "phase": self.phase, "time": self.time}

    def bound(self) -> Entry:
        """This entry marked bound (itself where it is already)."""
        return self if self.phase == BOUND else replace(self, phase=BOUND)


@dataclass(frozen=True, slots=True)
class Ledger:
    """One read of a node's ledger; ``resource_version`` is None when the ConfigMap does not exist yet."""

    node: str
    resource_version: str | None
    entries: Mapping[str, Entry]


def decode_entries(node: str, text: object) -> dict[str, Entry]:
    """The entries of ``data.ledger``; malformed ones are logged and left out (only gpuslice writes
    the ledger: a malformed entry is damage, and what it held is lost with it).
    """
    if text in (None, ""):
        return {}
    try:
        body = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        body = None
    if not isinstance(body, dict):
        log.warning("ledger of node %s is not a JSON object; starting it afresh", node, extra={"node": node})
        return {}
    entries = {}
    for key, raw in body.items():
        if (
            isinstance(raw, dict)
            and all(isinstance(raw.get(f), str) for f in ("uid", "record", "phase", "time"))
            and raw["phase"] in PHASES
        ):
            entries[key] = Entry(raw["uid"], raw["record"], raw["phase"], raw["time"])
        else:
            log.warning("ledger of node %s: dropping malformed entry %r", node, key, extra={"node": node})
    return entries


def encode_entries(entries: Mapping[str, Entry]) -> str:
    return json.dumps({k: entries[k].to_json() for k in sorted(entries)}, separators=(",", ":"))


def ledger_configmap(namespace: str, prefix: str, node: str, entries: Mapping[str, Entry]) -> dict[str, Any]:
    """The ConfigMap that holds ``node``'s ledger (without a resourceVersion)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": ledger_name(node),
            "namespace": namespace,
            "labels": dict(MANAGED_BY),
            "annotations": {prefix + "node": node},
        },
        "data": {"ledger": encode_entries(entries)},
    }


class LedgerStore:
    """Reads and compare-and-sets node ledgers in one namespace.

    It remembers the last version of each ledger it read or wrote (:meth:`known`), so a caller can
    decide on it without a call. That is safe because every write is a
    compare-and-set on the version read: a remembered ledger that another writer (a replica, the
    sweep of another process, an operator) changed since is refused with a conflict, and the
    caller reads it again from the API server; a caller whose decision on a remembered version
    is "no" must read it again too (the share may have been freed elsewhere). In the common
    case (one replica binding, each node's binds serialised by its lock) a bind then reads no
    ledger at all."""

    def __init__(self, api: KubeApi, namespace: str, prefix: str) -> None:
        self._api = api
        self.namespace = namespace
        self._prefix = prefix
        self._known: dict[str, Ledger] = {}  # node -> the last version read or written here
        self._lock = threading.Lock()

    def known(self, node: str) -> Ledger | None:
        """The version of the node's ledger last read or written here, if any (no call)."""
        with self._lock:
            return self._known.get(node)

    def read(self, node: str) -> Ledger:
        """The node's ledger as the API server has it now."""
        try:
            obj = self._api.get_configmap(self.namespace, ledger_name(node))
        except NotFoundError:
            return self._remember(Ledger(node, None, {}))
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if not isinstance(rv, str) or not rv:
            # Without it the write could not be a compare-and-set.
            raise ApiProtocolError("get configmaps", f"ledger {ledger_name(node)} has no metadata.resourceVersion")
        data = obj.get("data") or {}
        entries = decode_entries(node, data.get("ledger") if isinstance(data, dict) else None)
        return self._remember(Ledger(node, rv, entries))

    def write(self, ledger: Ledger, entries: Mapping[str, Entry]) -> Ledger:
        """Replace the ledger if it is still as read (else :class:`ConflictError`, also where it
        was deleted since); create it if it was absent."""
        body = ledger_configmap(self.namespace, self._prefix, ledger.node, entries)
        try:
            if ledger.resource_version is None:
                obj = self._api.create_configmap(self.namespace, body)
            else:
                body["metadata"]["resourceVersion"] = ledger.resource_version
                obj = self._api.replace_configmap(self.namespace, ledger_name(ledger.node), body)
        except NotFoundError as exc:
            self.forget(ledger.node)
            raise ConflictError(exc.call, 409, "Conflict", f"ledger {ledger_name(ledger.node)} was deleted") from exc
        except KubeError:
            self.forget(ledger.node)  # changed under us, or unknown: read it again next time
            raise
        rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        return self._remember(replace(ledger, resource_version=rv or None, entries=dict(entries)))

    def forget(self, node: str) -> None:
        with self._lock:
            self._known.pop(node, None)

    def _remember(self, ledger: Ledger) -> Ledger:
        with self._lock:
            if ledger.resource_version is None and ledger.entries:
                self._known.pop(ledger.node, None)  # written without a version to compare: never reused
            else:
                self._known[ledger.node] = ledger
        return ledger
