"""Bind: give a pod one concrete share on a node and bind it there, never giving a share twice.

Steps, for pod P and node N:

1. GET P, unless the pods' watch shows P pending, with the uid kube-scheduler sent and no
   annotation of ours. Gone, another uid, or terminal: fail. Already on N with a record: done
   (idempotent). A P taken unread as the watch shows it is checked later instead: the
   Binding's uid precondition refuses a P deleted or recreated since; a Binding refused
   because P is bound already leaves the bind only if P carries this bind's record; and a P
   bound since by an earlier bind whose answer was lost (the watch lagging) has an entry in
   N's ledger: step 2 meeting an entry of P returns here, to the GET, before writing anything.
2. Under N's ledger (one lock per node in this process; across replicas, the ledger's
   compare-and-set): decide on the ledger as this process last wrote or read it, every entry
   kept, without a call; where it remembers none and the ledgers' watch knows none either, on
   an empty ledger, which the write creates (refused if one exists after all). Where none is
   remembered, or that decision is "no" (a share freed elsewhere since would not show in it),
   read the ledger and, where it holds entries of other pods, the pods bound to N, and drop
   entries whose pod is gone, terminal, of another uid, bound elsewhere, or unbound for longer
   than ``stale_allocation_s``. ``decide`` gets the records of the entries kept (the ledger's
   record: a record edited on the pod after its bind does not free the share it holds, and a
   record on a pod the ledger does not hold claims nothing). Write the ledger with P's entry
   (phase allocating), guarded by the resourceVersion the decision was made on: a version
   changed since is refused (409; a remembered one is forgotten), and the ledger is read and
   decided on again, a bounded number of times with jittered, doubling waits. An entry of a pod
   gone since stays until such a read or the sweep drops it: a share held a little longer,
   never one given twice.
3. Only where P carries annotations of ours (forged, or an earlier attempt's): merge-patch
   P's annotations, removing those this record does not set and writing the record (phase
   allocating); a Binding can add annotations, never remove one.
4. Create the Binding, with P's uid as precondition and the record and ``bind-phase: bound``
   in its annotations, which the API server copies onto the pod as it sets
   ``spec.nodeName``: record, phase and node change in one write.

So a bind of a pod the watch shows pending makes two calls (the ledger, the Binding); one
that reads the pod, three. An entry's phase says what its writer knew: ``allocating`` for the
entry a bind writes, ``bound`` for the entries of pods the pods' watch showed bound on N when
the ledger was written next (by another bind or the sweep). Nothing decides on the phase: a
live pod on N with the entry's uid counts, whatever its entry says, and the bind makes no call
to mark its own entry.

A failure in 2-3, or a Binding refused with a 4xx, undoes what was written (the ledger
entry, by compare-and-set, and the annotations). A Binding that got no answer or a 5xx
may have happened: if a GET shows P on N with this bind's record it did, and the bind
succeeds; otherwise the share stays reserved (the pod is requeued, and the entry is
replaced by P's next bind or dropped as stale), because releasing a share that is in use
is the one mistake that double-books. Once the Binding exists the pod is bound, whatever fails later.

What counts on a node: every ledger entry still holding or reserving its share, with the
record the ledger has. The ledger, which only gpuslice writes, is the source of truth of what
gpuslice bound: a record on a pod it holds no entry for claims nothing and blocks nothing,
whatever its ``bind-phase`` says (any namespace can write its pods' annotations, so a pod of
another scheduler, or one gpuslice never bound, may carry ``bind-phase: bound`` by hand).

:meth:`Binder.sweep`, run every ``sweep_interval_s``, cleans what an interrupted bind
left (a crash, a timeout whose write landed after its undo): ledger entries of pods
gone, ended, bound elsewhere or unbound past ``stale_allocation_s`` are dropped, entries
of bound pods are marked bound, and a record of ours on an unbound pod that no ledger
entry vouches for is removed once stale. It visits only the ledgers holding an entry whose
pod the pods' watch does not show live and bound on that node with that uid. So nothing
half-written outlives ``stale_allocation_s + sweep_interval_s``.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NamedTuple

from scheduler.backend import Admit, BindResult, Decide, PodRef
from scheduler.core.allocation import Allocation, decode_record, encode_record, record_annotations, record_header
from scheduler.core.errors import GpusliceError
from scheduler.core.pods import ALLOCATING, BOUND, has_ended, key_of, node_of
from scheduler.core.request import OUTPUT_KEYS

from .api import KubeApi
from .clock import Clock, parse_rfc3339, rfc3339
from .errors import ApiStatusError, ApiUnavailableError, ConflictError, KubeError, NotFoundError
from .ledger import MANAGED_BY, Entry, Ledger, LedgerStore, decode_entries
from .options import KubeOptions
from .quotaledger import QuotaLedgers

log = logging.getLogger("gpuslice.kube.bind")

# Annotations gpuslice writes on pods; a bind sets its own and removes any other left there.
POD_OUTPUT_KEYS = tuple(sorted(OUTPUT_KEYS - {"inventory"}))
LEDGER_SELECTOR = ",".join(f"{k}={v}" for k, v in sorted(MANAGED_BY.items()))


class WatchedPod(NamedTuple):
    """A live (not ended) pod as the pods' watch last showed it."""

    uid: str
    node: str  # "" while pending
    ours: bool  # carries annotations of gpuslice's (its bind patches them first)


