"""A Kubernetes ``v1`` ``List`` of Nodes and Pods (``kubectl get nodes,pods -A -o yaml``) as
the starting cluster.

Nodes go through the core's ``parse_node`` (inventory annotation, GPU feature discovery
labels, allocatable). Pods bound to a node (``spec.nodeName``, not finished) start there,
on the share their ``gpuslice.io/allocation`` record names (``decode_record``), or on the
first share ``fit`` finds when they have none. Pending pods are the arrivals, in list
order. Errors name the file, the item and the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from scheduler.core.allocation import decode_record
from scheduler.core.errors import InventoryError, RecordError, RequestError
from scheduler.core.k8s import parse_node
from scheduler.core.pods import has_ended, node_of, record_of
from scheduler.core.request import DEFAULT_PREFIX, parse_pod

from .errors import TraceError
from .model import ARRIVALS, BoundPod, SimPod, Trace


def is_kube_list(doc: object) -> bool:
    return isinstance(doc, Mapping) and doc.get("kind") == "List"


def parse(doc: Mapping[str, Any], path: str | Path, prefix: str = DEFAULT_PREFIX) -> Trace:
    items = doc.get("items") or []
    if not isinstance(items, list):
        raise TraceError(path, "", "items: expected a list of Nodes and Pods")
    nodes = []
    bound: list[BoundPod] = []
    pending: list[SimPod] = []
    for i, item in enumerate(items):
        where = f"items[{i}]"
        if not isinstance(item, Mapping):
            raise TraceError(path, where, "expected a Node or a Pod object")
        kind = item.get("kind")
        meta = item.get("metadata") if isinstance(item.get("metadata"), Mapping) else {}
        name = meta.get("name", "?") if isinstance(meta, Mapping) else "?"
        if kind == "Node":
            try:
                nodes.append(parse_node(item, prefix))
            except InventoryError as exc:
                raise TraceError(path, f"{where} (Node {name})", str(exc)) from None
        elif kind == "Pod":
            try:
                request = parse_pod(item, prefix)
            except RequestError as exc:
                raise TraceError(path, f"{where} (Pod {name})", str(exc)) from None
            if has_ended(item):
                continue
            node = node_of(item)
            if node:
                record = record_of(item, prefix)
                alloc = None
                if record is not None:
                    try:
                        alloc = decode_record(record, request.key)
                    except RecordError as exc:
                        raise TraceError(path, f"{where} (Pod {request.key})", f"{prefix}allocation: {exc}") from None
                bound.append(BoundPod(request.key, str(node), request.demand, alloc))
            else:
                pending.append(SimPod(request.key, request.demand))
        # other kinds (Services, ...) are not the scheduler's concern: skipped
    if not nodes:
        raise TraceError(path, "", "has no Node items")
    return Trace(
        Path(path).stem,
        tuple(nodes),
        tuple(pending),
        tuple(bound),
        replay=ARRIVALS,
        inflate=0.0,
        shuffle=False,
        source=str(path),
    )


def read_kube_list(path: str | Path, prefix: str = DEFAULT_PREFIX) -> Trace:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(path, "", f"cannot be read: {exc.strerror or exc}") from exc
    try:
        doc = json.loads(text) if text.lstrip().startswith("{") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise TraceError(path, "", f"is neither valid JSON nor YAML: {exc}") from None
    if not is_kube_list(doc):
        raise TraceError(path, "", "is not a Kubernetes v1 List (kind: List with items)")
    return parse(doc, path, prefix)
