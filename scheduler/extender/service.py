"""filter, prioritize, bind and preempt on the packing core; no HTTP here (see ``app``).

Every call reads the cluster cache under its lock; bind decides against the records the
backend hands it under the node's serialisation, never against the cache, and counts
its decision in the cache at once so the next filter sees it.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from scheduler import logs
from scheduler.backend import Backend, PodRef
from scheduler.core.allocation import Allocation
from scheduler.core.errors import RequestError
from scheduler.core.memo import intern
from scheduler.core.policies import REGISTRY, Policy, make_policy
from scheduler.core.request import GpuKind, PodRequest, parse_pod
from scheduler.core.select import Scoreboard, evaluate, fit_cached, placement_key
from scheduler.core.state import rebuild

from . import wire
from .cache import ClusterCache, with_oversubscription
from .config import ServeConfig
from .debug import DeviceRow, describe, device_rows
from .metrics import Metrics
from .problems import reporting_invalid_nodes

log = logs.get("extender")

_PARSE_CACHE = 8192
UNKNOWN_NODE = "node unknown to gpuslice"


class Extender:
    def __init__(self, config: ServeConfig, backend: Backend, cache: ClusterCache | None = None) -> None:
        self.config = config
        self.backend = backend
        self.cache = cache or ClusterCache(
            config.prefix,
            with_oversubscription(config.mps_compute_oversub_pct, config.ts_memory_oversub_pct, config.prefix),
        )
        self.policy = config.make_policy()
        self._policies: dict[str, Policy] = {self.policy.name: self.policy}
        self._parsed: OrderedDict[tuple[str, str], PodRequest | RequestError] = OrderedDict()
        self._recent: OrderedDict[str, PodRequest] = OrderedDict()  # uid -> request seen in filter
        self.metrics = Metrics(self._device_rows, self.cache.unusable)
        self._listings: dict[str, _Listing] = {}  # "filter", "prioritize" -> the last list each got
        self.names = wire.NameLists()  # NodeNames arrays met lately, for parse_args and the answers
        self._board_entries: tuple[int, np.ndarray] = (-1, np.empty((2, 0), dtype=object))
        self.synced = False  # the first full sync is in (the verbs answer "not ready" before)

    def start(self) -> None:
        """The backend's first full sync (it returns once every node and pod is in), then its watch."""
        self.backend.start(reporting_invalid_nodes(self.cache.on_change, self.cache.problem, self.backend))
        self.synced = True

    def stop(self) -> None:
        self.backend.stop()

    # ------------------------------------------------------------ pods

    def parse(self, pod: Mapping[str, Any]) -> PodRequest:
        """The pod's request, cached per uid and resourceVersion; RequestError if malformed."""
        meta = pod.get("metadata")
        key = None
        if isinstance(meta, Mapping):
            uid, version = meta.get("uid"), meta.get("resourceVersion")
            if isinstance(uid, str) and uid and isinstance(version, str) and version:
                key = (uid, version)
        hit = self._parsed.get(key) if key is not None else None
        if hit is None:
            try:
                hit = parse_pod(pod, self.config.prefix, REGISTRY)
            except RequestError as exc:
                hit = exc
            if key is not None:
                self._parsed[key] = hit
                if len(self._parsed) > _PARSE_CACHE:
                    self._parsed.popitem(last=False)
            if isinstance(hit, PodRequest):
                self.policy_for(hit).observe(hit.demand)
                if hit.uid:
                    self._recent[hit.uid] = hit
                    if len(self._recent) > _PARSE_CACHE:
                        self._recent.popitem(last=False)
        if isinstance(hit, RequestError):
            raise hit
        return hit

    def policy_for(self, request: PodRequest) -> Policy:
        name = request.policy or self.policy.name
        policy = self._policies.get(name)
        if policy is None:
            policy = self._policies[name] = make_policy(name)
        return policy

    # ------------------------------------------------------------ filter / prioritize

    def _listing(self, names: Sequence[str], slot: str) -> _Listing:
        """``names`` with their board positions, kept per ``slot`` while the same list comes again.

        kube-scheduler sends filter the same list again and again, and prioritize the list
        filter passed: comparing with the last list is cheaper than thousands of look-ups.
        Caller holds the lock.
        """
        cache = self.cache
        last = self._listings.get(slot)
        if last is not None and last.layout == cache.layout and (last.names is names or last.names == names):
            return last
        listing = _Listing(
            cache.layout, names if isinstance(names, list) else list(names), cache.board.positions(names)
        )
        self._listings[slot] = listing
        return listing

    def _entries(self) -> np.ndarray:
        """Per board position, the node's name and its encoded HostPriority (``wire.host_entry``)."""
        cache = self.cache
        if self._board_entries[0] != cache.layout:
            names = [s.node.name for s in cache.board.states]
            entries = np.empty((2, len(names)), dtype=object)
            entries[0] = names
            entries[1] = [wire.host_entry(n) for n in names]
            self._board_entries = (cache.layout, entries)
        return self._board_entries[1]

    def _scores(self, policy: Policy, request: PodRequest, listing: _Listing) -> np.ndarray:
        """Each listed node's score, -inf where the pod does not fit or the node is unknown. Caller holds the lock."""
        board = self.cache.board
        positions = listing.positions
        if listing.all_known:
            picked: np.ndarray = board.scores(policy, request.demand)[positions]
            return picked
        scores = np.full(len(positions), -np.inf)
        known = positions >= 0
        if known.any():
            scores[known] = board.scores(policy, request.demand)[positions[known]]
        return scores

    def filter(self, args: wire.ExtenderArgs) -> bytes:
        try:
            request = self.parse(args.pod)
        except RequestError as exc:
            log.info("filter: malformed request", extra={"pod": _pod_key(args.pod), "reason": str(exc)})
            self.metrics.reject(["malformed request"] * len(args.names))
            return wire.filter_result(args, (), None, dict.fromkeys(args.names, str(exc)))
        if not self.backend.ready():
            return wire.filter_result(None, error="gpuslice is not ready: the cluster state is not synced yet")
        if request.demand.gpu.kind is GpuKind.NONE:
            log.debug("filter: no GPU request", extra={"pod": request.key, "passed": len(args.names)})
            with self.cache.lock:  # prioritize will be asked about the same list
                self._listings["prioritize"] = listing = self._listing(args.names, "filter")
            return wire.filter_result(
                args, range(len(args.names)), passed_names=listing.names, names_json=self._names_json(args, listing)
            )
        policy = self.policy_for(request)
        failed: _Failures | None = None
        cache = self.cache
        demand = request.demand
        demand_key = intern(demand)
        placed_key = placement_key(policy, demand)  # the score table's memo key
        with cache.lock:
            listing = self._listing(args.names, "filter")
            fits = self._scores(policy, request, listing) > -np.inf
            # what prioritize will most likely be asked about next
            survivors = self._listings["prioritize"] = listing.survivors(fits, self._entries)
            passed_names = survivors.names
            failing = np.flatnonzero(~fits)
            seen = listing.verdict(demand_key, cache.inventory)
            seen.known |= fits  # a node the pod fits now would fit it empty: never asked again
            verdict = seen if len(failing) else None
            if verdict is not None:
                verdict.learn(
                    failing, listing, lambda name: cache.unresolvable(name, demand, demand_key), cache.problem
                )
                states = cache.board.states
                where = listing.positions

                def reason(i: int) -> str:
                    if where[i] < 0:
                        return UNKNOWN_NODE
                    # the score table has just evaluated this node: the reason is in its memo
                    result = evaluate(policy, demand, states[where[i]], placed_key)
                    return result if isinstance(result, str) else "no longer fits"

                failed = verdict.failures(placed_key).update(~fits & ~verdict.never, listing, cache.board, reason)
        unresolvable_json, tally = verdict.encoded(listing, fits) if verdict is not None else (None, None)
        if failed is not None:
            self.metrics.reject_counts(failed.tally)
        if tally:
            self.metrics.reject_counts(tally)
        log.info(
            "filter",
            extra={
                "pod": request.key,
                "request": request.demand.gpu.describe(),
                "passed": len(passed_names),
                "failed": len(failed.reasons) if failed is not None else 0,
                "unresolvable": verdict.count if verdict is not None else 0,
                "node": passed_names[0] if len(passed_names) == 1 else None,
            },
        )
        return wire.filter_result(
            args,
            np.flatnonzero(fits).tolist() if args.nodes is not None else [],
            passed_names=passed_names,
            failed_json=failed.encoded() if failed is not None else None,
            unresolvable_json=unresolvable_json,
            names_json=self._names_json(args, survivors),
        )

    def _names_json(self, args: wire.ExtenderArgs, passed: _Listing) -> bytes | None:
        """The passed names encoded, remembered so that prioritize's copy of them is not decoded again."""
        if args.nodes is not None:
            return None
        passed.raw = self.names.encode(passed.names, passed.raw)
        return passed.raw

    def prioritize(self, args: wire.ExtenderArgs) -> bytes:
        try:
            request = self.parse(args.pod)
        except RequestError as exc:
            log.info("prioritize: malformed request", extra={"pod": _pod_key(args.pod), "reason": str(exc)})
            return wire.host_priorities(args.names, [0] * len(args.names))
        policy = self.policy_for(request)
        with self.cache.lock:
            listing = self._listing(args.names, "prioritize")
            scores = self._scores(policy, request, listing)
            template = listing.template(self._entries) if listing.all_known else None
        fits = scores > -np.inf
        out = np.zeros(len(scores), dtype=np.int64)
        if fits.any():
            values = scores[fits]
            if type(policy).normalize is not Policy.normalize:
                values = np.asarray(policy.normalize(values.tolist()), dtype=np.float64)
            # core 0..100 -> extender 0..10, rounded half up
            out[fits] = np.clip(np.floor(values * wire.MAX_PRIORITY / 100 + 0.5), 0, wire.MAX_PRIORITY)
        if len(out):
            top = int(np.argmax(out))
            log.info(
                "prioritize",
                extra={"pod": request.key, "nodes": len(out), "node": listing.names[top], "score": int(out[top])},
            )
        if template is not None:
            return template.encode(out)
        return wire.host_priorities(listing.names, out.tolist())

    # ------------------------------------------------------------ bind

    def bind(self, args: wire.BindingArgs) -> str:
        """Bind and return "" on success, else the reason (the pod is then requeued)."""
        key = f"{args.namespace}/{args.name}"
        started = time.perf_counter()
        try:
            request, uid = self._bind_request(key, args)
        except RequestError as exc:
            return self._bound(key, args.node, "rejected", str(exc), started)
        if isinstance(request, str):
            return self._bound(key, args.node, "unknown-pod", request, started)
        policy = self.policy_for(request)
        cache = self.cache
        decided: list[Allocation] = []

        def decide(records: Sequence[tuple[str, str]]) -> Allocation | str:
            others = {k: text for k, text in records if k != key}
            with cache.lock:
                view = cache.nodes.get(args.node)
                node = view.node if view is not None else None
                problem = view.problem if view is not None else ""
                # The cache's state of the node, if it counts exactly these records: it is the
                # state rebuild() would give, with the placements filter just worked out in its memo.
                same = view is not None and not view.errors and key not in view.records and view.records == others
                counted = cache.state(args.node) if same else None
            if node is None:
                return f"node {args.node}: {problem}" if problem else f"node {args.node} is unknown to gpuslice"
            if counted is not None and counted.node is node:
                state = counted
            else:
                state, problems = rebuild(node, others.items())
                for p in problems:
                    log.warning(
                        "allocation record rejected", extra={"node": args.node, "pod": p.pod, "reason": p.problem}
                    )
            placed = evaluate(policy, request.demand, state)
            if isinstance(placed, str):
                return placed
            cache.reserve(key, uid, placed.allocation)
            decided.append(placed.allocation)
            return placed.allocation

        try:
            result = self.backend.bind(PodRef(args.namespace, args.name, uid), args.node, decide)
        except Exception as exc:  # a backend bug must requeue the pod, not crash the call
            log.exception("bind failed in the backend", extra={"pod": key, "node": args.node})
            if decided:
                cache.unreserve(key)
            return self._bound(key, args.node, "error", f"bind failed: {type(exc).__name__}: {exc}", started)
        if result.allocation is None:
            if decided:
                cache.unreserve(key)
            return self._bound(key, args.node, "failed", result.error or "bind failed", started)
        alloc = result.allocation
        return self._bound(key, args.node, "bound", "", started, alloc)

    def _bind_request(self, key: str, args: wire.BindingArgs) -> tuple[PodRequest | str, str]:
        with self.cache.lock:
            pod = self.cache.pods.get(key)
            obj = pod.obj if pod is not None else None
            uid = pod.uid if pod is not None else ""
        if pod is not None and args.uid and uid and uid != args.uid:
            return f"pod {key} has uid {uid}, not {args.uid}: it was replaced", args.uid
        if obj is not None:
            return self.parse(obj), uid or args.uid
        recent = self._recent.get(args.uid) if args.uid else None
        if recent is not None and recent.key == key:
            return recent, args.uid
        return f"pod {key} is not known to gpuslice yet; it will be retried", args.uid

    def _bound(
        self, key: str, node: str, outcome: str, error: str, started: float, alloc: Allocation | None = None
    ) -> str:
        self.metrics.binds.labels(outcome).inc()
        extra: dict[str, Any] = {
            "pod": key,
            "node": node,
            "outcome": outcome,
            "ms": round((time.perf_counter() - started) * 1000, 3),
        }
        if alloc is not None:
            extra["devices"] = [
                f"{s.index}:{s.mode.value}:{s.memory_mib}MiB:{s.compute_milli}m"
                + (f":{s.mig.profile}@{s.mig.start}" if s.mig else "")
                for s in alloc.shares
            ]
            log.info("bind", extra=extra)
        else:
            extra["reason"] = error
            log.warning("bind", extra=extra)
        return error

    # ------------------------------------------------------------ preempt

    def preempt(self, args: wire.PreemptionArgs) -> bytes:
        """Keep the nodes where evicting the proposed victims frees room for the pod's GPU request."""
        try:
            request = self.parse(args.pod)
        except RequestError as exc:
            log.info("preempt: malformed request", extra={"pod": _pod_key(args.pod), "reason": str(exc)})
            return wire.preemption_result({})
        if request.demand.gpu.kind is GpuKind.NONE:
            return wire.preemption_result(args.victims)
        kept: dict[str, tuple[list[str], int]] = {}
        cache = self.cache
        with cache.lock:
            for node, (uids, violations) in args.victims.items():
                state = cache.state(node)
                if state is None:
                    continue
                for uid in uids:
                    key = cache.key_of_uid(uid)
                    if key is not None:
                        state = state.release(key)
                if fit_cached(request.demand, state):
                    kept[node] = (uids, violations)
        log.info("preempt", extra={"pod": request.key, "candidates": len(args.victims), "kept": len(kept)})
        return wire.preemption_result(kept)

    # ------------------------------------------------------------ inspection

    def describe(self, name: str | None = None) -> list[dict[str, Any]]:
        cache = self.cache
        errors = cache.record_errors()
        inflight = cache.inflight()
        with cache.lock:
            names = sorted(cache.nodes) if name is None else ([name] if name in cache.nodes else [])
            return [
                describe(
                    n,
                    cache.state(n),
                    cache.problem(n),
                    errors.get(n),
                    [k for k, node in inflight.items() if node == n],
                )
                for n in names
            ]

    def _device_rows(self) -> Iterator[tuple[str, DeviceRow]]:
        for name, state in sorted(self.cache.snapshot().items()):
            for row in device_rows(state):
                yield name, row


