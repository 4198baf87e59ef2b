"""A small fake Kubernetes API server: real HTTP on 127.0.0.1, in a thread, for integration tests.

It serves the core/v1 calls gpuslice makes (nodes, pods, bindings, configmaps) with the
semantics that matter to a scheduler: one global resourceVersion, lists with ``limit`` /
``continue`` and ``fieldSelector``, watches that stream JSON lines from a resourceVersion,
``409 Conflict`` on a stale ``metadata.resourceVersion`` (update, merge patch) and on a
second Binding, ``410`` for a compacted resourceVersion (an ERROR event in a 200 stream for a watch,
as v1.37 sends it), and faults injected on request. Its failures carry the status, reason and
message the real API server gives (tests/e2e/test_fake_parity.py compares them)::

    with FakeApiServer() as api:                      # listens on a free port
        api.put_node(node_json); api.put_pod(pod_json)
        backend = KubeBackend.from_url(api.url)
        api.fault("create", "pods/binding", status=500)           # the next Binding fails
        api.fault("update", "configmaps", status=409, skip=2)     # the 3rd update conflicts
        api.fault("patch", "pods", delay_s=2.0, status=None)      # slow, then served (a client timeout)
        api.fault("create", "pods/binding", status=504, apply=True)  # done, but the answer is lost
        api.drop_watches()       # cut open watch streams mid-stream (no terminating chunk)
        api.stall_watches()      # watch streams go silent (no events, no end) until unstalled
        api.expire_watches()     # compact history: open watches get an ERROR 410 event, old RVs 410
        api.pod("default", "p")  # a copy of the stored object, or None
        api.fault("get", "pods", status=200, body="not json")     # a garbled answer
        api.served               # {(verb, resource)} pairs served, e.g. ("create", "pods/binding")
        api.requests             # [(verb, resource, name)] in order; api.count(verb, resource)

Verbs are the RBAC verbs (list, watch, get, create, update, patch, delete); resources are
``nodes``, ``pods``, ``pods/binding``, ``pods/eviction`` (policy/v1; ``api.evictions`` lists the
bodies accepted, dry runs aside), ``configmaps``, and ``gpuquotas`` with ``gpuquotas/status``
(gpuslice.io/v1alpha1; ``api.served_quotas = False``: as if the CRD were not installed).
Changes made through the Python
methods (``put_*``, ``delete_*``, ``set_pod_phase``) produce watch events like API writes,
and are not counted in ``served``. Merge and strategic-merge patches are both applied as
JSON merge patches (enough for maps such as annotations).
"""

from __future__ import annotations

import bisect
import contextlib
import copy
import itertools
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

Json = dict[str, Any]

RESOURCES = ("nodes", "pods", "configmaps", "events", "gpuquotas")
LIST_KIND = {
    "nodes": "NodeList",
    "pods": "PodList",
    "configmaps": "ConfigMapList",
    "events": "EventList",
    "gpuquotas": "GPUQuotaList",
}
KIND = {"nodes": "Node", "pods": "Pod", "configmaps": "ConfigMap", "events": "Event", "gpuquotas": "GPUQuota"}
API_VERSION = {"gpuquotas": "gpuslice.io/v1alpha1"}  # the rest: v1
QUOTA_PATH = ["apis", "gpuslice.io", "v1alpha1"]  # the GPUQuota CRD's paths
REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


NO_REASON = "-"  # the API server gives some failures no reason at all (an internal error)
WATCH_EXPIRED = "The resourceVersion for the provided watch is too old."  # etcd's, as v1.37 says it
CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. "
    "You can start a new list without the continue parameter."
)


def status_body(code: int, message: str, reason: str = "") -> Json:
    """A failure's ``Status``, as the API server writes it (tests/e2e/test_fake_parity.py)."""
    body: Json = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message}
    if reason != NO_REASON:
        body["reason"] = reason or REASONS.get(code, "Unknown")
    body["code"] = code
    return body


