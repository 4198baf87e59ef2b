"""A Backend over a file: a Kubernetes ``v1 List`` of Nodes and Pods, binds kept in memory.

The file is what ``kubectl get nodes,pods -A -o yaml`` (or ``-o json``) prints. Binds
honour the same contract as the Kubernetes backend: serialised per node (and per pod),
``decide`` sees the records of the node's live pods, a repeated bind of a pod already
bound to that node returns its allocation, and every change is reported through
``on_change`` as a watch event would be.
"""

from __future__ import annotations

import importlib.resources
import json
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from scheduler import logs
from scheduler.backend import Admit, BindResult, Change, Decide, Kind, PodRef
from scheduler.core.allocation import Allocation, decode_record, record_annotations
from scheduler.core.errors import GpusliceError, QuotaError, RecordError
from scheduler.core.pods import BOUND, holding_record, node_of, record_of
from scheduler.core.quota import KIND as QUOTA_KIND
from scheduler.core.quota import parse_quota
from scheduler.core.request import DEFAULT_PREFIX

log = logs.get("filebackend")

EXAMPLE = "example"  # ``--cluster-file example``: the example cluster shipped with the package
# The example clusters shipped with the package, by the name that stands for them in place of a file.
EXAMPLES = {EXAMPLE: "cluster.yaml", "example-defrag": "defrag.yaml"}


def example_path(name: str = EXAMPLE) -> Path:
    """An example cluster shipped with the package (usable after ``pip install``)."""
    return Path(str(importlib.resources.files("scheduler") / "examples" / EXAMPLES[name]))


def resolve_cluster_file(value: str) -> Path:
    """``value`` as a path; ``example`` or ``example-defrag`` (when no such file exists) is the
    shipped example cluster of that name."""
    path = Path(value)
    if value in EXAMPLES and not path.exists():
        return example_path(value)
    return path


LIST_KINDS = {"List": None, "NodeList": "Node", "PodList": "Pod"}


class ClusterFileError(GpusliceError):
    """The cluster file cannot be used; the message names the file, the item and the field."""


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def read_list(path: Path) -> dict[str, Any]:
    """The file's top-level object (JSON, or YAML for anything that is not JSON)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ClusterFileError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        if text.lstrip().startswith(("{", "[")):
            body = json.loads(text)
        else:
            loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
            body = yaml.load(text, Loader=loader)
    except (ValueError, yaml.YAMLError) as exc:
        raise ClusterFileError(f"{path}: neither JSON nor YAML: {exc}") from exc
    if not isinstance(body, dict):
        raise ClusterFileError(
            f"{path}: must be a Kubernetes v1 List (an object with 'items'), got {type(body).__name__}"
        )
    return body


def parse_list(path: Path, body: Mapping[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """(nodes by name, pods by namespace/name) of a v1 List; ClusterFileError naming what is wrong."""
    kind = body.get("kind", "List")
    if kind not in LIST_KINDS:
        raise ClusterFileError(f"{path}: kind must be one of {', '.join(LIST_KINDS)}, got {kind!r}")
    items = body.get("items")
    if items is None:
        items = []
    if not isinstance(items, list):
        raise ClusterFileError(f"{path}: 'items' must be a list")
    nodes: dict[str, dict[str, Any]] = {}
    pods: dict[str, dict[str, Any]] = {}
    for i, item in enumerate(items):
        where = f"{path}: items[{i}]"
        if not isinstance(item, dict):
            raise ClusterFileError(f"{where}: must be an object")
        item_kind = item.get("kind", LIST_KINDS[kind])
        meta = item.get("metadata")
        if not isinstance(meta, dict):
            raise ClusterFileError(f"{where}: 'metadata' must be an object")
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise ClusterFileError(f"{where}: metadata.name must be a non-empty string")
        where = f"{where} ({item_kind} {name})"
        for key in ("annotations", "labels"):
            value = meta.get(key)
            if value is not None and (
                not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values())
            ):
                raise ClusterFileError(f"{where}: metadata.{key} must map names to strings")
        if item_kind == "Node":
            if name in nodes:
                raise ClusterFileError(f"{where}: a second Node named {name!r}")
            nodes[name] = item
        elif item_kind == "Pod":
            namespace = meta.get("namespace", "default")
            if not isinstance(namespace, str) or not namespace:
                raise ClusterFileError(f"{where}: metadata.namespace must be a non-empty string")
            spec = item.get("spec")
            if spec is not None and not isinstance(spec, dict):
                raise ClusterFileError(f"{where}: 'spec' must be an object")
            node = (spec or {}).get("nodeName")
            if node is not None and not isinstance(node, str):
                raise ClusterFileError(f"{where}: spec.nodeName must be a string")
            key = f"{namespace}/{name}"
            if key in pods:
                raise ClusterFileError(f"{where}: a second Pod named {key!r}")
            pods[key] = item
        elif item_kind != QUOTA_KIND:  # quotas: parse_quotas
            log.warning("cluster file item skipped", extra={"file": str(path), "item": i, "kind": item_kind})
    return nodes, pods


def parse_quotas(path: Path, body: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The ``GPUQuota`` objects of a v1 List, by namespace/name; ClusterFileError naming a malformed
    one by its field path (the API server's schema refuses the same)."""
    quotas: dict[str, dict[str, Any]] = {}
    items = body.get("items")
    for i, item in enumerate(items if isinstance(items, list) else []):
        if not isinstance(item, dict) or item.get("kind") != QUOTA_KIND:
            continue
        try:
            quota = parse_quota(item)
        except QuotaError as exc:
            raise ClusterFileError(f"{path}: items[{i}]: {exc}") from exc
        key = f"{quota.namespace}/{quota.name}"
        if key in quotas:
            raise ClusterFileError(f"{path}: items[{i}]: a second GPUQuota named {key!r}")
        quotas[key] = item
    return quotas