class _Listing:
    """One NodeNames list as it came, with what is worked out from it once: each name's board
    position (-1 if unknown; valid while the board's ``layout`` stays), its JSON, the encoded
    prioritize answer, per demand which nodes it can never fit (:class:`_Verdict`), and the
    lists of survivors filter passed from it (each a listing of its own, for prioritize)."""

    __slots__ = ("_index", "_survivors", "_template", "_verdicts", "all_known", "layout", "names", "positions", "raw")

    _MAX_VERDICTS = 64
    _MAX_SURVIVORS = 32

    def __init__(self, layout: int, names: list[str], positions: np.ndarray) -> None:
        self.layout = layout
        self.names = names
        self.positions = positions
        self.all_known = bool(len(positions) == 0 or positions.min() >= 0)
        self.raw: bytes | None = None
        self._template: wire.HostPriorities | None = None
        self._verdicts: OrderedDict[int, _Verdict] = OrderedDict()
        self._survivors: OrderedDict[bytes, _Listing] = OrderedDict()
        self._index: dict[int, int] | bool | None = None  # False: a name is listed twice

    def index(self) -> dict[int, int] | None:
        """Board position -> position in this list, for the known nodes; None if a name is listed twice."""
        if self._index is None:
            if len(set(self.names)) != len(self.names):
                self._index = False
            else:
                self._index = {p: i for i, p in enumerate(self.positions.tolist()) if p >= 0}
        return self._index if isinstance(self._index, dict) else None

    def survivors(self, fits: np.ndarray, entries: Callable[[], np.ndarray]) -> _Listing:
        """The listed nodes where ``fits``, as a listing (itself if all fit), kept per outcome.

        Filter passes the same nodes for pod after pod of a kind (a node drops out only when
        it fills up): the passed names, their JSON and prioritize's encoded answer are then
        reused instead of made again. ``entries`` are the board's (see ``Extender._entries``).
        """
        if fits.all():
            return self
        key = np.packbits(fits).tobytes()
        found = self._survivors.get(key)
        if found is not None:
            self._survivors.move_to_end(key)
            return found
        at = np.flatnonzero(fits)
        names = entries()[0, self.positions[at]].tolist() if self.all_known else [self.names[i] for i in at.tolist()]
        found = self._survivors[key] = _Listing(self.layout, names, self.positions[at])
        if len(self._survivors) > self._MAX_SURVIVORS:
            self._survivors.popitem(last=False)
        return found

    def template(self, entries: Callable[[], np.ndarray]) -> wire.HostPriorities:
        """The prioritize answer for these names (all known), from the board's ``entries``."""
        if self._template is None:
            self._template = wire.HostPriorities(entries()[1, self.positions].tolist())
        return self._template

    def verdict(self, demand_key: int, inventory: int) -> _Verdict:
        """What is known of ``demand`` on these nodes (inventories as of ``inventory``)."""
        found = self._verdicts.get(demand_key)
        if found is None or found.inventory != inventory:
            found = self._verdicts[demand_key] = _Verdict(inventory, len(self.names))
            if len(self._verdicts) > self._MAX_VERDICTS:
                self._verdicts.popitem(last=False)
        else:
            self._verdicts.move_to_end(demand_key)
        return found


