"""A record written by hand claims nothing: the bind's count and the extender's view weigh a bound
record only where the node's ledger (which only gpuslice writes) holds the pod.

Through the real client against the fake API server: the forged records are copies of records
gpuslice really wrote, ``bind-phase: bound`` included, on pods another scheduler placed on the
node, or that gpuslice never bound.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

from scheduler.backend import PodRef
from scheduler.extender.config import load_config
from scheduler.extender.service import Extender
from scheduler.kube import KubeBackend
from tests.fakes import FakeApiServer
from tests.kube.conftest import decide_for, gpu_node, gpu_pod, wait_until

Make = Callable[..., KubeBackend]
PREFIX = "gpuslice.io/"


def bind(backend: KubeBackend, apiserver: FakeApiServer, node: dict[str, Any], name: str, seen: list[Any]) -> str:
    live = apiserver.pod("default", name)
    assert live is not None
    result = backend.bind(PodRef("default", name, live["metadata"]["uid"]), "n1", decide_for(node, live, seen))
    return result.error


def forge(apiserver: FakeApiServer, name: str, copied_from: str, scheduler: str = "default-scheduler") -> None:
    """A pod on n1 carrying, by hand, a copy of the bound record of ``copied_from``."""
    source = apiserver.pod("default", copied_from)
    assert source is not None
    body = gpu_pod(name)
    body["spec"]["schedulerName"] = scheduler
    body["spec"]["nodeName"] = "n1"
    body["status"] = {"phase": "Running"}
    notes = body["metadata"].setdefault("annotations", {})
    notes.update({k: v for k, v in source["metadata"]["annotations"].items() if k.startswith(PREFIX)})
    assert notes[PREFIX + "bind-phase"] == "bound"
    apiserver.put_pod(body)


def bound_by(
    backend: KubeBackend, apiserver: FakeApiServer, bound: str, pending: str
) -> tuple[dict[str, Any], list[Sequence[tuple[str, str]]]]:
    """Node n1 (one GPU: four 20 GiB shares), the pods ``bound`` bound there by ``backend`` and the
    pods ``pending`` waiting; the node, and the records each bind's decision was given."""
    node = apiserver.put_node(gpu_node("n1"))
    for name in bound + pending:
        apiserver.put_pod(gpu_pod(name))
    seen: list[Sequence[tuple[str, str]]] = []
    for name in bound:
        assert bind(backend, apiserver, node, name, seen) == ""
    return node, seen


def test_forged_records_on_pods_of_another_scheduler_do_not_block_a_bind(
    apiserver: FakeApiServer, make_backend: Make
) -> None:
    backend = make_backend()
    node, seen = bound_by(backend, apiserver, "abcd", "e")
    # the four shares' records, copied by hand onto pods the default scheduler placed on n1
    for name in "abcd":
        forge(apiserver, f"x-{name}", name)
    for name in "abcd":
        apiserver.delete_pod("default", name)
    seen.clear()
    assert bind(backend, apiserver, node, "e", seen) == ""
    assert [k for k, _ in seen[-1]] == []  # the forged records are not among what the bind respects


def test_after_a_restart_genuine_binds_count_and_forged_ones_do_not(
    apiserver: FakeApiServer, make_backend: Make
) -> None:
    first = make_backend()
    node, seen = bound_by(first, apiserver, "ab", "efg")
    first.stop()
    # two pods gpuslice never bound, with a's record by hand: one of another scheduler, one of gpuslice's
    forge(apiserver, "never-1", "a")
    forge(apiserver, "never-2", "b", scheduler="gpuslice")
    restarted = make_backend()
    seen.clear()
    assert bind(restarted, apiserver, node, "e", seen) == ""
    assert [k for k, _ in seen[0]] == ["default/a", "default/b"]
    assert bind(restarted, apiserver, node, "f", seen) == ""
    # a and b (before the restart), e and f: the GPU is full; the forgeries freed nothing and took nothing
    error = bind(restarted, apiserver, node, "g", seen)
    assert "more than is free" in error, error


def test_the_extenders_view_weighs_records_against_the_watched_ledgers(apiserver: FakeApiServer) -> None:
    node = apiserver.put_node(gpu_node("n1"))
    for name in ("a", "b"):
        apiserver.put_pod(gpu_pod(name))
    config = load_config(env={}, flags={"port": 0})
    writer = KubeBackend.from_url(apiserver.url, prefix=config.prefix, conflict_backoff_s=0.001)
    assert bind(writer, apiserver, node, "a", []) == ""
    forge(apiserver, "intruder", "a")
    # a restarted extender: ledgers, then pods, from the first list
    extender = Extender(config, KubeBackend.from_url(apiserver.url, prefix=config.prefix))
    extender.start()
    try:
        cache = extender.cache
        assert cache.uses_ledgers
        with cache.lock:
            state = cache.state("n1")
            assert state is not None and [k for k, _ in state.pods] == ["default/a"]
            assert "gpuslice did not bind this record" in cache.rejected_records("n1")["default/intruder"]
            assert not cache.placement("default/intruder").counted and cache.placement("default/a").counted

        def reported() -> bool:  # a Warning Event on the Node names the pod and the reason
            return any(
                e.get("reason") == "GpusliceRecordRejected"
                and "default/intruder: gpuslice did not bind this record" in e.get("message", "")
                for e in apiserver.events()
            )

        wait_until(reported, "the node event about the forged record")
        # then through the watch: b bound by another replica (its ledger entry), a second forgery
        assert bind(writer, apiserver, node, "b", []) == ""
        late = copy.deepcopy(apiserver.pod("default", "intruder"))
        assert late is not None
        late["metadata"]["name"] = "intruder-2"
        late["metadata"]["uid"] = "uid-intruder-2"
        del late["metadata"]["resourceVersion"]
        apiserver.put_pod(late)

        def seen_both() -> bool:
            with cache.lock:
                state = cache.state("n1")
                pods = [k for k, _ in state.pods] if state is not None else []
                return pods == ["default/a", "default/b"] and "default/intruder-2" in cache.rejected_records("n1")

        wait_until(seen_both, "the watch to show b counted and intruder-2 refused")
    finally:
        extender.stop()
        writer.stop()
