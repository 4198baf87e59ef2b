"""filter, prioritize, bind and preempt on the packing core; no HTTP here (see ``app``).

Every call reads the cluster cache under its lock; bind decides against the records the
backend hands it under the node's serialisation, never against the cache, and counts
its decision in the cache at once so the next filter sees it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from scheduler.backend import Backend, PodRef
from scheduler.core.allocation import Allocation
from scheduler.core.errors import RequestError
from scheduler.core.memo import intern
from scheduler.core.policies import REGISTRY, Policy, make_policy
from scheduler.core.request import GpuKind, PodRequest, parse_pod
from scheduler.core.select import evaluate, fit_cached
from scheduler.core.state import rebuild

from . import logs, wire
from .cache import ClusterCache, with_oversubscription
from .config import ServeConfig
from .debug import DeviceRow, describe, device_rows
from .metrics import Metrics

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
        self.metrics = Metrics(self._device_rows)
        self._last_names: dict[str, tuple[int, list[str], np.ndarray]] = {}

    def start(self) -> None:
        self.backend.start(self.cache.on_change)

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

    def _positions(self, names: Sequence[str], slot: str) -> np.ndarray:
        """Each name's position on the board (-1 if unknown).

        kube-scheduler sends filter the same list again and again, and prioritize the list
        filter passed: comparing with the last list is cheaper than thousands of look-ups.
        """
        cache = self.cache
        last = self._last_names.get(slot)
        if last is not None and last[0] == cache.layout and last[1] == names:
            return last[2]
        positions = cache.board.positions(names)
        self._last_names[slot] = (cache.layout, list(names), positions)
        return positions

    def _scores(
        self, policy: Policy, request: PodRequest, names: Sequence[str], slot: str
    ) -> tuple[np.ndarray, np.ndarray]:
        """(position of each name on the board or -1, its score or -inf). Caller holds the lock."""
        board = self.cache.board
        positions = self._positions(names, slot)
        scores = np.full(len(names), -np.inf)
        known = positions >= 0
        if known.any():
            scores[known] = board.scores(policy, request.demand)[positions[known]]
        return positions, scores

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
            return wire.filter_result(args, range(len(args.names)))
        policy = self.policy_for(request)
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        cache = self.cache
        demand = request.demand
        demand_key = intern(demand)
        placement_key = intern((policy, policy.version, demand)) if policy.cacheable else None
        with cache.lock:
            positions, scores = self._scores(policy, request, args.names, "filter")
            fits = scores > -np.inf
            passed_at = np.flatnonzero(fits)
            passed = passed_at.tolist()
            passed_names = [args.names[i] for i in passed]
            if passed:  # what prioritize will most likely be asked about next
                self._last_names["prioritize"] = (cache.layout, passed_names, positions[passed_at])
            states = cache.board.states
            views = cache.nodes
            where = positions.tolist()
            for i in np.flatnonzero(~fits).tolist():
                name = args.names[i]
                if where[i] < 0:
                    problem = cache.problem(name)
                    if problem:
                        unresolvable[name] = problem
                    else:
                        failed[name] = UNKNOWN_NODE
                    continue
                never = views[name].empty_fit.get(demand_key)
                if never is None:
                    never = cache.unresolvable(name, demand, demand_key)
                if never:
                    unresolvable[name] = never
                else:
                    # the score table has just evaluated this node: the reason is in its memo
                    result = evaluate(policy, demand, states[where[i]], placement_key)
                    failed[name] = result if isinstance(result, str) else "no longer fits"
        if failed or unresolvable:
            self.metrics.reject(list(failed.values()) + list(unresolvable.values()))
        log.info(
            "filter",
            extra={
                "pod": request.key,
                "request": request.demand.gpu.describe(),
                "passed": len(passed),
                "failed": len(failed),
                "unresolvable": len(unresolvable),
                "node": args.names[passed[0]] if len(passed) == 1 else None,
            },
        )
        return wire.filter_result(args, passed, failed, unresolvable, passed_names=passed_names)

    def prioritize(self, args: wire.ExtenderArgs) -> bytes:
        try:
            request = self.parse(args.pod)
        except RequestError as exc:
            log.info("prioritize: malformed request", extra={"pod": _pod_key(args.pod), "reason": str(exc)})
            return wire.host_priorities(args.names, [0] * len(args.names))
        policy = self.policy_for(request)
        with self.cache.lock:
            _, scores = self._scores(policy, request, args.names, "prioritize")
        fits = scores > -np.inf
        out = np.zeros(len(args.names), dtype=np.int64)
        if fits.any():
            values = scores[fits]
            if type(policy).normalize is not Policy.normalize:
                values = np.asarray(policy.normalize(values.tolist()), dtype=np.float64)
            # core 0..100 -> extender 0..10, rounded half up
            out[fits] = np.clip(np.floor(values * wire.MAX_PRIORITY / 100 + 0.5), 0, wire.MAX_PRIORITY)
        ranked = out.tolist()
        if ranked:
            top = int(np.argmax(out))
            log.info(
                "prioritize",
                extra={"pod": request.key, "nodes": len(ranked), "node": args.names[top], "score": ranked[top]},
            )
        return wire.host_priorities(args.names, ranked)

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
            with cache.lock:
                view = cache.nodes.get(args.node)
                node = view.node if view is not None else None
                problem = view.problem if view is not None else ""
            if node is None:
                return f"node {args.node}: {problem}" if problem else f"node {args.node} is unknown to gpuslice"
            state, problems = rebuild(node, [(k, text) for k, text in records if k != key])
            for p in problems:
                log.warning("allocation record rejected", extra={"node": args.node, "pod": p.pod, "reason": p.problem})
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


def _pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping):
        return "?"
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or '?'}"
