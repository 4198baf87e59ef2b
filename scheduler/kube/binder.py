"""Bind: give a pod one concrete share on a node and bind it there, never giving a share twice.

Steps, for pod P and node N:

1. GET P. Gone, another uid, or terminal: fail. Already on N with a record: done (idempotent).
2. Under N's ledger (one lock per node in this process; across replicas, the ledger's
   compare-and-set): read the ledger and the pods bound to N; drop entries whose pod is
   gone, terminal, of another uid, bound elsewhere, or unbound for longer than
   ``stale_allocation_s``; hand ``decide`` the union of the ledger's records and the
   records of the live pods on N; write the ledger with P's entry (phase allocating),
   guarded by the resourceVersion read. 409 -> re-read and decide again, a bounded number
   of times with jittered, doubling waits.
3. Merge-patch P's annotations (``record_annotations``, phase allocating).
4. Create the Binding, with P's uid as precondition and ``bind-phase: bound`` in its
   annotations, which the API server copies onto the pod as it sets ``spec.nodeName``:
   phase and node change in one write.
5. Mark the entry bound in the ledger (best effort: a live pod on N counts either way).

A failure in 2-3, or a Binding refused with a 4xx, undoes what was written (the ledger
entry, by compare-and-set, and the annotations). A Binding that got no answer or a 5xx
may have happened: if a GET shows P on N it did, and the bind succeeds; otherwise the
share stays reserved (the pod is requeued, and the entry is replaced by P's next bind
or dropped as stale), because releasing a share that is in use is the one mistake
that double-books. Once the Binding exists the pod is bound, whatever fails later.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from scheduler.backend import BindResult, Decide, PodRef
from scheduler.core.allocation import Allocation, decode_record, encode_record, record_annotations
from scheduler.core.errors import GpusliceError

from .api import KubeApi
from .clock import Clock, parse_rfc3339, rfc3339
from .errors import ApiStatusError, ApiUnavailableError, ConflictError, KubeError, NotFoundError
from .ledger import ALLOCATING, BOUND, Entry, Ledger, LedgerStore
from .options import KubeOptions

log = logging.getLogger("gpuslice.kube.bind")

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _node_of(pod: Mapping[str, Any]) -> str:
    spec = pod.get("spec")
    return str(spec.get("nodeName") or "") if isinstance(spec, Mapping) else ""


def _terminal(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status")
    return isinstance(status, Mapping) and status.get("phase") in TERMINAL_PHASES


def _key(pod: Mapping[str, Any]) -> str:
    meta = _meta(pod)
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"


class Binder:
    def __init__(self, api: KubeApi, options: KubeOptions, clock: Clock, rng: random.Random) -> None:
        self._api = api
        self._options = options
        self._clock = clock
        self._rng = rng
        self._ledgers = LedgerStore(api, options.namespace, options.prefix)
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._sleeper = threading.Event()  # never set: a wait on it is a sleep

    def _node_lock(self, node: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(node, threading.Lock())

    def _annotations(self, pod: Mapping[str, Any]) -> Mapping[str, Any]:
        annotations = _meta(pod).get("annotations")
        return annotations if isinstance(annotations, Mapping) else {}

    # ------------------------------------------------------------ the bind

    def bind(self, pod: PodRef, node: str, decide: Decide) -> BindResult:
        where = {"pod": pod.key, "node": node}
        try:
            result = self._bind(pod, node, decide)
        except KubeError as exc:
            result = BindResult(error=f"bind {pod.key} to {node}: {exc}")
        if result.error:
            log.warning("bind failed: %s", result.error, extra=where)
        else:
            log.info("bound %s to %s", pod.key, node, extra=where)
        return result

    def _bind(self, pod: PodRef, node: str, decide: Decide) -> BindResult:
        live = self._current_pod(pod)
        if isinstance(live, str):
            return BindResult(error=live)
        bound_to = _node_of(live)
        if bound_to:
            return self._already_bound(pod, node, live, bound_to)
        if _terminal(live):
            return BindResult(error=f"pod {pod.key} has ended ({live['status']['phase']}); nothing to bind")

        stamp = rfc3339(self._clock.now())
        reserved = self._reserve(pod, node, decide, stamp)
        if isinstance(reserved, str):
            return BindResult(error=reserved)
        annotations = record_annotations(reserved, self._options.prefix, ALLOCATING, stamp)
        try:
            self._api.patch_pod(pod.namespace, pod.name, {"metadata": {"annotations": annotations}})
        except KubeError as exc:
            undone = self._undo(pod, node, annotations)
            return BindResult(error=f"writing the allocation record of {pod.key} failed ({exc}); {undone}")

        try:
            self._api.bind_pod(pod.namespace, pod.name, self._binding(pod, node))
        except KubeError as exc:
            outcome = self._binding_outcome(pod, node, exc, annotations)
            if outcome != "bound":
                return BindResult(error=f"binding {pod.key} to {node} failed ({exc}); {outcome}")
            log.info(
                "the Binding call failed (%s) but %s is bound to %s",
                exc,
                pod.key,
                node,
                extra={"pod": pod.key, "node": node},
            )
        self._mark_bound(pod, node)
        return BindResult(allocation=reserved)

    def _current_pod(self, pod: PodRef) -> Mapping[str, Any] | str:
        try:
            live = self._api.get_pod(pod.namespace, pod.name)
        except NotFoundError:
            return f"pod {pod.key} does not exist (deleted before its bind)"
        uid = _meta(live).get("uid")
        if pod.uid and uid != pod.uid:
            return f"pod {pod.key} has uid {uid}, not {pod.uid}: it was deleted and recreated"
        return live

    def _already_bound(self, pod: PodRef, node: str, live: Mapping[str, Any], bound_to: str) -> BindResult:
        if bound_to != node:
            return BindResult(error=f"pod {pod.key} is already bound to node {bound_to}, not {node}")
        text = self._annotations(live).get(self._options.prefix + "allocation")
        if text is None:
            ledger = self._ledgers.read(node)
            entry = ledger.entries.get(pod.key)
            text = entry.record if entry is not None and entry.uid == pod.uid else None
        if text is None:
            return BindResult(error=f"pod {pod.key} is bound to {node} without a gpuslice allocation record")
        try:
            alloc = decode_record(text, pod.key)
        except GpusliceError as exc:
            return BindResult(error=f"pod {pod.key} is bound to {node} with an unreadable record: {exc}")
        if alloc.node != node:
            return BindResult(error=f"pod {pod.key} is bound to {node} but its record is for {alloc.node}")
        return BindResult(allocation=alloc)

    def _binding(self, pod: PodRef, node: str) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "name": pod.name,
            "namespace": pod.namespace,
            "annotations": {self._options.prefix + "bind-phase": BOUND},
        }
        if pod.uid:
            meta["uid"] = pod.uid  # the API server refuses the Binding if the pod was recreated meanwhile
        return {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }

    # ------------------------------------------------------------ the ledger step

    def _reserve(self, pod: PodRef, node: str, decide: Decide, stamp: str) -> Allocation | str:
        """Decide under the node's serialisation and persist the entry; the allocation, or why not."""
        attempts = self._options.conflict_retries
        with self._node_lock(node):
            for attempt in range(attempts):
                ledger = self._ledgers.read(node)
                entries, records = self._current(ledger, pod, node)
                try:
                    outcome = decide(records)
                except GpusliceError as exc:
                    outcome = str(exc)
                if isinstance(outcome, str):
                    return f"no share for {pod.key} on {node}: {outcome}"
                if outcome.node != node:
                    return f"the allocation decided for {pod.key} is on {outcome.node}, not {node}"
                entry = Entry(pod.uid, encode_record(outcome, stamp), ALLOCATING, stamp)
                entries[pod.key] = entry
                try:
                    self._ledgers.write(ledger, entries)
                    return outcome
                except ConflictError:
                    pass  # another bind wrote first: decide again against what it wrote
                except ApiUnavailableError as exc:
                    # The write may have landed; if it did, it is ours to keep.
                    if self._ledgers.read(node).entries.get(pod.key) == entry:
                        return outcome
                    log.info(
                        "ledger write for %s got no answer (%s); retrying",
                        pod.key,
                        exc,
                        extra={"pod": pod.key, "node": node},
                    )
                self._pause(attempt)
        return f"the ledger of node {node} changed under {attempts} attempts in a row; try again"

    def _pause(self, attempt: int) -> None:
        limit = min(self._options.conflict_backoff_s * 2**attempt, 1.0)
        self._sleeper.wait(self._rng.uniform(0, limit))

    def _current(self, ledger: Ledger, pod: PodRef, node: str) -> tuple[dict[str, Entry], list[tuple[str, str]]]:
        """The ledger entries still valid, and the (pod, record) pairs ``decide`` must respect."""
        listed = self._api.list("pods", field_selector=f"spec.nodeName={node}")
        items = listed.get("items")
        on_node = {
            _key(p): p
            for p in (items if isinstance(items, list) else [])
            if isinstance(p, Mapping) and _node_of(p) == node and not _terminal(p)
        }
        records: dict[str, str] = {}
        for key, live in on_node.items():
            text = self._annotations(live).get(self._options.prefix + "allocation")
            if isinstance(text, str) and key != pod.key:
                records[key] = text
        kept: dict[str, Entry] = {}
        for key, entry in ledger.entries.items():
            if key == pod.key:
                continue  # this pod's earlier, unfinished attempt: replaced by this one
            live_here = on_node.get(key)
            if live_here is not None:
                keep = _meta(live_here).get("uid") == entry.uid
            else:
                keep = self._still_reserving(key, entry, node)
            if keep:
                kept[key] = entry
                records.setdefault(key, entry.record)
        return kept, sorted(records.items())

    def _still_reserving(self, key: str, entry: Entry, node: str) -> bool:
        """Whether a ledger entry for a pod not listed on ``node`` still holds its share."""
        namespace, _, name = key.partition("/")
        try:
            live = self._api.get_pod(namespace, name)
        except NotFoundError:
            return False
        except KubeError:
            return True  # unknown: keeping a reservation is safe, dropping one is not
        if _meta(live).get("uid") != entry.uid or _terminal(live):
            return False
        bound_to = _node_of(live)
        if bound_to:
            return bound_to == node  # bound here after the list was read, or elsewhere
        started = parse_rfc3339(entry.time)
        stale = started is None or self._clock.now() - started > timedelta(seconds=self._options.stale_allocation_s)
        if stale:
            log.info(
                "dropping the stale reservation of %s on %s (since %s)",
                key,
                node,
                entry.time,
                extra={"pod": key, "node": node},
            )
            self._strip_record(live, entry)
        return not stale

    def _strip_record(self, live: Mapping[str, Any], entry: Entry) -> None:
        """Remove the record a stale reservation left on its (unbound) pod, unless the pod changed since."""
        notes = self._annotations(live)
        prefix = self._options.prefix
        if notes.get(prefix + "allocation") != entry.record or notes.get(prefix + "bind-phase") != ALLOCATING:
            return  # none, or a newer attempt's
        try:
            written = record_annotations(decode_record(entry.record, _key(live)), prefix, ALLOCATING, "")
        except GpusliceError:
            return
        meta = _meta(live)
        patch = {"metadata": {"resourceVersion": meta.get("resourceVersion"), "annotations": dict.fromkeys(written)}}
        try:
            self._api.patch_pod(str(meta.get("namespace") or "default"), str(meta.get("name")), patch)
        except KubeError as exc:  # changed meanwhile (409) or gone: nothing of ours to clean
            log.info("left the stale record of %s alone: %s", _key(live), exc, extra={"pod": _key(live)})

    # ------------------------------------------------------------ after the Binding call

    def _binding_outcome(self, pod: PodRef, node: str, exc: KubeError, annotations: Mapping[str, str]) -> str:
        """``bound`` if the pod is on the node after all; otherwise what was done about the reservation."""
        try:
            live = self._api.get_pod(pod.namespace, pod.name)
        except NotFoundError:
            return self._undo(pod, node, None)
        except KubeError as check:
            return f"whether the Binding exists is unknown ({check}); the share stays reserved"
        if _meta(live).get("uid") != pod.uid:
            return self._undo(pod, node, None)  # another pod of that name now: not ours to touch
        if _node_of(live) == node:
            return "bound"
        if _node_of(live) or (isinstance(exc, ApiStatusError) and exc.status < 500):
            return self._undo(pod, node, annotations)
        return (
            "the Binding may still land, so the share stays reserved until the pod's next bind "
            f"or for {self._options.stale_allocation_s:g}s"
        )

    def _mark_bound(self, pod: PodRef, node: str) -> None:
        problem = f"{self._options.conflict_retries} conflicting writes"
        for attempt in range(self._options.conflict_retries):
            try:
                ledger = self._ledgers.read(node)
                entry = ledger.entries.get(pod.key)
                if entry is None or entry.uid != pod.uid or entry.phase == BOUND:
                    return
                marked = Entry(entry.uid, entry.record, BOUND, entry.time)
                self._ledgers.write(ledger, {**ledger.entries, pod.key: marked})
                return
            except ConflictError:
                self._pause(attempt)
            except KubeError as exc:
                problem = str(exc)
                break
        log.warning(
            "%s is bound to %s, but its ledger entry is still marked allocating (%s)",
            pod.key,
            node,
            problem,
            extra={"pod": pod.key, "node": node},
        )

    def _undo(self, pod: PodRef, node: str, annotations: Mapping[str, str] | None) -> str:
        """Remove the pod's ledger entry and (when given) its record annotations; says what was undone."""
        problems = []
        for attempt in range(self._options.conflict_retries):
            try:
                ledger = self._ledgers.read(node)
                entry = ledger.entries.get(pod.key)
                if entry is not None and entry.uid == pod.uid:
                    self._ledgers.write(ledger, {k: e for k, e in ledger.entries.items() if k != pod.key})
                break
            except ConflictError:
                self._pause(attempt)
            except KubeError as exc:
                problems.append(f"its ledger entry stays until dropped as stale ({exc})")
                break
        if annotations:
            patch = {"metadata": {"annotations": dict.fromkeys(annotations)}}
            try:
                self._api.patch_pod(pod.namespace, pod.name, patch)
            except NotFoundError:
                pass
            except KubeError as exc:
                problems.append(f"its record annotations stay ({exc})")
        if problems:
            return "rolled back partly: " + "; ".join(problems)
        return "the allocation was rolled back"