Watched = Callable[[str], "WatchedPod | None"]  # pod key -> the pod as watched, None if unknown or ended
UNSURE = "unsure"  # _reserve: the ledger holds an entry of a pod taken as pending unread


@dataclass(slots=True)
class Sweep:
    """What one :meth:`Binder.sweep` did."""

    ledgers: int = 0  # ledgers looked at
    entries_dropped: int = 0
    entries_marked_bound: int = 0
    records_removed: int = 0  # records of ours on unbound pods that nothing vouched for
    problems: int = 0  # API calls that failed (the next sweep tries again)


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _bound_here(seen: WatchedPod | None, entry: Entry, node: str) -> bool:
    """Whether the watch shows the entry's pod (its uid) bound on ``node``."""
    return seen is not None and seen.node == node and seen.uid == entry.uid


class Binder:
    def __init__(
        self,
        api: KubeApi,
        options: KubeOptions,
        clock: Clock,
        rng: random.Random,
        ledger_absent: Callable[[str], bool] | None = None,
        watched: Watched | None = None,
    ) -> None:
        """``ledger_absent(node)``: the watch of the ledgers, synced, knows none of ``node`` (a
        node's first bind then makes its ledger without reading it first: the create fails if
        one exists after all, and the ledger is read as after any conflict). Without it, a
        ledger this process remembers none of is always read. ``watched(pod key)``: the pod as
        the pods' watch shows it, None where unknown or ended: a pod shown pending is bound
        without reading it first; entries of pods shown bound on their node are marked bound as
        a ledger is written, and tell the sweep which ledgers to skip. Without it every pod is
        read and the sweep visits every ledger with entries."""
        self._api = api
        self._options = options
        self._clock = clock
        self._rng = rng
        self._ledger_absent = ledger_absent or (lambda _node: False)
        self._watched: Watched = watched or (lambda _key: None)
        self._ledgers = LedgerStore(api, options.namespace, options.prefix)
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._sleeper = threading.Event()  # never set: a wait on it is a sleep
        self._quotas = QuotaLedgers(api, options, clock, self._pause)

    def _node_lock(self, node: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(node, threading.Lock())

    def _annotations(self, pod: Mapping[str, Any]) -> Mapping[str, Any]:
        annotations = _meta(pod).get("annotations")
        return annotations if isinstance(annotations, Mapping) else {}

    # ------------------------------------------------------------ the bind

    def bind(self, pod: PodRef, node: str, decide: Decide, admit: Admit | None = None) -> BindResult:
        where = {"pod": pod.key, "node": node}
        try:
            result = self._bind(pod, node, decide, admit)
        except KubeError as exc:
            result = BindResult(error=f"bind {pod.key} to {node}: {exc}")
        if result.error:
            log.warning("bind failed: %s", result.error, extra=where)
        else:
            log.info("bound %s to %s", pod.key, node, extra=where)
        return result

    def _bind(
        self, pod: PodRef, node: str, decide: Decide, admit: Admit | None = None, read: bool = False
    ) -> BindResult:
        live: Mapping[str, Any] | None = None  # None: taken as the watch shows it, pending
        if read or not pod.uid or self._watched(pod.key) != WatchedPod(pod.uid, "", False):
            got = self._current_pod(pod)
            if isinstance(got, str):
                return BindResult(error=got)
            bound_to = node_of(got)
            if bound_to:
                return self._already_bound(pod, node, got, bound_to)
            if has_ended(got):
                return BindResult(error=f"pod {pod.key} has ended ({got['status']['phase']}); nothing to bind")
            live = got

        stamp = rfc3339(self._clock.now())
        reserved = self._reserve(pod, node, decide, stamp, unread=live is None)
        if reserved == UNSURE:  # an earlier bind of the pod may have landed: read the pod first
            return self._bind(pod, node, decide, admit, read=True)
        if isinstance(reserved, str):
            return BindResult(error=reserved)
        if admit is not None:  # a namespace with a GPU quota: its own compare-and-set (quotaledger)
            refused = self._quotas.admit(pod, reserved, stamp, admit)
            if refused is not None:
                return BindResult(error=f"{refused}; {self._undo(pod, node, None)}")
        prefix = self._options.prefix
        annotations = record_annotations(reserved, prefix, ALLOCATING, stamp)
        # A pod that carries annotations of ours (forged, or an earlier attempt's) is patched
        # first: those this record does not set must go, and a Binding's annotations are added
        # to the pod's, never removed. Else the record travels in the Binding alone (one call;
        # record, phase and node in one write).
        present = self._annotations(live) if live is not None else {}
        written: Mapping[str, str] | None = None
        if any(prefix + k in present for k in POD_OUTPUT_KEYS):
            stale_keys = {prefix + k: None for k in POD_OUTPUT_KEYS}
            try:
                self._api.patch_pod(
                    pod.namespace, pod.name, {"metadata": {"annotations": {**stale_keys, **annotations}}}
                )
            except KubeError as exc:
                undone = self._undo(pod, node, annotations)
                return BindResult(error=f"writing the allocation record of {pod.key} failed ({exc}); {undone}")
            written = annotations

        try:
            self._api.bind_pod(pod.namespace, pod.name, self._binding(pod, node, annotations))
        except KubeError as exc:
            outcome = self._binding_outcome(pod, node, exc, written, annotations[prefix + "allocation"])
            if outcome != "bound":
                return BindResult(error=f"binding {pod.key} to {node} failed ({exc}); {outcome}")
            log.info(
                "the Binding call failed (%s) but %s is bound to %s",
                exc,
                pod.key,
                node,
                extra={"pod": pod.key, "node": node},
            )
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

    def _binding(self, pod: PodRef, node: str, annotations: Mapping[str, str]) -> dict[str, Any]:
        """The Binding; the API server copies its annotations onto the pod as it sets the node."""
        meta: dict[str, Any] = {
            "name": pod.name,
            "namespace": pod.namespace,
            "annotations": {**annotations, self._options.prefix + "bind-phase": BOUND},
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

    def _reserve(self, pod: PodRef, node: str, decide: Decide, stamp: str, unread: bool) -> Allocation | str:
        """Decide under the node's serialisation and persist the entry; the allocation, or why not.
        ``unread``: the pod was not read (the watch shows it pending); a ledger holding an entry
        of it answers :data:`UNSURE` before anything is written (an earlier bind may have bound it)."""
        attempts = self._options.conflict_retries
        with self._node_lock(node):
            for attempt in range(attempts):
                # First as this process last wrote it (no call); a conflict, or a "no" decided on
                # that version (a share freed elsewhere since would not show in it), reads it
                # again from the API server.
                ledger = self._ledgers.known(node)  # a failed write forgets it
                if ledger is None and attempt == 0 and self._ledger_absent(node):
                    ledger = Ledger(node, None, {})  # none yet, as the watch knows: made by the write
                if unread and ledger is not None and pod.key in ledger.entries:
                    return UNSURE
                if ledger is not None:
                    entries, outcome = self._decide(ledger, pod, decide, remembered=True)
                if ledger is None or isinstance(outcome, str):
                    ledger = self._ledgers.read(node)
                    if unread and pod.key in ledger.entries:
                        return UNSURE
                    entries, outcome = self._decide(ledger, pod, decide, remembered=False)
                if isinstance(outcome, str):
                    return f"no share for {pod.key} on {node}: {outcome}"
                if outcome.node != node:
                    return f"the allocation decided for {pod.key} is on {outcome.node}, not {node}"
                entry = Entry(pod.uid, encode_record(outcome, stamp), ALLOCATING, stamp)
                entries = self._marked(node, entries)
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

    def _decide(
        self, ledger: Ledger, pod: PodRef, decide: Decide, remembered: bool
    ) -> tuple[dict[str, Entry], Allocation | str]:
        """``decide`` against ``ledger``: the entries it keeps, and the allocation or why not.
        A ``remembered`` ledger keeps every entry (no call: an entry of a pod gone since holds
        its share a little longer, which is safe, and a "no" it causes reads the ledger again);
        else entries of pods gone, ended or stale are dropped (the pods on the node listed)."""
        if remembered:
            entries = {k: e for k, e in ledger.entries.items() if k != pod.key}
            records = sorted((k, e.record) for k, e in entries.items())
        else:
            entries, records = self._current(ledger, ledger.node, pod.key)
        try:
            return entries, decide(records)
        except GpusliceError as exc:
            return entries, str(exc)

    def _marked(self, node: str, entries: Mapping[str, Entry]) -> dict[str, Entry]:
        """``entries`` with those of pods the watch shows bound on ``node`` (their uid) marked bound."""
        watched = self._watched
        return {key: e.bound() if _bound_here(watched(key), e, node) else e for key, e in entries.items()}

    def _pause(self, attempt: int) -> None:
        limit = min(self._options.conflict_backoff_s * 2**attempt, 1.0)
        self._sleeper.wait(self._rng.uniform(0, limit))

    def _on_node(self, node: str) -> dict[str, Mapping[str, Any]]:
        listed = self._api.list("pods", field_selector=f"spec.nodeName={node}")
        items = listed.get("items")
        return {
            key_of(p): p
            for p in (items if isinstance(items, list) else [])
            if isinstance(p, Mapping) and node_of(p) == node and not has_ended(p)
        }

    def _current(
        self, ledger: Ledger, node: str, skip: str | None, on_node: Mapping[str, Mapping[str, Any]] | None = None
    ) -> tuple[dict[str, Entry], list[tuple[str, str]]]:
        """The ledger entries still valid, and the (pod, record) pairs ``decide`` must respect.

        ``skip`` is the pod being bound: its earlier, unfinished attempt is replaced by this one.
        The pods on the node are listed only where some entry is left to weigh (a node's first
        bind, its ledger not made yet, lists nothing)."""
        if on_node is None:
            on_node = self._on_node(node) if any(key != skip for key in ledger.entries) else {}
        records: dict[str, str] = {}
        kept: dict[str, Entry] = {}
        for key, entry in ledger.entries.items():
            if key == skip:
                continue
            live_here = on_node.get(key)
            if live_here is not None:
                keep = _meta(live_here).get("uid") == entry.uid
            else:
                keep = self._still_reserving(key, entry, node)
            if keep:
                kept[key] = entry
                # only what gpuslice bound counts, as it bound it: a record edited after the bind
                # (while the update webhook was down) must not free the share the pod holds, and a
                # record the ledger does not hold (written by hand) claims nothing
                records[key] = entry.record
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
        if _meta(live).get("uid") != entry.uid or has_ended(live):
            return False
        bound_to = node_of(live)
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

    def _strip_record(self, live: Mapping[str, Any], entry: Entry) -> bool:
        """Remove the record a stale reservation left on its (unbound) pod, unless the pod changed since."""
        notes = self._annotations(live)
        prefix = self._options.prefix
        if notes.get(prefix + "allocation") != entry.record or notes.get(prefix + "bind-phase") != ALLOCATING:
            return False  # none, or a newer attempt's
        meta = _meta(live)
        patch = {
            "metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                "annotations": {prefix + k: None for k in POD_OUTPUT_KEYS},
            }
        }
        try:
            self._api.patch_pod(str(meta.get("namespace") or "default"), str(meta.get("name")), patch)
        except KubeError as exc:  # changed meanwhile (409) or gone: nothing of ours to clean
            log.info("left the stale record of %s alone: %s", key_of(live), exc, extra={"pod": key_of(live)})
            return False
        return True

    # ------------------------------------------------------------ the sweep

    def sweep(self) -> Sweep:
        """Clean what interrupted binds left behind, on every node (see the module docstring).

        Ledgers whose every entry's pod the watch shows bound on the ledger's node (``watched``)
        are skipped without a call. Every write is a compare-and-set (the ledger) or
        resourceVersion-guarded (the pod), so replicas may sweep at once.
        """
        report = Sweep()
        try:
            listed = self._api.list_configmaps(self._options.namespace, LEDGER_SELECTOR)
        except KubeError as exc:
            log.warning("sweep: cannot list the node ledgers: %s", exc)
            report.problems += 1
            return report
        vouched: dict[tuple[str, str], Entry] = {}
        items = listed.get("items")
        for cm in items if isinstance(items, list) else []:
            notes = _meta(cm).get("annotations") if isinstance(cm, Mapping) else None
            node = notes.get(self._options.prefix + "node") if isinstance(notes, Mapping) else None
            if not isinstance(node, str) or not node:
                continue
            data = cm.get("data")
            raw = data.get("ledger") if isinstance(data, Mapping) else None
            if not self._worth_sweeping(node, raw):
                continue
            report.ledgers += 1
            try:
                kept = self._sweep_node(node, report)
            except KubeError as exc:
                log.warning("sweep: ledger of node %s: %s", node, exc, extra={"node": node})
                report.problems += 1
                continue
            vouched.update(((node, key), entry) for key, entry in kept.items())
        try:
            self._sweep_unbound(vouched, report)
        except KubeError as exc:
            log.warning("sweep: cannot list the unbound pods: %s", exc)
            report.problems += 1
        if report.entries_dropped or report.records_removed or report.entries_marked_bound:
            log.info(
                "sweep: dropped %d ledger entries, removed %d records, marked %d entries bound",
                report.entries_dropped,
                report.records_removed,
                report.entries_marked_bound,
            )
        return report

    def _worth_sweeping(self, node: str, raw: object) -> bool:
        """Whether a ledger may hold something to clean: an entry whose pod the watch does not
        show bound on ``node`` (unbound yet, gone, ended, recreated or bound elsewhere)."""
        watched = self._watched
        return any(not _bound_here(watched(key), e, node) for key, e in decode_entries(node, raw).items())

    def _sweep_node(self, node: str, report: Sweep) -> dict[str, Entry]:
        with self._node_lock(node):
            for attempt in range(self._options.conflict_retries):
                ledger = self._ledgers.read(node)
                on_node = self._on_node(node)
                kept, _ = self._current(ledger, node, None, on_node)
                marked = {key: e.bound() if key in on_node else e for key, e in kept.items()}
                if marked == dict(ledger.entries):
                    return marked
                try:
                    self._ledgers.write(ledger, marked)
                except ConflictError:
                    self._pause(attempt)
                    continue
                report.entries_dropped += len(set(ledger.entries) - set(marked))
                report.entries_marked_bound += sum(1 for k, e in marked.items() if e != kept[k])
                return marked
        return dict(self._ledgers.read(node).entries)

    def _sweep_unbound(self, vouched: Mapping[tuple[str, str], Entry], report: Sweep) -> None:
        """Remove stale records of ours (phase allocating) from unbound pods that no ledger entry holds."""
        prefix = self._options.prefix
        listed = self._api.list("pods", field_selector="spec.nodeName=")
        items = listed.get("items")
        limit = timedelta(seconds=self._options.stale_allocation_s)
        now = self._clock.now()
        for live in items if isinstance(items, list) else []:
            if not isinstance(live, Mapping) or node_of(live):
                continue
            notes = self._annotations(live)
            text = notes.get(prefix + "allocation")
            if not isinstance(text, str) or notes.get(prefix + "bind-phase") != ALLOCATING:
                continue
            key = key_of(live)
            node, stamp = record_header(text)
            entry = vouched.get((node or "", key))
            if entry is not None and entry.uid == _meta(live).get("uid") and entry.record == text:
                continue  # a bind still holding its share (or waiting to be retried)
            started = parse_rfc3339(stamp)
            if started is not None and now - started <= limit:
                continue  # maybe a bind in progress whose ledger entry this sweep read before it was written
            uid = str(_meta(live).get("uid") or "")
            if self._strip_record(live, Entry(uid, text, ALLOCATING, stamp or "")):
                report.records_removed += 1
                log.info("sweep: removed the record left on unbound pod %s", key, extra={"pod": key})

    # ------------------------------------------------------------ after the Binding call

    def _binding_outcome(
        self, pod: PodRef, node: str, exc: KubeError, annotations: Mapping[str, str] | None, record: str
    ) -> str:
        """``bound`` if the pod is on the node after all, with this bind's ``record`` (the Binding
        landed); otherwise what was done about the reservation."""
        try:
            live = self._api.get_pod(pod.namespace, pod.name)
        except NotFoundError:
            return self._undo(pod, node, None)
        except KubeError as check:
            return f"whether the Binding exists is unknown ({check}); the share stays reserved"
        if _meta(live).get("uid") != pod.uid:
            return self._undo(pod, node, None)  # another pod of that name now: not ours to touch
        if node_of(live) == node and self._annotations(live).get(self._options.prefix + "allocation") == record:
            return "bound"
        if node_of(live) or (isinstance(exc, ApiStatusError) and exc.status < 500):
            return self._undo(pod, node, annotations)
        return (
            "the Binding may still land, so the share stays reserved until the pod's next bind "
            f"or for {self._options.stale_allocation_s:g}s"
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
