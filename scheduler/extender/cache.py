"""The extender's view of the cluster, fed by a Backend's change events, kept on the core's board.

Per node: the core ``Node`` (from ``parse_node``; an inventory error makes the node
unusable, with that reason, until it is fixed) and the ``NodeState`` rebuilt from the
allocation records that count on it: the records by which pods hold shares
(:func:`scheduler.core.pods.holding_record`), and the claims of this process: a pod it is
binding (in flight: from the moment bind decided until the watch shows the pod bound), and
a pod prioritize has just ranked on a node (held: until its bind arrives or the hold
expires, so that the pods filtered meanwhile are not steered to the same share).
Every pod counts at most once, so a bind applied here and later seen through the watch is
not counted twice. One lock guards everything here.

Where the backend keeps ledgers (``Backend.keeps_ledgers``: the Kubernetes backend), a pod's
bound record counts only when gpuslice itself bound it: its node's ledger (which only gpuslice
writes) holds the pod, by uid, and then the ledger's record is what counts (an edit on the pod
after its bind changes nothing); or this process made the bind (its ledger's change may reach
the watch after the pod's). Any other bound record (written by hand, on a pod of another
scheduler, or on one gpuslice never bound) claims nothing: it is listed with the rejected
records (``rejected_records``, ``/debug/nodes``, ``gpuslice_records_rejected``) with the reason,
and logged once.

GPU quotas (``GPUQuota`` objects): the quotas by namespace, and for each namespace that has
one, what each of its pods holds (by the same records and claims that count on the nodes, so
a hold or a bind in flight counts against its namespace at once). Namespaces without a quota
cost nothing here.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduler import logs
from scheduler.backend import Change, Kind, Placement
from scheduler.core.allocation import Allocation, decode_record, encode_record
from scheduler.core.board import Board
from scheduler.core.errors import InventoryError, QuotaError, RecordError
from scheduler.core.inventory import Node
from scheduler.core.k8s import parse_node
from scheduler.core.pods import has_ended, holding_record, node_of, uid_of
from scheduler.core.quota import NOTHING, Charge, Quota, charge, namespace_of, parse_quota
from scheduler.core.state import NodeState, rebuild

log = logs.get("cache")


@dataclass(slots=True)
class PodView:
    """What the cache keeps of a pod."""

    uid: str
    node: str  # spec.nodeName, "" while pending
    holding: str | None  # the record by which it holds a share on its node, if any
    obj: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Claim:
    """A share this process counts for a pod before the watch shows it: in flight (a bind
    decided it; ``until`` None) or held (prioritize ranked it first; until ``until``)."""

    uid: str
    node: str
    record: str
    allocation: Allocation
    until: float | None = None


@dataclass(slots=True)
class NodeView:
    node: Node | None = None
    problem: str = ""  # the InventoryError that makes the node unusable
    records: dict[str, str] = field(default_factory=dict)  # pod key -> record text, counted here
    errors: dict[str, RecordError] = field(default_factory=dict)
    usage: str = ""  # the node agent's <prefix>usage annotation (for inspection only: never placement)


def usage_text(obj: Mapping[str, Any], prefix: str) -> str:
    """The node agent's usage annotation of a Node ("" if none)."""
    meta = obj.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    text = annotations.get(prefix + "usage") if isinstance(annotations, Mapping) else None
    return text if isinstance(text, str) else ""


