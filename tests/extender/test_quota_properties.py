"""Invariants of GPU quotas under random pods and quotas, binds from two replicas at once and
restarts: no namespace's bound pods ever hold more than its quota allows, and nothing within
its quota is refused for the quota's sake.

Two replicas are two extenders, each with its own cache, over one cluster (a file backend
whose changes reach both, as two watches would); each binds pods at the same time as the
other, so one decides on a cache that has not yet seen the other's binds. A restart replaces
both by new processes that read the cluster as it was left.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.backend import Change
from scheduler.core.allocation import decode_record
from scheduler.core.k8s import parse_node
from scheduler.core.pods import holding_record
from scheduler.core.quota import NOTHING, Charge, charge, parse_quota, refusal
from scheduler.core.request import parse_pod
from scheduler.core.select import evaluate
from scheduler.core.state import rebuild
from scheduler.extender import wire
from scheduler.extender.config import load_config
from scheduler.extender.service import Extender
from scheduler.filebackend import FileBackend

from .kit import PREFIX, binding, cluster_file, filter_args, k8s_node, k8s_pod

NAMESPACES = ("a", "b")
NODES = ["x", "y"]

quota_limits = st.fixed_dictionaries(
    {},
    optional={
        "gpuCompute": st.sampled_from(["0.5", "1", "1.5", "2"]),
        "gpuMemory": st.sampled_from(["40Gi", "60Gi", "100Gi"]),
        "gpus": st.integers(0, 2),
    },
).filter(bool)
pods = st.lists(
    st.tuples(st.sampled_from(NAMESPACES), st.sampled_from(["0.25", "0.5", "1"]), st.booleans()),
    min_size=1,
    max_size=14,
)


class Replicas:
    """Two extenders over one cluster, whose watches lag: the changes reach both caches only at
    :meth:`catch_up`, so while a batch binds, each replica sees its own binds (its claims) and
    not the other's, as two processes do until their watches deliver."""

    def __init__(self, backend: FileBackend) -> None:
        config = load_config(env={}, flags={"policy": "binpack", "hold_s": 0})
        self.extenders = [Extender(config, backend), Extender(config, backend)]
        self._lag: list[Change] = []
        self._lock = threading.Lock()
        backend.start(self._heard)
        self.catch_up()
        for extender in self.extenders:
            extender.synced = True

    def _heard(self, change: Change) -> None:
        with self._lock:
            self._lag.append(change)

    def catch_up(self) -> None:
        with self._lock:
            changes, self._lag = self._lag, []
        for change in changes:
            for extender in self.extenders:
                extender.cache.on_change(change)


def truth(backend: FileBackend) -> dict[str, Charge]:
    """What each namespace holds by the records of its bound pods (the API server's view)."""
    nodes = {name: parse_node(obj, PREFIX) for name, obj in backend.nodes().items()}
    used: dict[str, Charge] = {}
    for key, obj in backend.pods().items():
        text = holding_record(obj, PREFIX)
        if text is not None:
            alloc = decode_record(text, key)
            namespace = key.split("/")[0]
            used[namespace] = used.get(namespace, NOTHING) + charge(alloc, nodes[alloc.node])
    return used


def filtered(extender: Extender, pod: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = orjson.loads(extender.filter(wire.parse_args(orjson.dumps(filter_args(dict(pod), NODES)))))
    return out


def bind_on(extender: Extender, pod: Mapping[str, Any], node: str, errors: list[str]) -> None:
    errors.append(extender.bind(wire.parse_binding(orjson.dumps(binding(dict(pod), node)))))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    limits=st.fixed_dictionaries({ns: st.one_of(st.none(), quota_limits) for ns in NAMESPACES}),
    wanted=pods,
    restart_after=st.integers(0, 14),
)
def test_no_namespace_goes_over_and_nothing_within_is_refused_for_it(
    tmp_path_factory: Any,
    limits: dict[str, dict[str, Any] | None],
    wanted: list[tuple[str, str, bool]],
    restart_after: int,
) -> None:
    quotas = [
        {
            "apiVersion": "gpuslice.io/v1alpha1",
            "kind": "GPUQuota",
            "metadata": {"name": "q", "namespace": ns},
            "spec": {"limits": lim},
        }
        for ns, lim in limits.items()
        if lim is not None
    ]
    by_ns = {q["metadata"]["namespace"]: (parse_quota(q),) for q in quotas}
    made = [k8s_pod(f"p{i}", namespace=ns, gpu_fraction=f) for i, (ns, f, _) in enumerate(wanted)]
    path = cluster_file(
        tmp_path_factory.mktemp("q") / "c.json", k8s_node("x", gpus=2), k8s_node("y", gpus=2), *quotas, *made
    )
    backend = FileBackend(path, PREFIX)
    cluster = Replicas(backend)
    policy = cluster.extenders[0].policy
    for step in range(0, len(made), 2):
        if step and step >= restart_after:  # a restart: two new processes read the cluster as it is
            path = tmp_path_factory.mktemp("r") / "c.json"
            path.write_text(orjson.dumps(backend.as_list()).decode())
            backend = FileBackend(path, PREFIX)
            cluster = Replicas(backend)
            restart_after = len(made) + 1
        cluster.catch_up()
        both = cluster.extenders
        batch = made[step : step + 2]
        # filter on the quiet cluster: a quota reason is given only where the pod's exact share
        # there would really take its namespace over
        used = truth(backend)
        targets = []
        for i, pod in enumerate(batch):
            answer = filtered(both[i % 2], pod)
            ns = pod["metadata"]["namespace"]
            request = parse_pod(pod, PREFIX)
            for node, reason in (answer.get("FailedNodes") or {}).items():
                if reason.startswith("GPUQuota"):
                    state, _ = rebuild(
                        parse_node(backend.nodes()[node], PREFIX),
                        [
                            (k, t)
                            for k, p in backend.pods().items()
                            if (t := holding_record(p, PREFIX)) is not None and p["spec"].get("nodeName") == node
                        ],
                    )
                    placed = evaluate(policy, request.demand, state)
                    assert not isinstance(placed, str)
                    exact = charge(placed.allocation, state.node)
                    assert refusal(by_ns[ns], used.get(ns, NOTHING), exact) is not None, (node, reason)
            passed = answer.get("NodeNames") or []
            if passed:
                targets.append((i % 2, pod, passed[-1] if wanted[step + i][2] else passed[0]))
        # both replicas bind at once, each on its own cache
        errors: list[str] = []
        threads = [threading.Thread(target=bind_on, args=(both[r], p, n, errors)) for r, p, n in targets]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        after = truth(backend)
        for ns, quota in by_ns.items():
            assert refusal(quota, NOTHING, after.get(ns, NOTHING)) is None, (ns, after.get(ns), errors)
