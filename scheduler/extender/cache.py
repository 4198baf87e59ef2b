"""The extender's view of the cluster, fed by a Backend's change events.

Per node: the core ``Node`` (from ``parse_node``; an inventory error makes the node
unusable, with that reason) and the ``NodeState`` rebuilt from the allocation records
that count on it. A record counts when gpuslice bound its pod: the pod is not terminal,
the record's node is the pod's ``spec.nodeName`` and its ``bind-phase`` is ``bound`` (the
phase gpuslice's Binding writes in the same API write as ``spec.nodeName``); or when this
process is binding the pod (in flight: from the moment bind decided until the watch
shows the pod bound). Any other record, on a pending pod or on a pod some other binder
placed, claims nothing and blocks nothing. Every pod counts at most once, so a bind
applied here and later seen through the watch is not counted twice.

States live in the core's Scoreboard, so scoring many pods against
many nodes only re-scores nodes that changed. One lock guards everything here.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from scheduler import logs
from scheduler.backend import Change, Kind
from scheduler.core.allocation import Allocation, decode_record, encode_record
from scheduler.core.errors import InventoryError, RecordError
from scheduler.core.fit import fit
from scheduler.core.inventory import Node
from scheduler.core.k8s import parse_node
from scheduler.core.request import Demand
from scheduler.core.select import Scoreboard
from scheduler.core.state import NodeState, rebuild

log = logs.get("cache")

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
BOUND = "bound"  # the bind-phase gpuslice's Binding writes


@dataclass(slots=True)
class PodView:
    """What the cache keeps of a pod."""

    uid: str
    node: str  # spec.nodeName, "" while pending
    live: bool  # not Succeeded/Failed
    record: str | None  # the allocation annotation
    obj: Mapping[str, Any]
    bound_by_us: bool = False  # bind-phase is "bound": the Binding came from gpuslice


@dataclass(slots=True)
class NodeView:
    node: Node | None = None
    problem: str = ""  # the InventoryError that makes the node unusable
    records: dict[str, str] = field(default_factory=dict)  # pod key -> record text, counted here
    errors: dict[str, RecordError] = field(default_factory=dict)
    empty_fit: dict[int, str] = field(default_factory=dict)  # interned demand -> "" if it fits the empty node


def _same(key: str, a: str, b: str) -> bool:
    try:
        return decode_record(a, key) == decode_record(b, key)
    except RecordError:
        return False


def record_node(text: str) -> str | None:
    """The ``node`` of a record, without decoding the rest (None if unreadable)."""
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):
        return None
    node = body.get("node") if isinstance(body, dict) else None
    return node if isinstance(node, str) else None


def pod_view(obj: Mapping[str, Any], prefix: str) -> PodView:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    annotations = (meta.get("annotations") or {}) if isinstance(meta, Mapping) else {}
    record = annotations.get(prefix + "allocation") if isinstance(annotations, Mapping) else None
    node = spec.get("nodeName") if isinstance(spec, Mapping) else None
    phase = status.get("phase") if isinstance(status, Mapping) else None
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    bind_phase = annotations.get(prefix + "bind-phase") if isinstance(annotations, Mapping) else None
    return PodView(
        uid if isinstance(uid, str) else "",
        node if isinstance(node, str) else "",
        phase not in TERMINAL_PHASES,
        record if isinstance(record, str) else None,
        obj,
        bind_phase == BOUND,
    )


class ClusterCache:
    def __init__(
        self,
        prefix: str,
        adjust_node: Callable[[Node, Mapping[str, Any]], Node] | None = None,
    ) -> None:
        self.prefix = prefix
        self._adjust = adjust_node
        self.lock = threading.RLock()
        self._board = Scoreboard()
        # Nodes that joined since the board was last read: they are added in one go, since
        # each join alone re-derives the board's arrays (the first sync of 5,000 nodes took
        # a minute that way).
        self._joining: dict[str, NodeState] = {}
        self.nodes: dict[str, NodeView] = {}
        self.pods: dict[str, PodView] = {}
        self._inflight: dict[str, tuple[str, str, str]] = {}  # pod key -> (uid, node, record)
        self._counted: dict[str, tuple[str, str]] = {}  # pod key -> (node, record) counted
        self._uids: dict[str, str] = {}  # uid -> pod key
        self.generation = 0  # bumped on every change of any node state
        self.layout = 0  # bumped when a node joins or leaves the board (positions change)
        self.inventory = 0  # bumped when any node's inventory or problem changes, or a node goes

    @property
    def board(self) -> Scoreboard:
        """The node states (caller holds the lock)."""
        if self._joining:
            self._board = Scoreboard([*self._board.states, *self._joining.values()])
            self._joining.clear()
        return self._board

    @contextmanager
    def locked(self) -> Iterator[ClusterCache]:
        with self.lock:
            yield self

    # ------------------------------------------------------------ events

    def on_change(self, change: Change) -> None:
        with self.lock:
            if change.kind is Kind.NODE:
                self._node_changed(change.key, change.obj)
            else:
                self._pod_changed(change.key, change.obj)

    def _node_changed(self, name: str, obj: Mapping[str, Any] | None) -> None:
        view = self.nodes.get(name)
        if obj is None:
            if view is not None:
                self.inventory += 1
                view.node, view.problem = None, ""
                self._remove(name)
                if not view.records:
                    del self.nodes[name]
                self.generation += 1
            return
        if view is None:
            view = self.nodes[name] = NodeView()
        try:
            node = parse_node(obj, self.prefix)
            if self._adjust is not None:
                node = self._adjust(node, obj)
        except InventoryError as exc:
            if view.problem != str(exc):
                log.warning("node unusable", extra={"node": name, "reason": str(exc)})
            view.node, view.problem = None, str(exc)
            self.inventory += 1
            self._remove(name)
            self.generation += 1
            return
        if view.node == node:
            return
        if view.problem:
            log.info("node usable again", extra={"node": name})
        view.node, view.problem, view.empty_fit = node, "", {}
        self.inventory += 1
        self._rebuild(name, view)

    def _pod_changed(self, key: str, obj: Mapping[str, Any] | None) -> None:
        old = self.pods.pop(key, None)
        if old is not None and self._uids.get(old.uid) == key:
            del self._uids[old.uid]
        want: tuple[str, str] | None = None
        if obj is not None:
            pod = pod_view(obj, self.prefix)
            self.pods[key] = pod
            if pod.uid:
                self._uids[pod.uid] = key
            if pod.live and pod.record is not None and pod.node and pod.bound_by_us:
                owner = record_node(pod.record)
                if owner is None or owner == pod.node:  # an unreadable record is counted to show its error
                    want = (pod.node, pod.record)
            flight = self._inflight.get(key)
            if flight is not None:
                if want is not None or not pod.live or (pod.uid and flight[0] and pod.uid != flight[0]):
                    del self._inflight[key]  # the watch has caught up (or the pod is gone)
                elif not pod.node:
                    want = (flight[1], flight[2])
                else:
                    del self._inflight[key]  # bound elsewhere without our record: the API server wins
        else:
            self._inflight.pop(key, None)
        self._count(key, want)

    # ------------------------------------------------------------ binds in flight

    def reserve(self, key: str, uid: str, alloc: Allocation) -> None:
        """Count ``alloc`` for a pod being bound by this process, until the watch confirms it."""
        with self.lock:
            pod = self.pods.get(key)
            if pod is not None and pod.node == alloc.node and key in self._counted:
                return  # the watch already shows it bound there
            text = encode_record(alloc)
            self._inflight[key] = (uid, alloc.node, text)
            self._count(key, (alloc.node, text))

    def unreserve(self, key: str) -> None:
        """Forget an in-flight allocation after its bind failed."""
        with self.lock:
            if self._inflight.pop(key, None) is None:
                return
            pod = self.pods.get(key)
            if pod is not None:
                self._pod_changed(key, pod.obj)
            else:
                self._count(key, None)

    def inflight(self) -> dict[str, str]:
        with self.lock:
            return {key: node for key, (_, node, _) in self._inflight.items()}

    # ------------------------------------------------------------ node states

    def _count(self, key: str, want: tuple[str, str] | None) -> None:
        have = self._counted.get(key)
        if have == want:
            return
        if have is not None and want is not None and have[0] == want[0] and _same(key, have[1], want[1]):
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
                self._put(state.release(key))
                return
        else:
            view.records[key] = text
            state = self.board.get(name)
            if view.node is None:
                return
            if state is not None and not view.errors:
                try:
                    self._put(state.apply(key, decode_record(text, key)))
                    return
                except RecordError:
                    pass  # rebuild below reports it, with every other conflict
        self._rebuild(name, view)

    def _rebuild(self, name: str, view: NodeView) -> None:
        assert view.node is not None
        state, problems = rebuild(view.node, view.records.items())
        errors = {p.pod: p for p in problems}
        for pod, problem in errors.items():
            if pod not in view.errors or str(view.errors[pod]) != str(problem):
                log.warning("allocation record rejected", extra={"node": name, "pod": pod, "reason": problem.problem})
        view.errors = errors
        self._put(state)

    def _put(self, state: NodeState) -> None:
        name = state.node.name
        if name in self._joining or name not in self._board:
            if name not in self._joining:
                self.layout += 1
            self._joining[name] = state
        else:
            self._board.put(state)
        self.generation += 1

    def _remove(self, name: str) -> None:
        if self._joining.pop(name, None) is not None:
            self.layout += 1
        elif name in self._board:
            self.layout += 1
            self._board.remove(name)

    # ------------------------------------------------------------ queries (callers hold the lock)

    def state(self, name: str) -> NodeState | None:
        return self.board.get(name)

    def key_of_uid(self, uid: str) -> str | None:
        return self._uids.get(uid)

    def unresolvable(self, name: str, demand: Demand, key: int) -> str:
        """Why ``demand`` could never fit on ``name`` even if it were empty ("" if it could).

        ``key`` stands for the demand (``memo.intern(demand)``): hashing an int per node is
        cheaper than hashing the request again."""
        view = self.nodes.get(name)
        if view is None or view.node is None:
            return view.problem if view is not None and view.problem else ""
        reason = view.empty_fit.get(key)
        if reason is None:
            found = fit(demand, NodeState.empty(view.node))
            reason = view.empty_fit[key] = "" if found else found.reason
            if len(view.empty_fit) > 256:
                view.empty_fit.clear()
        return reason

    def problem(self, name: str) -> str:
        view = self.nodes.get(name)
        return view.problem if view is not None else ""

    def snapshot(self) -> dict[str, NodeState]:
        with self.lock:
            return {s.node.name: s for s in self.board.states}

    def record_errors(self) -> dict[str, dict[str, str]]:
        with self.lock:
            return {
                name: {pod: e.problem for pod, e in view.errors.items()}
                for name, view in self.nodes.items()
                if view.errors
            }

    def unusable(self) -> dict[str, str]:
        with self.lock:
            return {name: view.problem for name, view in self.nodes.items() if view.problem}


def with_oversubscription(mps_pct: int, ts_pct: int, prefix: str) -> Callable[[Node, Mapping[str, Any]], Node]:
    """A node adjuster applying default oversubscription where the node's inventory sets none."""

    def adjust(node: Node, obj: Mapping[str, Any]) -> Node:
        if mps_pct == 100 and ts_pct == 100:
            return node
        meta = obj.get("metadata") or {}
        text = (meta.get("annotations") or {}).get(prefix + "inventory")
        explicit: Mapping[str, Any] = {}
        if isinstance(text, str):
            try:
                body = json.loads(text)
            except ValueError:
                body = None
            explicit = body if isinstance(body, dict) else {}
        return dataclasses.replace(
            node,
            mps_compute_oversub_pct=node.mps_compute_oversub_pct
            if "mpsComputeOversubscriptionPct" in explicit
            else mps_pct,
            ts_memory_oversub_pct=node.ts_memory_oversub_pct
            if "timeSlicingMemoryOversubscriptionPct" in explicit
            else ts_pct,
        )

    return adjust