class _Verdict:
    """Which listed nodes a demand can never fit, even empty, and why: those go to
    FailedAndUnresolvableNodes. It depends only on the nodes' inventories, so it is worked
    out once per node and the encoded map is reused until an inventory changes."""

    __slots__ = ("_encoded", "_failures", "count", "inventory", "known", "never", "reasons", "tally")

    def __init__(self, inventory: int, size: int) -> None:
        self.inventory = inventory
        self._failures: dict[int | None, _Failures] = {}  # per placement key
        self.known = np.zeros(size, dtype=bool)
        self.never = np.zeros(size, dtype=bool)
        self.reasons: dict[int, str] = {}  # position in the listing -> why never
        self.count = 0
        self.tally: Counter[str] = Counter()
        self._encoded: bytes | None = None

    def learn(
        self,
        failing: np.ndarray,
        listing: _Listing,
        unresolvable: Callable[[str], str],
        problem: Callable[[str], str],
    ) -> None:
        """Work out the ``failing`` nodes not seen before. Caller holds the cache lock."""
        fresh = failing[~self.known[failing]]
        if not len(fresh):
            return
        names, where = listing.names, listing.positions
        for i in fresh.tolist():
            name = names[i]
            reason = unresolvable(name) if where[i] >= 0 else problem(name)
            if reason:
                self.never[i] = True
                self.reasons[i] = reason
                self.tally[reason] += 1
        self.known[fresh] = True
        if len(self.reasons) != self.count:
            self.count = len(self.reasons)
            self._encoded = None

    def encoded(self, listing: _Listing, fits: np.ndarray) -> tuple[bytes | None, Mapping[str, int]]:
        """FailedAndUnresolvableNodes as JSON (None if there are none), and its reasons counted."""
        if not self.reasons:
            return None, {}
        names = listing.names
        if fits[self.never].any():  # cannot happen while the inventories stay: never leave a fit node out
            log.warning("a node the pod can never fit passed filter; not cached", extra={"nodes": len(names)})
            kept = {names[i]: r for i, r in sorted(self.reasons.items()) if not fits[i]}
            return wire.dumps(kept) if kept else None, Counter(kept.values())
        if self._encoded is None:
            self._encoded = wire.dumps({names[i]: r for i, r in sorted(self.reasons.items())})
        return self._encoded, self.tally

    def failures(self, placed_key: int | None) -> _Failures:
        """The listed nodes the demand could fit after preemption, with their reasons (per
        placement key: a policy may explain a node its own way)."""
        found = self._failures.get(placed_key)
        if found is None:
            if len(self._failures) >= 4:  # a policy whose version moves leaves old keys behind
                self._failures.clear()
            found = self._failures[placed_key] = _Failures(len(self.known))
        return found