def conflict(resource: str, name: str, why: str) -> ApiFailure:
    return ApiFailure(409, f'Operation cannot be fulfilled on {resource} "{name}": {why}', "Conflict")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _lookup(obj: Json, path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def _selector(text: str, where: str) -> list[tuple[str, bool, str]]:
    """``a=b,c!=d`` as (path, equal, value) terms."""
    terms = []
    for term in filter(None, (t.strip() for t in text.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            terms.append((key, False, value))
        elif "=" in term:
            key, value = term.split("==", 1) if "==" in term else term.split("=", 1)
            terms.append((key, True, value))
        else:
            if where == "fieldSelector":  # the API server's words
                raise ApiFailure(400, f"invalid selector: {text!r}; can't understand {term!r}")
            raise ApiFailure(400, f"{where} {term!r}: only key=value and key!=value are supported")
    return terms


def _matches(obj: Json, fields: list[tuple[str, bool, str]], labels: list[tuple[str, bool, str]]) -> bool:
    if any((_lookup(obj, path) == value) != equal for path, equal, value in fields):
        return False
    obj_labels = (obj.get("metadata") or {}).get("labels") or {}
    return all((str(obj_labels.get(key, "")) == value) != (not equal) for key, equal, value in labels)


class ApiFailure(Exception):
    def __init__(self, code: int, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason


@dataclass
class Fault:
    """An injected failure for requests matching ``verb`` / ``resource`` / ``name`` (None: any).

    The first ``skip`` matching requests pass; the next ``times`` (None: all) wait ``delay_s``
    and then answer ``status`` (None: served normally after the delay). With ``apply`` the
    request takes effect at once, before the delay and the error (a write whose answer was
    lost, or is slow to come). With
    ``body`` the answer is that raw text, with ``status``, instead of a Status object.
    """

    verb: str | None = None
    resource: str | None = None
    name: str | None = None
    status: int | None = 500
    skip: int = 0
    times: int | None = 1
    delay_s: float = 0.0
    apply: bool = False
    message: str = "injected fault"
    body: str | None = None
    seen: int = 0
    fired: int = 0

    def take(self, verb: str, resource: str, name: str) -> bool:
        if self.verb not in (None, verb) or self.resource not in (None, resource) or self.name not in (None, name):
            return False
        self.seen += 1
        if self.seen <= self.skip or (self.times is not None and self.fired >= self.times):
            return False
        self.fired += 1
        return True


@dataclass(frozen=True)
class Event:
    rv: int
    resource: str
    type: str
    obj: Json


class _Watch:
    def __init__(self, resource: str) -> None:
        self.resource = resource
        self.dropped = False
        self.expired = False


class FakeApiServer:
    """See the module docstring. Thread-safe; every object is stored and returned as JSON dicts."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._objects: dict[str, dict[str, Json]] = {r: {} for r in RESOURCES}
        self.served_quotas = True  # False: as if the GPUQuota CRD were not installed (its paths 404)
        self._events: list[Event] = []
        self._rv = 100
        self._compacted = 0
        self._stalled: set[str] = set()
        self._watches: set[_Watch] = set()
        self._faults: list[Fault] = []
        self._closing = threading.Event()
        self._connections: set[socket.socket] = set()
        self.requests: list[tuple[str, str, str]] = []
        self.authorizations: set[str] = set()  # the Authorization headers seen ("" for none)
        self.evictions: list[Json] = []  # the Eviction bodies accepted
        self._server = ThreadingHTTPServer((host, port), _Handler)
        self._server.daemon_threads = True
        self._server.fake = self  # type: ignore[attr-defined]
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeApiServer:
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-apiserver", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._closing.set()
        with self._changed:
            self._changed.notify_all()
        self._server.shutdown()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ objects, from the test

    def put_node(self, node: Json) -> Json:
        return self._put("nodes", node)

    def put_pod(self, pod: Json) -> Json:
        return self._put("pods", pod)

    def put_quota(self, quota: Json) -> Json:
        return self._put("gpuquotas", quota)

    def quota(self, namespace: str, name: str) -> Json | None:
        return self._copy("gpuquotas", f"{namespace}/{name}")

    def put_configmap(self, configmap: Json) -> Json:
        return self._put("configmaps", configmap)

    def delete_node(self, name: str) -> bool:
        return self._delete("nodes", name)

    def delete_pod(self, namespace: str, name: str) -> bool:
        return self._delete("pods", f"{namespace}/{name}")

    def delete_configmap(self, namespace: str, name: str) -> bool:
        return self._delete("configmaps", f"{namespace}/{name}")

    def set_pod_phase(self, namespace: str, name: str, phase: str) -> Json:
        with self._lock:
            pod = self._require("pods", f"{namespace}/{name}")
            return self._store("pods", merge_patch(pod, {"status": {"phase": phase}}), "MODIFIED")

    def node(self, name: str) -> Json | None:
        return self._copy("nodes", name)

    def objects(self, resource: str) -> list[Json]:
        """Copies of every stored object of one resource (events, say), by key."""
        with self._lock:
            return [copy.deepcopy(o) for _, o in sorted(self._objects[resource].items())]

    def pod(self, namespace: str, name: str) -> Json | None:
        return self._copy("pods", f"{namespace}/{name}")

    def configmap(self, namespace: str, name: str) -> Json | None:
        return self._copy("configmaps", f"{namespace}/{name}")

    def pods(self) -> list[Json]:
        with self._lock:
            return [copy.deepcopy(p) for _, p in sorted(self._objects["pods"].items())]

    def nodes(self) -> list[Json]:
        with self._lock:
            return [copy.deepcopy(n) for _, n in sorted(self._objects["nodes"].items())]

    def events(self) -> list[Json]:
        """The Events created, oldest first."""
        with self._lock:
            return [copy.deepcopy(e) for e in self._objects["events"].values()]

    @property
    def resource_version(self) -> int:
        return self._rv

    # ------------------------------------------------------------ faults and watch control

    def fault(self, verb: str | None = None, resource: str | None = None, **options: Any) -> Fault:
        """Add a :class:`Fault` (checked in the order added; the first that takes a request fires)."""
        fault = Fault(verb, resource, **options)
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def drop_watches(self, resource: str | None = None) -> int:
        """Cut the open watch streams (of ``resource``) without ending them cleanly; returns how many."""
        return self._mark(resource, "dropped")

    def expire_watches(self, resource: str | None = None) -> int:
        """Compact: every resourceVersion so far becomes too old; open watches get an ERROR 410 event."""
        with self._lock:
            self._compacted = self._rv + 1
        return self._mark(resource, "expired")

    def compact(self) -> None:
        """Every resourceVersion so far becomes too old (a new watch or continue from one gets 410)."""
        with self._lock:
            self._compacted = self._rv + 1

    def stall_watches(self, resource: str | None = None, stalled: bool = True) -> None:
        """Watches (of ``resource``) send nothing, not even their end, until unstalled."""
        with self._changed:
            for r in [resource] if resource else list(RESOURCES):
                (self._stalled.add if stalled else self._stalled.discard)(r)
            self._changed.notify_all()

    def open_watches(self, resource: str | None = None) -> int:
        with self._lock:
            return sum(1 for w in self._watches if resource in (None, w.resource))

    @property
    def served(self) -> set[tuple[str, str]]:
        with self._lock:
            return {(verb, resource) for verb, resource, _ in self.requests}

    def count(self, verb: str, resource: str) -> int:
        with self._lock:
            return sum(1 for v, r, _ in self.requests if (v, r) == (verb, resource))

    # ------------------------------------------------------------ storage

    def _mark(self, resource: str | None, flag: str) -> int:
        with self._changed:
            hit = [w for w in self._watches if resource in (None, w.resource)]
            for w in hit:
                setattr(w, flag, True)
            self._changed.notify_all()
        return len(hit)

    def _copy(self, resource: str, key: str) -> Json | None:
        with self._lock:
            obj = self._objects[resource].get(key)
            return copy.deepcopy(obj) if obj is not None else None

    def _require(self, resource: str, key: str) -> Json:
        obj = self._objects[resource].get(key)
        if obj is None:
            name = key.rsplit("/", 1)[-1]
            raise ApiFailure(404, f'{resource} "{name}" not found')
        return obj

    @staticmethod
    def _key(resource: str, obj: Json) -> str:
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise ApiFailure(422, f"{KIND[resource]}: metadata.name is required")
        if resource == "nodes":
            return name
        return f"{meta.get('namespace') or 'default'}/{name}"

    def _store(self, resource: str, obj: Json, event: str) -> Json:
        """Save ``obj`` under a new resourceVersion and record the watch event (lock held)."""
        self._rv += 1
        obj = copy.deepcopy(obj)
        obj.setdefault("apiVersion", API_VERSION.get(resource, "v1"))
        obj.setdefault("kind", KIND[resource])
        meta = obj.setdefault("metadata", {})
        if resource != "nodes":
            meta.setdefault("namespace", "default")
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", "2024-01-01T00:00:00Z")
        meta["resourceVersion"] = str(self._rv)
        key = self._key(resource, obj)
        if event == "DELETED":
            self._objects[resource].pop(key, None)
        else:
            self._objects[resource][key] = obj
        self._events.append(Event(self._rv, resource, event, copy.deepcopy(obj)))
        self._changed.notify_all()
        return copy.deepcopy(obj)

    def _put(self, resource: str, obj: Json) -> Json:
        with self._lock:
            key = self._key(resource, obj)
            old = self._objects[resource].get(key)
            obj = copy.deepcopy(obj)
            obj.get("metadata", {}).pop("resourceVersion", None)
            if old is not None:
                obj["metadata"].setdefault("uid", old["metadata"]["uid"])
            return self._store(resource, obj, "ADDED" if old is None else "MODIFIED")

    def _delete(self, resource: str, key: str) -> bool:
        with self._lock:
            old = self._objects[resource].get(key)
            if old is None:
                return False
            self._store(resource, old, "DELETED")
            return True

    def _take_fault(self, verb: str, resource: str, name: str) -> Fault | None:
        with self._lock:
            self.requests.append((verb, resource, name))
            return next((f for f in self._faults if f.take(verb, resource, name)), None)

    # ------------------------------------------------------------ the API, per verb

    def list(self, resource: str, namespace: str | None, query: dict[str, str]) -> Json:
        fields = _selector(query.get("fieldSelector", ""), "fieldSelector")
        labels = _selector(query.get("labelSelector", ""), "labelSelector")
        with self._lock:
            rv = self._rv
            items = [
                copy.deepcopy(o)
                for k, o in sorted(self._objects[resource].items())
                if (namespace is None or k.startswith(namespace + "/")) and _matches(o, fields, labels)
            ]
        offset = 0
        if query.get("continue"):
            try:
                token_rv, offset = (int(x) for x in query["continue"].split(":"))
            except ValueError as exc:
                raise ApiFailure(400, f"continue token {query['continue']!r} is malformed") from exc
            if token_rv < self._compacted:
                raise ApiFailure(410, CONTINUE_EXPIRED, "Expired")
            rv = token_rv
        limit = int(query.get("limit") or 0)
        meta: Json = {"resourceVersion": str(rv)}
        if limit and offset + limit < len(items):
            meta["continue"] = f"{rv}:{offset + limit}"
            items = items[offset : offset + limit]
        else:
            items = items[offset:]
        for item in items:  # list items carry no kind / apiVersion, as the API server serves them
            item.pop("kind", None)
            item.pop("apiVersion", None)
        return {"kind": LIST_KIND[resource], "apiVersion": "v1", "metadata": meta, "items": items}

    def create_configmap(self, namespace: str, body: Json) -> Json:
        with self._lock:
            body = copy.deepcopy(body)
            meta = body.setdefault("metadata", {})
            meta["namespace"] = namespace
            key = self._key("configmaps", body)
            if key in self._objects["configmaps"]:
                raise ApiFailure(409, f'configmaps "{meta["name"]}" already exists', "AlreadyExists")
            meta.pop("resourceVersion", None)
            meta.pop("uid", None)
            return self._store("configmaps", body, "ADDED")

    def update(self, resource: str, namespace: str, name: str, body: Json) -> Json:
        with self._lock:
            old = self._require(resource, f"{namespace}/{name}")
            body = copy.deepcopy(body)
            meta = body.setdefault("metadata", {})
            if meta.get("name", name) != name:
                raise ApiFailure(400, f"the name of the object ({meta.get('name')}) does not match the URL ({name})")
            self._precondition(resource, name, old, meta.get("resourceVersion"))
            meta.update(
                name=name,
                namespace=namespace,
                uid=old["metadata"]["uid"],
                creationTimestamp=old["metadata"].get("creationTimestamp"),
            )
            return self._store(resource, body, "MODIFIED")

    def patch_node(self, name: str, patch: Any) -> Json:
        with self._lock:
            old = self._require("nodes", name)
            if not isinstance(patch, dict):
                raise ApiFailure(400, "a merge patch must be a JSON object")
            return self._store("nodes", merge_patch(old, patch), "MODIFIED")

    def patch_status(self, resource: str, namespace: str, name: str, patch: Any) -> Json:
        """A status subresource's merge patch: only ``status`` changes."""
        with self._lock:
            old = self._require(resource, f"{namespace}/{name}")
            new = copy.deepcopy(old)
            new["status"] = merge_patch(old.get("status") or {}, (patch or {}).get("status") or {})
            return self._store(resource, new, "MODIFIED")

    def patch_pod(self, namespace: str, name: str, patch: Any) -> Json:
        with self._lock:
            old = self._require("pods", f"{namespace}/{name}")
            if not isinstance(patch, dict):
                raise ApiFailure(400, "a merge patch must be a JSON object")
            self._precondition("pods", name, old, (patch.get("metadata") or {}).get("resourceVersion"))
            new = merge_patch(old, patch)
            for field in ("name", "namespace", "uid"):
                value = new.get("metadata", {}).get(field)
                if value != old["metadata"].get(field):
                    raise ApiFailure(
                        422,
                        f'Pod "{name}" is invalid: metadata.{field}: Invalid value: "{value}": field is immutable',
                        "Invalid",
                    )
            return self._store("pods", new, "MODIFIED")

    def _precondition(self, resource: str, name: str, old: Json, rv: object) -> None:
        if rv not in (None, "") and rv != old["metadata"]["resourceVersion"]:
            raise conflict(
                resource,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            )

    def bind(self, namespace: str, name: str, body: Json) -> Json:
        with self._lock:
            pod = self._require("pods", f"{namespace}/{name}")
            meta = body.get("metadata") or {}
            target = body.get("target") or {}
            if not target.get("name"):
                raise ApiFailure(500, "target.name: Required value", NO_REASON)  # v1.37: no 422
            if meta.get("uid") and meta["uid"] != pod["metadata"]["uid"]:
                raise conflict(
                    "pods",
                    name,
                    f"StorageError: invalid object, Code: 4, Key: /registry/pods/{namespace}/{name}, "
                    f"ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: UID in precondition: "
                    f"{meta['uid']}, UID in object meta: {pod['metadata']['uid']}",
                )
            node = (pod.get("spec") or {}).get("nodeName")
            if node:
                raise conflict("pods/binding", name, f'pod {name} is already assigned to node "{node}"')
            patch: Json = {"spec": {"nodeName": target["name"]}}
            if meta.get("annotations"):  # the API server copies a Binding's annotations onto the pod
                patch["metadata"] = {"annotations": dict(meta["annotations"])}
            self._store("pods", merge_patch(pod, patch), "MODIFIED")
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def evict(self, namespace: str, name: str, body: Json, dry_run: bool = False) -> Json:
        """A policy/v1 Eviction with no PodDisruptionBudget in the way: the pod is deleted (a
        budget that refuses is a fault: ``fault("create", "pods/eviction", status=429)``); a dry
        run (``dryRun=All``) checks the same and changes nothing."""
        with self._lock:
            pod = self._require("pods", f"{namespace}/{name}")
            if body.get("apiVersion") != "policy/v1" or body.get("kind") != "Eviction":
                raise ApiFailure(400, "expected a policy/v1 Eviction", "BadRequest")
            uid = ((body.get("deleteOptions") or {}).get("preconditions") or {}).get("uid")
            actual = pod["metadata"].get("uid")
            if uid and uid != actual:
                raise conflict(
                    "Pod",
                    name,
                    f"the UID in the precondition ({uid}) does not match the UID in record ({actual}). "
                    "The object might have been deleted and then recreated",
                )
            if not dry_run:
                self.evictions.append(body)
                self._store("pods", pod, "DELETED")
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def delete(self, resource: str, namespace: str, name: str) -> Json:
        with self._lock:
            old = self._require(resource, f"{namespace}/{name}")
            return self._store(resource, old, "DELETED")

    def watch_events(self, watch: _Watch, query: dict[str, str], namespace: str | None, send: Any) -> str:
        """Stream events to ``send`` until the timeout, a drop, an expiry or shutdown; returns how it ended."""
        resource = watch.resource
        fields = _selector(query.get("fieldSelector", ""), "fieldSelector")
        labels = _selector(query.get("labelSelector", ""), "labelSelector")
        timeout = float(query.get("timeoutSeconds") or 1800)
        deadline = time.monotonic() + timeout
        rv_text = query.get("resourceVersion", "")

        def wanted(e: Event) -> bool:
            return (
                e.resource == resource
                and _matches(e.obj, fields, labels)
                and (namespace is None or e.obj["metadata"].get("namespace") == namespace)
            )

        with self._lock:
            if rv_text in ("", "0"):
                cursor = self._rv
                initial = [
                    Event(cursor, resource, "ADDED", copy.deepcopy(o))
                    for _, o in sorted(self._objects[resource].items())
                ]
                initial = [e for e in initial if wanted(e)]
            else:
                cursor = int(rv_text)
                initial = []
                if cursor < self._compacted:
                    watch.expired = True
        for event in initial:
            send({"type": event.type, "object": event.obj})
        while True:
            with self._changed:
                while True:
                    if self._closing.is_set() or watch.dropped:
                        return "dropped"
                    if watch.expired:
                        break
                    if resource not in self._stalled:
                        start = bisect.bisect_right(self._events, cursor, key=lambda e: e.rv)
                        if start < len(self._events) or time.monotonic() >= deadline:
                            break
                    self._changed.wait(0.05)
                if watch.expired:
                    pending: list[Event] = []
                else:
                    pending = [e for e in itertools.islice(self._events, start, None) if wanted(e)]
                    cursor = self._rv
            if watch.expired:
                send({"type": "ERROR", "object": status_body(410, WATCH_EXPIRED, "Expired")})
                return "expired"
            for event in pending:
                send({"type": event.type, "object": event.obj})
            if time.monotonic() >= deadline:
                return "timeout"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else each answer waits ~40 ms for a delayed ACK
    server: Any

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        with self.fake._lock:
            self.fake._connections.add(self.connection)

    def finish(self) -> None:
        with self.fake._lock:
            self.fake._connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    @property
    def fake(self) -> FakeApiServer:
        return self.server.fake  # type: ignore[no-any-return]

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    # ------------------------------------------------------------ plumbing

    def _reply(self, code: int, body: Json) -> None:
        self._reply_raw(code, json.dumps(body).encode())

    def _reply_raw(self, code: int, data: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw) if raw else None
        except ValueError as exc:
            raise ApiFailure(400, f"request body is not JSON: {exc}") from exc

    @staticmethod
    def _route(method: str, parts: list[str], query: dict[str, str]) -> tuple[str, str, str | None, str]:
        """(verb, resource, namespace, name) for a path under /api/v1."""
        namespace = None
        if len(parts) >= 2 and parts[0] == "namespaces":
            namespace, parts = parts[1], parts[2:]
        if not parts or parts[0] not in RESOURCES or (parts[0] == "nodes" and namespace is not None):
            raise ApiFailure(404, f"the server could not find the requested resource {'/'.join(parts)!r}")
        resource, name = parts[0], parts[1] if len(parts) > 1 else ""
        if len(parts) == 3 and resource == "pods" and parts[2] == "binding" and method == "POST":
            return "create", "pods/binding", namespace, name
        if len(parts) == 3 and resource == "pods" and parts[2] == "eviction" and method == "POST":
            return "create", "pods/eviction", namespace, name
        if len(parts) == 3 and resource == "gpuquotas" and parts[2] == "status" and method == "PATCH":
            return "patch", "gpuquotas/status", namespace, name
        if len(parts) > 2:
            raise ApiFailure(404, f"the server could not find the requested resource {'/'.join(parts)!r}")
        if not name:
            verbs = {"GET": "watch" if query.get("watch") in ("true", "1") else "list", "POST": "create"}
        else:
            verbs = {"GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
        if method not in verbs:
            raise ApiFailure(405, f"{method} is not supported on {'/'.join(parts)}")
        return verbs[method], resource, namespace, name

    def _handle(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        parts = [p for p in url.path.split("/") if p]
        with self.fake._lock:
            self.fake.authorizations.add(self.headers.get("Authorization") or "")
        try:
            body = self._body() if method in ("POST", "PUT", "PATCH") else None
            if parts[:3] == QUOTA_PATH and self.fake.served_quotas:
                verb, resource, namespace, name = self._route(method, parts[3:], query)
                if not resource.startswith("gpuquotas"):
                    raise ApiFailure(404, f"path {url.path!r} is not served by this fake")
            elif parts[:2] != ["api", "v1"] or parts[2:3] == ["gpuquotas"]:
                raise ApiFailure(404, f"path {url.path!r} is not served by this fake")
            else:
                verb, resource, namespace, name = self._route(method, parts[2:], query)
            fault = self.fake._take_fault(verb, resource, name)
            if fault is not None and fault.apply and fault.status is not None:
                self._serve(verb, resource, namespace, name, query, body, reply=False)
            if fault is not None and fault.delay_s and self.fake._closing.wait(fault.delay_s):
                return
            if fault is not None and fault.body is not None:
                self._reply_raw(fault.status or 200, fault.body.encode())
                return
            if fault is not None and fault.status is not None:
                raise ApiFailure(fault.status, fault.message)
            self._serve(verb, resource, namespace, name, query, body, reply=True)
        except ApiFailure as exc:
            self._reply(exc.code, status_body(exc.code, exc.message, exc.reason))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _serve(
        self, verb: str, resource: str, namespace: str | None, name: str, query: dict[str, str], body: Any, reply: bool
    ) -> None:
        fake = self.fake
        ns = namespace or "default"
        result: Json
        if verb == "watch":
            self._watch(resource, namespace, query)
            return
        if verb == "list":
            result = fake.list(resource, namespace, query)
        elif verb == "get":
            key = name if resource == "nodes" else f"{ns}/{name}"
            with fake._lock:
                result = copy.deepcopy(fake._require(resource, key))
        elif verb == "create" and resource == "pods/binding":
            result = fake.bind(ns, name, body or {})
        elif verb == "create" and resource == "pods/eviction":
            result = fake.evict(ns, name, body or {}, query.get("dryRun") == "All")
        elif verb == "create" and resource == "configmaps":
            result = fake.create_configmap(ns, body or {})
        elif verb == "create" and resource == "pods":
            body = dict(body or {})
            body.setdefault("metadata", {})["namespace"] = ns
            with fake._lock:
                if fake._key("pods", body) in fake._objects["pods"]:
                    raise ApiFailure(409, f'pods "{body["metadata"].get("name")}" already exists', "AlreadyExists")
                result = fake._store("pods", body, "ADDED")
        elif verb == "update" and resource != "nodes":
            result = fake.update(resource, ns, name, body or {})
        elif verb == "patch" and resource == "pods":
            result = fake.patch_pod(ns, name, body)
        elif verb == "patch" and resource == "nodes":
            result = fake.patch_node(name, body)
        elif verb == "patch" and resource == "gpuquotas/status":
            result = fake.patch_status("gpuquotas", ns, name, body)
        elif verb == "create" and resource == "events":
            body = dict(body or {})
            meta = body.setdefault("metadata", {})
            meta["namespace"] = ns
            if not meta.get("name"):
                meta["name"] = str(meta.get("generateName") or "event.") + uuid.uuid4().hex[:8]
            with fake._lock:
                result = fake._store("events", body, "ADDED")
        elif verb == "delete" and resource != "nodes":
            result = fake.delete(resource, ns, name)
        else:
            raise ApiFailure(405, f"{verb} {resource} is not supported by this fake")
        if reply:
            self._reply(201 if verb == "create" else 200, result)

    def _watch(self, resource: str, namespace: str | None, query: dict[str, str]) -> None:
        # Bad parameters are refused before the stream starts, as the API server does.
        _selector(query.get("fieldSelector", ""), "fieldSelector")
        _selector(query.get("labelSelector", ""), "labelSelector")
        rv = query.get("resourceVersion", "")
        if rv and not rv.isdigit():
            problem = f'resourceVersion: Invalid value: "{rv}": strconv.ParseUint: parsing "{rv}": invalid syntax'
            raise ApiFailure(500, problem, NO_REASON)
        watch = _Watch(resource)
        fake = self.fake
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def send(event: Json) -> None:
            data = json.dumps(event).encode() + b"\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

        with fake._lock:
            fake._watches.add(watch)
        try:
            ended = fake.watch_events(watch, query, namespace, send)
        finally:
            with fake._lock:
                fake._watches.discard(watch)
        if ended == "dropped":
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
        else:
            self.wfile.write(b"0\r\n\r\n")


@contextlib.contextmanager
def audited(calls: Iterable[tuple[str, str, str]], what: str) -> Iterator[FakeApiServer]:
    """A fake API server that, once the test is done, must have served only ``calls`` (an
    account's declared ``(verb, group, resource)`` triples, named ``what`` in the failure)."""
    with FakeApiServer() as server:
        yield server
        served = server.served
    declared = {(verb, resource) for verb, _, resource in calls}
    assert served <= declared, f"calls served but missing from {what}: {sorted(served - declared)}"
