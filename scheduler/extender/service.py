"""filter, prioritize, bind and preempt on the packing core; no HTTP here (see ``app``).

Each verb parses the pod, maps the listed names to board positions, asks the core's board
(:mod:`scheduler.core.board`) and encodes its answer (:mod:`.answers` keeps what is worth
keeping in bytes). Every call reads the cluster cache under its lock; bind decides against
the records the backend hands it under the node's serialisation, never against the cache,
and counts its decision in the cache at once so the next filter sees it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from scheduler import logs
from scheduler.backend import Backend, Placement, PodRef
from scheduler.core.allocation import Allocation
from scheduler.core.board import Outcomes, Status
from scheduler.core.errors import RecordError, RequestError
from scheduler.core.pods import key_of, pod_key, priority_of
from scheduler.core.policies import REGISTRY, Policy, tell
from scheduler.core.quota import NOTHING, charge, least_charge, limits_json, refusal, status_json
from scheduler.core.request import GpuKind, GpuRequest, PodRequest, parse_pod
from scheduler.core.select import evaluate
from scheduler.core.state import rebuild

from . import preemption, wire
from .answers import Answers, Listing, NameLists, tally
from .cache import ClusterCache
from .config import ServeConfig
from .debug import DeviceRow, describe, device_rows
from .metrics import Metrics
from .problems import reporting_invalid_nodes

log = logs.get("extender")

_PARSE_CACHE = 8192


class Extender:
    def __init__(
        self,
        config: ServeConfig,
        backend: Backend,
        cache: ClusterCache | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.backend = backend
        self.cache = cache or ClusterCache(
            config.prefix, (config.mps_compute_oversub_pct, config.ts_memory_oversub_pct), clock
        )
        # where the backend keeps ledgers, a bound record counts only where gpuslice bound it
        self.cache.uses_ledgers = backend.keeps_ledgers
        self.policy = config.make_policy()
        self._policies: dict[str, Policy] = {self.policy.name: self.policy}
        self._parsed: OrderedDict[tuple[str, str], PodRequest | RequestError] = OrderedDict()
        self._recent: OrderedDict[str, PodRequest] = OrderedDict()  # uid -> request seen in filter
        self._seen: OrderedDict[str, None] = OrderedDict()  # pods the policies were told of
        self.metrics = Metrics(self._device_rows, self.cache.unusable, self.cache.quota_use, self.cache.record_errors)
        self.answers = Answers()
        self.names = NameLists()  # NodeNames arrays met lately, for parse_args and the answers
        self.synced = False  # the first full sync is in (the verbs answer "not ready" before)
        self._reported: dict[str, dict[str, Any]] = {}  # GPUQuota key -> the status last written

    def start(self) -> None:
        """The backend's first full sync (it returns once every node and pod is in), then its watch."""
        self.backend.start(
            reporting_invalid_nodes(self.cache.on_change, self.cache.problem, self.backend, self.cache.rejected_records)
        )
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
            if isinstance(hit, PodRequest) and hit.uid:
                self._recent[hit.uid] = hit
                if len(self._recent) > _PARSE_CACHE:
                    self._recent.popitem(last=False)
        if isinstance(hit, RequestError):
            raise hit
        self._first_sight(hit)
        return hit

    def _first_sight(self, request: PodRequest) -> None:
        """Tell every policy in use of a pod once, the first time it is seen (by uid, else key)."""
        seen = request.uid or request.key
        if seen in self._seen:
            return
        self._seen[seen] = None
        if len(self._seen) > _PARSE_CACHE:
            self._seen.popitem(last=False)
        with self.cache.lock:  # the policies are shared with a bind deciding in a worker thread
            self.policy_for(request)  # a policy a pod names is in use from its first pod on
            for policy in self._policies.values():
                tell(policy, request.demand)

    def policy_for(self, request: PodRequest) -> Policy:
        """The pod's policy: the one it names (with the options configured for it), else the default."""
        name = request.policy or self.policy.name
        policy = self._policies.get(name)
        if policy is None:
            policy = self._policies[name] = self.config.make_policy(name)
        return policy

    # ------------------------------------------------------------ filter / prioritize

    def filter(self, args: wire.ExtenderArgs) -> bytes:
        try:
            request = self.parse(args.pod)
        except RequestError as exc:
            # Every node unresolvable, each with the one message: kube-scheduler (v1.37) then
            # fails the attempt as Unschedulable, FailedScheduling "0/N nodes are available: N
            # gpuslice cannot schedule this pod: ...", tries no preemption and leaves the pod
            # among the unschedulable until the pod or the cluster changes. A top-level Error
            # would be a scheduling error, retried with back-off every few seconds for ever.
            log.info("filter: malformed request", extra={"pod": key_of(args.pod), "reason": str(exc)})
            self.metrics.reject_counts({"malformed request": len(args.names)})
            reason = wire.go_safe(f"gpuslice cannot schedule this pod: {exc}")
            return wire.filter_result(args, (), unresolvable=dict.fromkeys(args.names, reason))
        if not self.backend.ready():
            return wire.filter_result(None, error="gpuslice is not ready: the cluster state is not synced yet")
        cache = self.cache
        answers = self.answers
        if request.demand.gpu.kind is GpuKind.NONE:
            log.debug("filter: no GPU request", extra={"pod": request.key, "passed": len(args.names)})
            with cache.lock:  # prioritize will be asked about the same list
                listing = answers.listing(args.names, cache.board, "filter", args.names_raw)
                answers.expect("prioritize", listing)
            return wire.filter_result(
                args, range(len(args.names)), passed_names=listing.names, names_json=self._names_json(args, listing)
            )
        policy = self.policy_for(request)
        demand = request.demand
        with cache.lock:
            self._unhold(request.key)
            board = cache.board
            listing = answers.listing(args.names, board, "filter", args.names_raw)
            outcomes = board.filter(policy, demand, listing.positions)
            if cache.quotas_of(request.namespace):
                outcomes = self._within_quota(request, outcomes, listing.names)
            fits = outcomes.fits()
            survivors = listing.survivors(fits, answers.entries(board))
            answers.expect("prioritize", survivors)
            failed_json, unresolvable_json = (None, None)
            if not fits.all():
                keys = listing.keys(answers.entries(board))
                failed_json, unresolvable_json = listing.failures((demand, policy)).update(
                    outcomes, keys, answers.texts(outcomes)
                )
        counts = tally(outcomes)
        if counts:
            self.metrics.reject_counts(counts)
        passed_names = survivors.names
        if log.isEnabledFor(logging.DEBUG):  # its counts are worked out only when they are written
            log.debug(
                "filter",
                extra={
                    "pod": request.key,
                    "request": demand.gpu.describe(),
                    "passed": len(passed_names),
                    "failed": int((outcomes.status == Status.UNSCHEDULABLE).sum()),
                    "unresolvable": int((outcomes.status == Status.UNRESOLVABLE).sum()),
                    "node": passed_names[0] if len(passed_names) == 1 else None,
                },
            )
        return wire.filter_result(
            args,
            np.flatnonzero(fits).tolist() if args.nodes is not None else [],
            passed_names=passed_names,
            failed_json=failed_json,
            unresolvable_json=unresolvable_json,
            names_json=self._names_json(args, survivors),
        )

    def _within_quota(self, request: PodRequest, outcomes: Outcomes, names: Sequence[str]) -> Outcomes:
        """``outcomes`` with the nodes where the pod fits but would take its namespace over a
        GPUQuota unschedulable, for the quota's reason (the same text on every node). Asked
        with the least the pod would hold on each node, so no node is refused for a quota the
        pod could stay within there; bind charges the exact allocation. Caller holds the lock."""
        cache = self.cache
        quotas = cache.quotas_of(request.namespace)
        used = cache.namespace_use(request.namespace, without=request.key)
        gpu = request.demand.gpu
        refusals = []
        for i in np.flatnonzero(outcomes.fits()).tolist():
            view = cache.nodes.get(names[i])
            if view is None or view.node is None:
                continue
            text = refusal(quotas, used, least_charge(gpu, view.node) or NOTHING)
            if text is not None:
                refusals.append((i, text))
        if not refusals:
            return outcomes
        self.metrics.quota_refusals.labels(request.namespace).inc()
        return cache.board.refused(outcomes, refusals)

    def _names_json(self, args: wire.ExtenderArgs, passed: Listing) -> bytes | None:
        """The passed names encoded, remembered so that prioritize's copy of them is not decoded again."""
        if args.nodes is not None:
            return None
        passed.raw = self.names.encode(passed.names, passed.raw)
        return passed.raw

    def prioritize(self, args: wire.ExtenderArgs) -> bytes:
        try:
            request = self.parse(args.pod)
        except RequestError as exc:
            log.info("prioritize: malformed request", extra={"pod": key_of(args.pod), "reason": str(exc)})
            return wire.host_priorities(args.names, [0] * len(args.names))
        policy = self.policy_for(request)
        cache = self.cache
        with cache.lock:
            self._unhold(request.key)
            board = cache.board
            listing = self.answers.listing(args.names, board, "prioritize")
            scores = board.scores(policy, request.demand, listing.positions)
            template = listing.template(self.answers.entries(board))
            top = board.pick(scores, listing.positions)
            if top is not None and self.config.hold_s > 0:
                self._hold(request, policy, listing.names[top])
        out = np.zeros(len(scores), dtype=np.int64)
        if top is not None:
            # core 0..100 -> extender 0..10, rounded half up; only the node the core ranks first
            # gets the top score, so kube-scheduler (the weight makes one point outweigh its own
            # plugins) binds where the hold is
            fits = scores > -np.inf
            out[fits] = np.clip(np.floor(scores[fits] * wire.MAX_PRIORITY / 100 + 0.5), 0, wire.MAX_PRIORITY - 1)
            out[top] = wire.MAX_PRIORITY
            log.debug(
                "prioritize", extra={"pod": request.key, "nodes": len(out), "node": listing.names[top], "score": 10}
            )
        return template.encode(out)

    def _unhold(self, key: str) -> None:
        """Drop the holds whose time is up, and the pod's own: it is being scheduled again, and
        its last hold would stand in its own way. Caller holds the lock."""
        cache = self.cache
        cache.expire()
        if cache.held(key) is not None:
            cache.unreserve(key)

    def _hold(self, request: PodRequest, policy: Policy, node: str) -> None:
        """Count the pod's placement on ``node`` until its bind arrives (or the hold runs out):
        kube-scheduler filters the next pods before that bind, and they must not be steered
        to the same share. Caller holds the lock."""
        state = self.cache.state(node)
        if state is None or state.allocation_of(request.key) is not None:
            return
        placed = evaluate(policy, request.demand, state)
        if not isinstance(placed, str):
            self.cache.hold(request.key, request.uid, placed.allocation, self.cache.clock() + self.config.hold_s)

    # ------------------------------------------------------------ bind

    def bind(self, args: wire.BindingArgs) -> str:
        """Bind and return "" on success, else the reason (the pod is then requeued)."""
        key = pod_key(args.namespace, args.name)
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
                # What the pod must not take: the records, and the shares held for other pods
                # that prioritize ranked on this node (their binds are on their way).
                held = {k: c.record for k, c in cache.holds(args.node).items() if k != key and k not in others}
                mine = cache.held(key)
                # The cache's state of the node, if it counts exactly these (besides the pod's
                # own hold, released here): the state rebuild() would give, without rebuilding it.
                counted = None
                kept = None  # the pod's hold, counted there beside exactly these: still free
                wanted = {**others, **held}
                if view is not None and not view.errors:
                    own = key in view.records
                    if len(view.records) - own == len(wanted) and all(
                        view.records.get(k) == t for k, t in wanted.items()
                    ):
                        counted = cache.state(args.node)
                        if counted is not None and own:
                            if mine is not None and mine.node == args.node and view.records[key] == mine.record:
                                kept = mine.allocation
                            else:
                                counted = counted.release(key)
            if node is None:
                return f"node {args.node}: {problem}" if problem else f"node {args.node} is unknown to gpuslice"
            placed = None
            if counted is not None and counted.node is node:
                state, placed = counted, kept  # kept: what releasing it and applying it again would find
            else:
                state, problems = rebuild(node, others.items())
                for p in problems:
                    log.warning(
                        "allocation record rejected", extra={"node": args.node, "pod": p.pod, "reason": p.problem}
                    )
                for k, text in sorted(held.items()):
                    with contextlib.suppress(RecordError):  # a hold that no longer fits loses to the records
                        state = state.apply(k, cache.decode(text, k))
            if placed is None and mine is not None and mine.node == args.node:  # the share held, if still free
                with contextlib.suppress(RecordError):
                    state.apply(key, mine.allocation)
                    placed = mine.allocation
            if placed is None:
                # Under the lock: the policy's caches are shared with filter and prioritize, and
                # through the Kubernetes backend this runs in a worker thread beside them.
                with cache.lock:
                    found = evaluate(policy, request.demand, state)
                if isinstance(found, str):
                    return found
                placed = found.allocation
            with cache.lock:  # asked and counted at once: a bind of the namespace in another thread waits
                if cache.quotas_of(args.namespace):
                    refused = refusal(
                        cache.quotas_of(args.namespace),
                        cache.namespace_use(args.namespace, without=key),
                        charge(placed, node),
                    )
                    if refused is not None:
                        return refused
                cache.reserve(key, uid, placed)
            decided.append(placed)
            return placed

        def admit(records: Sequence[tuple[str, str]], placed: Allocation) -> str | None:
            # What the namespace holds as the backend sees it under the namespace's serialisation
            # (across replicas), besides what this process counts for its pods now.
            with cache.lock:
                quotas = cache.quotas_of(args.namespace)
                view = cache.nodes.get(placed.node)
                held = dict(cache.namespace_charges(args.namespace))
                for k, text in records:
                    if k == key or k in held:
                        continue
                    with contextlib.suppress(RecordError):
                        alloc = cache.decode(text, k)
                        there = cache.nodes.get(alloc.node)
                        held[k] = charge(alloc, there.node if there is not None else None)
                held.pop(key, None)
                used = sum(held.values(), NOTHING)
                return refusal(quotas, used, charge(placed, view.node if view is not None else None))

        try:
            result = self.backend.bind(
                PodRef(args.namespace, args.name, uid),
                args.node,
                decide,
                admit if cache.quotas_of(args.namespace) else None,
            )
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
        """Per candidate node, the victims among kube-scheduler's that free a share the pod fits
        (:mod:`.preemption`); nodes where none do are dropped."""
        try:
            request = self.parse(args.pod)
        except RequestError as exc:
            log.info("preempt: malformed request", extra={"pod": key_of(args.pod), "reason": str(exc)})
            return wire.preemption_result({})
        if request.demand.gpu.kind is GpuKind.NONE:
            return wire.preemption_result({n: (v.uids, v.pdb_violations) for n, v in args.victims.items() if v.uids})
        quota = None
        with self.cache.lock:
            quotas = self.cache.quotas_of(request.namespace)
            if quotas:
                used = self.cache.namespace_use(request.namespace, without=request.key)
                quota = preemption.QuotaView(request.namespace, quotas, used)
        verdicts = preemption.decide(
            request.demand, args.victims, self.cache, self.config.prefix, quota=quota, priority=priority_of(args.pod)
        )
        kept = {node: (v.uids, v.pdb_violations) for node, v in verdicts.items() if v.uids}
        log.info(
            "preempt",
            extra={
                "pod": request.key,
                "candidates": len(args.victims),
                "kept": len(kept),
                "nodes": {node: v.why for node, v in verdicts.items()},
            },
        )
        return wire.preemption_result(kept)

    # ------------------------------------------------------------ quotas

    def report_quotas(self) -> int:
        """Write the status of every GPUQuota whose namespace's use changed since last written
        (through the backend); how many were written. Lowering a quota evicts nothing: its
        status says ``overQuota`` while the namespace holds more than it allows."""
        written = 0
        for quota, used in self.cache.quota_use():
            key = f"{quota.namespace}/{quota.name}"
            status = status_json(quota, used)
            if self._reported.get(key) != status:
                self.backend.quota_status(quota.namespace, quota.name, status)
                self._reported[key] = status
                written += 1
        return written

    def placement(self, namespace: str, name: str) -> Placement:
        """For the admission webhook (the node agent's evictions): where the pod runs and whether
        gpuslice counts its bound record there; nothing is known before the first sync or while
        the watch is down."""
        if not (self.synced and self.backend.ready()):
            return Placement(synced=False)
        with self.cache.lock:
            return self.cache.placement(pod_key(namespace, name))

    def quota_advice(self, namespace: str, gpu: GpuRequest) -> str | None:
        """For the admission webhook: a warning when a pod asking ``gpu`` could never fit its
        namespace's GPU quotas, even with nothing else of the namespace running (on every kind
        of node gpuslice knows, the least the pod would hold there is over a limit)."""
        cache = self.cache
        with cache.lock:
            quotas = cache.quotas_of(namespace)
            if not quotas or gpu.kind is GpuKind.NONE:
                return None
            kinds = {view.node.kind: view.node for view in cache.nodes.values() if view.node is not None}
        reasons = []
        for node in kinds.values():
            least = least_charge(gpu, node)
            if least is None:
                continue
            reason = refusal(quotas, NOTHING, least)
            if reason is None:
                return None  # it fits its quota on this kind of node
            reasons.append(reason)
        if not reasons:
            return None
        return f"this pod ({gpu.describe()}) can never be scheduled in namespace {namespace}: {min(reasons)}"

    def describe_quotas(self) -> list[dict[str, Any]]:
        """Every GPUQuota: what it allows and what its namespace holds, in all and per model it
        limits (``/debug/quotas``, ``gpuslice inspect --quotas``); unreadable ones with why."""
        out: list[dict[str, Any]] = []
        for quota, used in self.cache.quota_use():
            out.append(
                {
                    "namespace": quota.namespace,
                    "name": quota.name,
                    "limits": {**limits_json(quota.limits), "models": {m: limits_json(lim) for m, lim in quota.models}},
                    **status_json(quota, used),
                }
            )
        with self.cache.lock:
            problems = sorted(self.cache.quota_problems.items())
        out.extend({"namespace": k.split("/")[0], "name": k.split("/")[1], "problem": why} for k, why in problems)
        return out

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
                    cache.usage(n),
                )
                for n in names
            ]

    def _device_rows(self) -> Iterator[tuple[str, DeviceRow]]:
        for name, state in sorted(self.cache.snapshot().items()):
            for row in device_rows(state):
                yield name, row