class _Failures:
    """FailedNodes of one demand on one listing: the nodes that do not fit now but could after
    preemption, and why, kept from call to call.

    In a busy cluster most nodes are full, and a reason per full node per call cost more than
    all the scoring. A reason depends only on the demand and the node's state, so only the
    nodes that joined the map, and those put on the board since the last call, are asked
    again (``Scoreboard.changed_since``); the reasons counted are updated in place and the
    JSON is made again only when a reason changed.
    """

    __slots__ = ("_json", "mark", "member", "reasons", "tally")

    def __init__(self, size: int) -> None:
        self.member = np.zeros(size, dtype=bool)  # which listed nodes are in the map
        self.reasons: dict[int, str] = {}  # position in the listing -> reason
        self.tally: Counter[str] = Counter()
        self.mark = -1  # the board's mark when last brought up to date
        self._json: bytes | None = None

    def update(self, want: np.ndarray, listing: _Listing, board: Scoreboard, reason: Callable[[int], str]) -> _Failures:
        """Make the map hold exactly the listed nodes where ``want``, each with ``reason(i)``
        (``i`` its position in ``listing``), and encode it. Caller holds the cache lock. The
        board is replaced only when nodes join, which makes a new listing: ``mark`` is always
        of this board."""
        changed = board.changed_since(self.mark)
        index = listing.index()
        if changed is None or index is None:  # history unknown, or a name listed twice: ask every node again
            self.member[:] = False
            self.reasons.clear()
            self.tally.clear()
            self._json = None
        ask = np.flatnonzero(want & ~self.member).tolist()
        if changed and index is not None:
            ask.extend(i for p in changed if (i := index.get(p)) is not None and self.member[i] and want[i])
        for i in np.flatnonzero(self.member & ~want).tolist():
            self._count(self.reasons.pop(i), -1)
        for i in ask:
            new = reason(i)
            old = self.reasons.get(i)
            if old != new:
                if old is not None:
                    self._count(old, -1)
                self.reasons[i] = new
                self._count(new, 1)
        self.member = want
        self.mark = board.mark
        if self._json is None and self.reasons:
            names = listing.names
            self._json = wire.dumps({names[i]: r for i, r in self.reasons.items()})
        return self

    def _count(self, reason: str, n: int) -> None:
        self.tally[reason] += n
        if not self.tally[reason]:
            del self.tally[reason]
        self._json = None

    def encoded(self) -> bytes | None:
        """The map as JSON; None when it is empty."""
        return self._json if self.reasons else None


def _pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping):
        return "?"
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or '?'}"