class FileBackend:
    bind_waits = False  # binds are kept in memory
    # A cluster file keeps no ledger: the file is what its operator wrote, and every bound record in
    # it counts (the binds made here are kept in memory, the extender's own).
    keeps_ledgers = False

    def __init__(self, path: Path | str, prefix: str = DEFAULT_PREFIX, clock: Callable[[], str] = _now) -> None:
        self.path = Path(path)
        self.prefix = prefix
        self._clock = clock
        body = read_list(self.path)
        self._nodes, self._pods = parse_list(self.path, body)
        if self._pods and not self._nodes:
            raise ClusterFileError(
                f"{self.path}: {len(self._pods)} Pods and no Node: nothing to schedule them on; list the nodes "
                "too (kubectl get nodes,pods -A -o yaml)"
            )
        self._quotas = parse_quotas(self.path, body)
        # node -> the pods bound to it, each with the record it holds its share by (None: none),
        # read once per change of the pod rather than at every bind on the node
        self._on_node: dict[str, dict[str, str | None]] = {}
        for key, pod in self._pods.items():
            self._on_node.setdefault(node_of(pod), {})[key] = holding_record(pod, prefix)
        self._lock = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._on_change: Callable[[Change], None] | None = None
        self._ready = False
        self.events: list[tuple[str, str, str]] = []  # (node, reason, message): no cluster to record them in

    # ------------------------------------------------------------ Backend

    def start(self, on_change: Callable[[Change], None]) -> None:
        with self._lock:
            self._on_change = on_change
            nodes = list(self._nodes.items())
            pods = list(self._pods.items())
            quotas = list(self._quotas.items())
        for key, obj in quotas:
            on_change(Change(Kind.QUOTA, key, obj))
        for name, obj in nodes:
            on_change(Change(Kind.NODE, name, obj))
        for key, obj in pods:
            on_change(Change(Kind.POD, key, obj))
        self._ready = True
        log.info("cluster file loaded", extra={"file": str(self.path), "nodes": len(nodes), "pods": len(pods)})

    def ready(self) -> bool:
        return self._ready

    def stop(self) -> None:
        self._ready = False
        self._on_change = None

    def node_event(self, node: str, reason: str, message: str) -> None:
        """Kept in :attr:`events` (a cluster file has nowhere to write an Event); the log shows it."""
        with self._lock:
            self.events.append((node, reason, message))

    def bind(self, pod: PodRef, node: str, decide: Decide, admit: Admit | None = None) -> BindResult:
        # Pod lock first, then node lock, then namespace lock: the only order anything here takes them in.
        namespace: AbstractContextManager[None] = (
            self._serialised("namespace:" + pod.namespace) if admit is not None else nullcontext()
        )
        with self._serialised("pod:" + pod.key), self._serialised("node:" + node), namespace:
            with self._lock:
                obj = self._pods.get(pod.key)
                known = node in self._nodes
                records = [(k, t) for k, t in self._on_node.get(node, {}).items() if k != pod.key and t is not None]
            if obj is None:
                return BindResult(error=f"pod {pod.key} not found")
            uid = (obj.get("metadata") or {}).get("uid") or ""
            if pod.uid and uid and uid != pod.uid:
                return BindResult(error=f"pod {pod.key} has uid {uid}, not {pod.uid}")
            current = node_of(obj)
            if current:
                if current != node:
                    return BindResult(error=f"pod {pod.key} is already bound to node {current}")
                existing = self._record(pod.key, obj)
                if isinstance(existing, Allocation) and existing.node == node:
                    return BindResult(allocation=existing)
                return BindResult(error=f"pod {pod.key} is already on node {node} without a usable record")
            if not known:
                return BindResult(error=f"node {node} not found")
            decision = decide(records)
            if isinstance(decision, str):
                return BindResult(error=decision)
            if decision.node != node:
                return BindResult(error=f"allocation is for node {decision.node}, not {node}")
            if admit is not None:
                with self._lock:
                    mine = [(k, p) for k, p in self._pods.items() if k != pod.key and k.startswith(pod.namespace + "/")]
                held = [(k, text) for k, p in mine if (text := holding_record(p, self.prefix)) is not None]
                refused = admit(held, decision)
                if refused is not None:
                    return BindResult(error=refused)
            # A new object along the path that changes; the rest is shared: stored objects are
            # never changed in place (a deep copy of the pod cost a fifth of the bind).
            meta = dict(obj.get("metadata") or {})
            meta["annotations"] = {
                **(meta.get("annotations") or {}),
                **record_annotations(decision, self.prefix, BOUND, self._clock()),
            }
            bound = {**obj, "metadata": meta, "spec": {**(obj.get("spec") or {}), "nodeName": node}}
            self._emit(Kind.POD, pod.key, bound)
            return BindResult(allocation=decision)

    # ------------------------------------------------------------ changes (tests, demo)

    def put_pod(self, obj: Mapping[str, Any]) -> str:
        """Add or replace a pod, as if created or updated through the API server."""
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
        _, pods = parse_list(self.path, {"kind": "List", "items": [dict(obj, kind="Pod")]})
        self._emit(Kind.POD, key, pods[key])
        return key

    def delete_pod(self, key: str) -> None:
        self._emit(Kind.POD, key, None)

    def put_node(self, obj: Mapping[str, Any]) -> None:
        nodes, _ = parse_list(self.path, {"kind": "List", "items": [dict(obj, kind="Node")]})
        for name, item in nodes.items():
            self._emit(Kind.NODE, name, item)

    def delete_node(self, name: str) -> None:
        self._emit(Kind.NODE, name, None)

    def put_quota(self, obj: Mapping[str, Any]) -> str:
        """Add or replace a GPUQuota, as if applied through the API server; its key."""
        quotas = parse_quotas(self.path, {"items": [dict(obj, kind=QUOTA_KIND)]})
        ((key, item),) = quotas.items()
        self._emit(Kind.QUOTA, key, item)
        return key

    def quota_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """Kept on the quota as its status (``as_list`` shows it), as the API server would."""
        with self._lock:
            key = f"{namespace}/{name}"
            if key in self._quotas:
                self._quotas[key] = {**self._quotas[key], "status": dict(status)}

    def delete_quota(self, key: str) -> None:
        self._emit(Kind.QUOTA, key, None)

    def quotas(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return dict(self._quotas)

    def pods(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return dict(self._pods)

    def nodes(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return dict(self._nodes)

    def as_list(self) -> dict[str, Any]:
        """The cluster as it is now, binds included, as a v1 List."""
        with self._lock:
            items = [dict(n, kind="Node") for n in self._nodes.values()]
            items += [dict(p, kind="Pod") for p in self._pods.values()]
            items += [dict(q, kind=QUOTA_KIND) for q in self._quotas.values()]
        return {"apiVersion": "v1", "kind": "List", "items": items}

    # ------------------------------------------------------------ helpers

    def _emit(self, kind: Kind, key: str, obj: dict[str, Any] | None) -> None:
        with self._lock:
            store = self._nodes if kind is Kind.NODE else self._pods if kind is Kind.POD else self._quotas
            if kind is Kind.POD:
                old = self._pods.get(key)
                if old is not None:
                    self._on_node.get(node_of(old), {}).pop(key, None)
                if obj is not None:
                    self._on_node.setdefault(node_of(obj), {})[key] = holding_record(obj, self.prefix)
            if obj is None:
                store.pop(key, None)
            else:
                store[key] = obj
            on_change = self._on_change
        if on_change is not None:
            on_change(Change(kind, key, obj))

    @contextmanager
    def _serialised(self, name: str) -> Iterator[None]:
        with self._lock:
            lock = self._locks.setdefault(name, threading.Lock())
        with lock:
            yield

    def _record(self, key: str, obj: Mapping[str, Any]) -> Allocation | None:
        text = record_of(obj, self.prefix)
        if text is None:
            return None
        try:
            return decode_record(text, key)
        except RecordError:
            return None