def _slim(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """What the extender reads of a pod (its identity, annotations, node, phase, priority, the
    controller that owns it, and each container's resources): at 50,000 pods the rest (images,
    environment, volumes, status conditions, managed fields) was most of the service's memory."""
    meta = obj.get("metadata")
    spec = obj.get("spec")
    status = obj.get("status")
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
        return obj  # malformed: kept whole, so that parsing it says what is wrong
    slim_spec: dict[str, Any] = {}
    for field_name in ("nodeName", "schedulerName", "priority"):  # priority: preempt and defrag
        if field_name in spec:
            slim_spec[field_name] = spec[field_name]
    for field_name in ("containers", "initContainers"):
        listed = spec.get(field_name)
        if isinstance(listed, list):
            slim_spec[field_name] = [
                {k: c[k] for k in ("name", "resources") if k in c} if isinstance(c, Mapping) else c for c in listed
            ]
        elif listed is not None:
            slim_spec[field_name] = listed
    kept = ("name", "namespace", "uid", "resourceVersion", "annotations", "deletionTimestamp")  # deletion: preempt
    slim_meta = {k: meta[k] for k in kept if k in meta}
    owners = meta.get("ownerReferences")
    if isinstance(owners, list):  # the managing controller only: defragmentation moves only pods one recreates
        slim_meta["ownerReferences"] = [
            {k: o[k] for k in ("kind", "name", "controller") if k in o}
            for o in owners
            if isinstance(o, Mapping) and o.get("controller") is True
        ]
    out: dict[str, Any] = {"metadata": slim_meta, "spec": slim_spec}
    if isinstance(status, Mapping) and "phase" in status:
        out["status"] = {"phase": status["phase"]}
    return out


class ClusterCache:
    def __init__(
        self, prefix: str, oversubscription: tuple[int, int] = (100, 100), clock: Callable[[], float] = time.monotonic
    ) -> None:
        """``oversubscription``: the (MPS compute, time-slicing memory) percent of nodes whose
        inventory sets none; ``clock``: what holds expire by."""
        self.prefix = prefix
        self.clock = clock
        self._oversubscription = oversubscription
        self.lock = threading.RLock()
        self.board = Board()  # the node states (callers hold the lock)
        self.nodes: dict[str, NodeView] = {}
        self.pods: dict[str, PodView] = {}
        self._claims: dict[str, Claim] = {}  # pod key -> what this process counts for it
        self._counted: dict[str, tuple[str, str]] = {}  # pod key -> (node, record) counted
        self._uids: dict[str, str] = {}  # uid -> pod key
        # pod key -> (uid, record) of the binds this process made: their records come first when a
        # node is counted anew, so a record written by hand never displaces one gpuslice wrote
        self._bound_here: dict[str, tuple[str, str]] = {}
        # Where the backend keeps ledgers: node -> pod key -> (uid, record) gpuslice bound there.
        self.uses_ledgers = False
        self._ledgers: dict[str, dict[str, tuple[str, str]]] = {}
        self._forged: dict[str, dict[str, str]] = {}  # node -> pod key -> why its bound record claims nothing
        self._forged_on: dict[str, str] = {}  # pod key -> the node of its entry in _forged
        self._forged_logged: set[tuple[str, str]] = set()  # (pod key, uid) logged as forged
        # Records decoded lately, by their text: a bind's record is read by its claim, its
        # counting, the watch event that confirms it and the next bind on its node.
        self._decoded: OrderedDict[str, Allocation] = OrderedDict()
        self.quotas: dict[str, Quota] = {}  # namespace/name -> quota
        self.quota_problems: dict[str, str] = {}  # namespace/name -> why the quota is not read
        self._by_namespace: dict[str, tuple[Quota, ...]] = {}
        self._charges: dict[str, dict[str, Charge]] = {}  # namespace with a quota -> pod key -> held

    # ------------------------------------------------------------ events

    def on_change(self, change: Change) -> None:
        with self.lock:
            if change.kind is Kind.NODE:
                self._node_changed(change.key, change.obj)
            elif change.kind is Kind.POD:
                self._pod_changed(change.key, change.obj)
            elif change.kind is Kind.LEDGER:
                self._ledger_changed(change.key, change.obj)
            else:
                self._quota_changed(change.key, change.obj)

    def _node_changed(self, name: str, obj: Mapping[str, Any] | None) -> None:
        view = self.nodes.get(name)
        if obj is None:
            if view is not None:
                view.node, view.problem = None, ""
                self.board.remove(name)
                if not view.records:
                    del self.nodes[name]
            return
        if view is None:
            view = self.nodes[name] = NodeView()
        view.usage = usage_text(obj, self.prefix)
        try:
            node = parse_node(obj, self.prefix, self._oversubscription)
        except InventoryError as exc:
            if view.problem != str(exc):
                log.warning("node unusable", extra={"node": name, "reason": str(exc)})
            view.node, view.problem = None, str(exc)
            self.board.put_problem(name, str(exc))
            return
        if view.node == node:
            return
        if view.problem:
            log.info("node usable again", extra={"node": name})
        view.node, view.problem = node, ""
        self._rebuild(name, view)

    def _pod_changed(self, key: str, obj: Mapping[str, Any] | None) -> None:
        old = self.pods.pop(key, None)
        if old is not None and self._uids.get(old.uid) == key:
            del self._uids[old.uid]
        if obj is not None:
            pod = PodView(uid_of(obj), node_of(obj), holding_record(obj, self.prefix), _slim(obj))
            self.pods[key] = pod
            mine = self._bound_here.get(key)
            if mine is not None and pod.uid and mine[0] and pod.uid != mine[0]:
                del self._bound_here[key]  # replaced by another pod of the same name
            if pod.uid:
                self._uids[pod.uid] = key
            claim = self._claims.get(key)
            if claim is not None:
                replaced = bool(pod.uid and claim.uid and pod.uid != claim.uid)
                # The watch has caught up; or the pod ended, was replaced, or was bound without
                # our record (the API server wins). Until then the claim counts.
                if pod.holding is not None or has_ended(obj) or replaced or pod.node:
                    del self._claims[key]
        else:
            self._claims.pop(key, None)
            self._bound_here.pop(key, None)
        self._count(key, self._want(key))

    def _want(self, key: str) -> tuple[str, str] | None:
        """The (node, record) the pod ``key`` counts with now: its bound record where gpuslice
        vouches for it, else this process's claim, else None."""
        was = self._forged_on.pop(key, None)
        if was is not None:
            forged = self._forged[was]
            del forged[key]
            if not forged:
                del self._forged[was]
        pod = self.pods.get(key)
        if pod is not None and pod.holding is not None:
            text = self._vouched_record(key, pod)
            return (pod.node, text) if text is not None else None
        claim = self._claims.get(key)
        return (claim.node, claim.record) if claim is not None else None

    def _vouched_record(self, key: str, pod: PodView) -> str | None:
        """The record by which a bound pod holds its share, where gpuslice bound it (see the module);
        None for a record that claims nothing, which is noted as forged."""
        assert pod.holding is not None
        if not self.uses_ledgers:
            return pod.holding
        entry = self._ledgers.get(pod.node, {}).get(key)
        if entry is not None and pod.uid and entry[0] == pod.uid:
            return entry[1]
        mine = self._bound_here.get(key)
        if mine is not None and pod.uid and mine[0] == pod.uid and self._same(key, mine[1], pod.holding):
            return pod.holding
        why = (
            f"pod {key}: gpuslice did not bind this record (the ledger of node {pod.node} holds no entry "
            f"for uid {pod.uid or '?'}): it claims no capacity; a record written by hand, or on a pod "
            "another scheduler placed"
        )
        self._forged.setdefault(pod.node, {})[key] = why
        self._forged_on[key] = pod.node
        if (key, pod.uid) not in self._forged_logged:
            if len(self._forged_logged) >= 4096:
                self._forged_logged.clear()  # bounded: a pod logged before may be logged once more
            self._forged_logged.add((key, pod.uid))
            log.warning("forged allocation record ignored", extra={"node": pod.node, "pod": key, "reason": why})
        return None

    def _ledger_changed(self, node: str, obj: Mapping[str, Any] | None) -> None:
        """What gpuslice bound on ``node`` changed: weigh the bound records of the pods concerned again."""
        if not node:
            return
        before = self._ledgers.pop(node, {})
        now: dict[str, tuple[str, str]] = {}
        for key, raw in (obj or {}).items():
            if isinstance(raw, Mapping) and isinstance(raw.get("uid"), str) and isinstance(raw.get("record"), str):
                now[key] = (raw["uid"], raw["record"])
        if now:
            self._ledgers[node] = now
        for key in sorted(set(before) | set(now)):
            if before.get(key) != now.get(key):
                self._count(key, self._want(key))

    # ------------------------------------------------------------ claims: binds in flight, holds

    def reserve(self, key: str, uid: str, alloc: Allocation) -> None:
        """Count ``alloc`` for a pod being bound by this process, until the watch confirms it."""
        with self.lock:
            text = self._claim(key, uid, alloc, None)
            if text is not None:
                self._bound_here[key] = (uid, text)

    def hold(self, key: str, uid: str, alloc: Allocation, until: float) -> None:
        """Count ``alloc`` for a pod prioritize has just ranked on its node, until ``until``
        (or its bind, or its next filter)."""
        self._claim(key, uid, alloc, until)

    def _claim(self, key: str, uid: str, alloc: Allocation, until: float | None) -> str | None:
        """The record counted for ``alloc``; None where the watch already shows the pod bound."""
        with self.lock:
            pod = self.pods.get(key)
            if pod is not None and pod.holding is not None:
                return None  # the watch already shows it bound
            text = encode_record(alloc)
            self._remember(text, alloc)
            self._claims[key] = Claim(uid, alloc.node, text, alloc, until)
            self._count(key, (alloc.node, text))
            return text

    def unreserve(self, key: str) -> None:
        """Forget what this process counted for a pod (its bind failed, or it is scheduled again)."""
        with self.lock:
            claim = self._claims.pop(key, None)
            if claim is None:
                return
            if claim.until is None:
                self._bound_here.pop(key, None)
            pod = self.pods.get(key)
            if pod is not None:
                self._pod_changed(key, pod.obj)
            else:
                self._count(key, None)

    def holds(self, node: str) -> dict[str, Claim]:
        """The pods' holds on ``node`` that are still in time."""
        with self.lock:
            now = self.clock()
            return {k: c for k, c in self._claims.items() if c.node == node and c.until is not None and c.until > now}

    def held(self, key: str) -> Claim | None:
        """The pod's hold, if it has one (not a bind in flight)."""
        claim = self._claims.get(key)
        return claim if claim is not None and claim.until is not None else None

    def expire(self) -> None:
        """Drop the holds whose time is up (their pods' binds never came)."""
        with self.lock:
            if not self._claims:
                return
            now = self.clock()
            for key in [k for k, c in self._claims.items() if c.until is not None and c.until <= now]:
                self.unreserve(key)

    def inflight(self) -> dict[str, str]:
        """Pod key -> node of every claim (binds in flight and holds)."""
        with self.lock:
            return {key: claim.node for key, claim in self._claims.items()}

    # ------------------------------------------------------------ node states

    def decode(self, text: str, key: str) -> Allocation:
        """:func:`decode_record`, remembered by text (RecordError as it raises)."""
        found = self._decoded.get(text)
        if found is None:
            found = decode_record(text, key)
            self._remember(text, found)
        return found

    def _remember(self, text: str, alloc: Allocation) -> None:
        self._decoded[text] = alloc
        if len(self._decoded) > 4096:
            self._decoded.popitem(last=False)

    def _same(self, key: str, a: str, b: str) -> bool:
        try:
            return self.decode(a, key) == self.decode(b, key)
        except RecordError:
            return False

    def _count(self, key: str, want: tuple[str, str] | None) -> None:
        if self._by_namespace:
            self._charge(key, want)
        have = self._counted.get(key)
        if have == want:
            return
        if have is not None and want is not None and have[0] == want[0] and self._same(key, have[1], want[1]):
            # the watch shows the allocation this process applied (its record now has a timestamp):
            # keep the node state, so nothing is scored again
            view = self.nodes.get(want[0])
            if view is not None and key in view.records:
                self._counted[key] = want
                view.records[key] = want[1]
                return
        if have is not None:
            del self._counted[key]
            self._set_record(have[0], key, None)
        if want is not None:
            self._counted[key] = want
            self._set_record(want[0], key, want[1])

    def _set_record(self, name: str, key: str, text: str | None) -> None:
        view = self.nodes.get(name)
        if view is None:
            if text is None:
                return
            view = self.nodes[name] = NodeView()
        if text is None:
            view.records.pop(key, None)
            had_error = view.errors.pop(key, None) is not None
            if view.node is None:
                if not view.records and not view.problem and name not in self.board:
                    del self.nodes[name]
                return
            state = self.board.get(name)
            if state is not None and not view.errors and not had_error:
                self.board.put(state.release(key))
                return
        else:
            view.records[key] = text
            if view.node is None:
                return
            state = self.board.get(name)
            if state is not None and not view.errors:
                try:
                    self.board.put(state.apply(key, self.decode(text, key)))
                    return
                except RecordError:
                    pass  # rebuild below reports it, with every other conflict
        self._rebuild(name, view)

    def _rebuild(self, name: str, view: NodeView) -> None:
        assert view.node is not None
        if self._by_namespace:  # a node read anew: its GPUs' models may have changed
            for key in view.records:
                self._charge(key, self._counted.get(key))
        state, problems = rebuild(view.node, view.records.items(), self._vouched(name, view))
        errors = {p.pod: p for p in problems}
        for pod, problem in errors.items():
            if pod not in view.errors or str(view.errors[pod]) != str(problem):
                log.warning("allocation record rejected", extra={"node": name, "pod": pod, "reason": problem.problem})
        view.errors = errors
        self.board.put(state)

    def _vouched(self, name: str, view: NodeView) -> set[str]:
        """The pods of ``view`` whose record is the one gpuslice bound them with: its ledger's of
        node ``name``, or this process's."""
        ledger = self._ledgers.get(name, {})
        return {
            key
            for key, text in view.records.items()
            if ((entry := ledger.get(key)) is not None and entry[1] == text)
            or ((mine := self._bound_here.get(key)) is not None and self._same(key, mine[1], text))
        }

    # ------------------------------------------------------------ quotas

    def _quota_changed(self, key: str, obj: Mapping[str, Any] | None) -> None:
        self.quotas.pop(key, None)
        self.quota_problems.pop(key, None)
        if obj is not None:
            try:
                self.quotas[key] = parse_quota(obj)
            except QuotaError as exc:
                # the CRD's schema keeps these out; a quota gpuslice cannot read limits nothing
                log.warning("quota unreadable", extra={"quota": key, "reason": str(exc)})
                self.quota_problems[key] = str(exc)
        namespace = namespace_of(key)
        had = namespace in self._by_namespace
        mine = tuple(q for k, q in sorted(self.quotas.items()) if namespace_of(k) == namespace)
        if mine:
            self._by_namespace[namespace] = mine
        else:
            self._by_namespace.pop(namespace, None)
            self._charges.pop(namespace, None)
        if mine and not had:  # what the namespace's pods hold, counted from now on
            for pod, want in list(self._counted.items()):
                if namespace_of(pod) == namespace:
                    self._charge(pod, want)

    def _charge(self, key: str, want: tuple[str, str] | None) -> None:
        """Count what ``key`` holds (``want``: its node and record) against its namespace's quotas."""
        namespace = namespace_of(key)
        if namespace not in self._by_namespace:
            return
        pods = self._charges.setdefault(namespace, {})
        if want is None:
            pods.pop(key, None)
            return
        try:
            alloc = self.decode(want[1], key)
        except RecordError:
            pods.pop(key, None)  # a record nobody can read holds nothing anywhere
            return
        view = self.nodes.get(want[0])
        pods[key] = charge(alloc, view.node if view is not None else None)

    def quotas_of(self, namespace: str) -> tuple[Quota, ...]:
        """The namespace's quotas (none: it is not limited)."""
        return self._by_namespace.get(namespace, ())

    def namespace_charges(self, namespace: str) -> dict[str, Charge]:
        """What each pod of a namespace with a quota holds, by pod key."""
        self.expire()
        return dict(self._charges.get(namespace, {}))

    def namespace_use(self, namespace: str, without: str = "") -> Charge:
        """What the pods of a namespace with a quota hold (records, binds in flight, holds),
        leaving out the pod ``without``."""
        self.expire()
        total = NOTHING
        for key, held in self._charges.get(namespace, {}).items():
            if key != without:
                total += held
        return total

    def quota_use(self) -> list[tuple[Quota, Charge]]:
        """Every quota gpuslice reads, with what its namespace holds (for metrics, status, inspect)."""
        with self.lock:
            self.expire()
            return [(q, self.namespace_use(q.namespace)) for _, q in sorted(self.quotas.items())]

    # ------------------------------------------------------------ queries (callers hold the lock)

    def state(self, name: str) -> NodeState | None:
        self.expire()
        return self.board.get(name)

    def key_of_uid(self, uid: str) -> str | None:
        return self._uids.get(uid)

    def placement(self, key: str) -> Placement:
        """Where the pod ``key`` runs and whether its bound record counts there (see :class:`Placement`)."""
        pod = self.pods.get(key)
        if pod is None:
            return Placement(synced=True)
        if pod.holding is None:
            why = "no bound record: it has none, it is not bound yet, or it has ended" if pod.node else "not bound"
            return Placement(synced=True, known=True, node=pod.node, why_not=why)
        view = self.nodes.get(pod.node)
        forged = self._forged.get(pod.node, {}).get(key)
        if forged is not None:
            return Placement(synced=True, known=True, node=pod.node, why_not=forged)
        counted = self._counted.get(key)
        if counted is None or counted[0] != pod.node or view is None or key not in view.records:
            return Placement(synced=True, known=True, node=pod.node, why_not="its record is not counted")
        if view.node is None:
            why = f"its node is not usable to gpuslice: {view.problem or 'no GPU inventory'}"
            return Placement(synced=True, known=True, node=pod.node, why_not=why)
        error = view.errors.get(key)
        if error is not None:
            return Placement(synced=True, known=True, node=pod.node, why_not=f"its record is rejected: {error}")
        return Placement(synced=True, known=True, node=pod.node, counted=True)

    def usage(self, name: str) -> str:
        view = self.nodes.get(name)
        return view.usage if view is not None else ""

    def problem(self, name: str) -> str:
        view = self.nodes.get(name)
        return view.problem if view is not None else ""

    def snapshot(self) -> dict[str, NodeState]:
        with self.lock:
            self.expire()
            return {s.node.name: s for s in self.board.states}

    def rejected_records(self, name: str) -> dict[str, str]:
        """Pod -> why its record on node ``name`` does not count (cheap: one node): records that
        conflict or do not decode, and records gpuslice did not bind."""
        with self.lock:
            view = self.nodes.get(name)
            found = {pod: str(e) for pod, e in view.errors.items()} if view is not None and view.errors else {}
            found.update(self._forged.get(name, {}))
            return found

    def record_errors(self) -> dict[str, dict[str, str]]:
        with self.lock:
            found = {
                name: {pod: e.problem for pod, e in view.errors.items()}
                for name, view in self.nodes.items()
                if view.errors
            }
            for name, forged in self._forged.items():
                if forged:
                    found.setdefault(name, {}).update(forged)
            return found

    def unusable(self) -> dict[str, str]:
        with self.lock:
            return {name: view.problem for name, view in self.nodes.items() if view.problem}
