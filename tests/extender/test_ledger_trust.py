"""Where the backend keeps ledgers, a bound record counts only where gpuslice bound it.

Any namespace can write its pods' annotations, ``bind-phase: bound`` included; the per-node
ledger only gpuslice writes. A record the ledger does not hold (a pod of another scheduler, a pod
gpuslice never bound, one replaced under the same name) claims nothing in the cache's view, and
is listed as rejected with the reason; the ledger's record is what counts for a pod it holds.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.backend import Change, Kind
from scheduler.core.allocation import Allocation, DeviceShare, encode_record
from scheduler.core.inventory import SharingMode
from scheduler.core.k8s import parse_node
from scheduler.core.state import rebuild
from scheduler.extender.cache import ClusterCache
from scheduler.extender.client import ExtenderClient
from scheduler.extender.config import load_config
from scheduler.extender.problems import RECORD_REJECTED
from scheduler.extender.server import Server
from scheduler.extender.service import Extender
from scheduler.filebackend import FileBackend

from .kit import PREFIX, cluster_file, k8s_node, k8s_pod

NODE = k8s_node("a", gpus=4, mode="exclusive")


def whole(index: int, node: str = "a") -> Allocation:
    return Allocation(node, (DeviceShare(f"{node}-gpu{index}", index, SharingMode.EXCLUSIVE, 81920, 1000),), 0, 0)


def bound_pod(name: str, alloc: Allocation, scheduler: str = "gpuslice", uid: str | None = None) -> dict[str, Any]:
    """A pod on ``alloc``'s node carrying ``alloc`` as a bound record (gpuslice's, or written by hand)."""
    pod = k8s_pod(name, node=alloc.node)
    pod["spec"]["schedulerName"] = scheduler
    if uid is not None:
        pod["metadata"]["uid"] = uid
    notes = pod["metadata"]["annotations"]
    notes[PREFIX + "allocation"] = encode_record(alloc, "2026-01-01T00:00:00Z")
    notes[PREFIX + "bind-phase"] = "bound"
    return pod


def ledger(node: str, *entries: tuple[str, Allocation]) -> Change:
    """The node's ledger as the Kubernetes backend reports it: pod key -> uid, record."""
    body = {
        f"default/{name}": {"uid": f"uid-default-{name}", "record": encode_record(alloc, "2026-01-01T00:00:00Z")}
        for name, alloc in entries
    }
    return Change(Kind.LEDGER, node, body)


def pod(name: str, obj: dict[str, Any] | None) -> Change:
    return Change(Kind.POD, f"default/{name}", obj)


def ledger_cache(*changes: Change) -> ClusterCache:
    cache = ClusterCache(PREFIX)
    cache.uses_ledgers = True
    cache.on_change(Change(Kind.NODE, "a", NODE))
    for change in changes:
        cache.on_change(change)
    return cache


def busy(cache: ClusterCache) -> list[int]:
    state = cache.state("a")
    assert state is not None
    return [i for i, u in enumerate(state.usage) if u.shares]


def test_a_forged_record_on_a_pod_of_another_scheduler_claims_nothing() -> None:
    # Every GPU of node a named by hand on a pod the default scheduler placed there.
    forged = [
        pod(f"intruder-{i}", bound_pod(f"intruder-{i}", whole(i), scheduler="default-scheduler")) for i in range(4)
    ]
    cache = ledger_cache(ledger("a"), *forged)
    assert busy(cache) == []
    errors = cache.rejected_records("a")
    assert sorted(errors) == [f"default/intruder-{i}" for i in range(4)]
    assert "gpuslice did not bind this record" in errors["default/intruder-0"]
    assert "ledger of node a holds no entry" in errors["default/intruder-0"]
    placement = cache.placement("default/intruder-0")
    assert not placement.counted and "gpuslice did not bind" in placement.why_not
    # its pod deleted: nothing is left of it
    cache.on_change(pod("intruder-0", None))
    assert "default/intruder-0" not in cache.rejected_records("a")


def test_a_genuine_bind_counts_after_a_restart_and_a_forgery_beside_it_does_not() -> None:
    # A fresh process (no bind of its own): the ledgers are listed before the pods, as the
    # Kubernetes backend does. gpuslice bound real (GPU 1); never-bound names GPU 2 by hand.
    cache = ledger_cache(
        ledger("a", ("real", whole(1))),
        pod("real", bound_pod("real", whole(1))),
        pod("never-bound", bound_pod("never-bound", whole(2))),
    )
    assert busy(cache) == [1]
    assert cache.placement("default/real").counted
    assert list(cache.rejected_records("a")) == ["default/never-bound"]


def test_the_ledgers_record_counts_not_the_one_edited_on_the_pod() -> None:
    cache = ledger_cache(ledger("a", ("real", whole(1))), pod("real", bound_pod("real", whole(3))))
    assert busy(cache) == [1]
    assert cache.placement("default/real").counted


def test_a_ledger_entry_of_another_uid_does_not_vouch() -> None:
    # gpuslice bound default/real; it was deleted and a pod of the same name made with the record by hand.
    cache = ledger_cache(ledger("a", ("real", whole(1))), pod("real", bound_pod("real", whole(1), uid="uid-other")))
    assert busy(cache) == []
    assert list(cache.rejected_records("a")) == ["default/real"]


def test_a_ledger_arriving_after_the_pod_makes_its_record_count_and_its_loss_uncounts_it() -> None:
    cache = ledger_cache(pod("real", bound_pod("real", whole(0))))
    assert busy(cache) == [] and list(cache.rejected_records("a")) == ["default/real"]
    cache.on_change(ledger("a", ("real", whole(0))))
    assert busy(cache) == [0] and cache.rejected_records("a") == {}
    cache.on_change(Change(Kind.LEDGER, "a", None))
    assert busy(cache) == [] and list(cache.rejected_records("a")) == ["default/real"]


def test_a_bind_this_process_made_counts_before_its_ledger_reaches_the_watch() -> None:
    cache = ledger_cache(pod("mine", k8s_pod("mine")))
    cache.reserve("default/mine", "uid-default-mine", whole(2))
    cache.on_change(pod("mine", bound_pod("mine", whole(2))))
    assert busy(cache) == [2] and cache.rejected_records("a") == {}


class LedgerFile(FileBackend):
    """A cluster file with a ledger reported before the pods, as the Kubernetes backend lists them."""

    keeps_ledgers = True

    def __init__(self, path: Path, first: Change) -> None:
        super().__init__(path, PREFIX)
        self.first = first
        self.report: Callable[[Change], None] | None = None

    def start(self, on_change: Callable[[Change], None]) -> None:
        self.report = on_change
        on_change(self.first)
        super().start(on_change)


def test_a_forged_record_is_a_node_event_and_a_metric_and_so_is_a_lost_ledger_entry(tmp_path: Path) -> None:
    items = [NODE, bound_pod("real", whole(0)), bound_pod("intruder", whole(1), scheduler="default-scheduler")]
    backend = LedgerFile(cluster_file(tmp_path / "c.json", *items), ledger("a", ("real", whole(0))))
    extender = Extender(load_config(env={}, flags={"port": 0}), backend)
    extender.start()
    server = Server(extender).start_in_thread()
    try:
        assert [(n, r) for n, r, _ in backend.events] == [("a", RECORD_REJECTED)]
        assert "default/intruder: gpuslice did not bind this record" in backend.events[0][2]
        client = ExtenderClient(server.url)
        try:
            metrics = client.request("GET", "/metrics")[1].decode()
        finally:
            client.close()
        assert 'gpuslice_records_rejected{node="a"} 1.0' in metrics
        assert backend.report is not None
        backend.report(Change(Kind.LEDGER, "a", None))  # the ledger gone: real's record vouched for no more
        assert len(backend.events) == 2 and "default/real: gpuslice did not bind" in backend.events[1][2]
    finally:
        server.stop()
        extender.stop()


def test_a_backend_without_ledgers_counts_every_bound_record() -> None:
    cache = ClusterCache(PREFIX)  # a cluster file: no ledger to judge by
    cache.on_change(Change(Kind.NODE, "a", NODE))
    cache.on_change(pod("p", bound_pod("p", whole(3), scheduler="default-scheduler")))
    assert busy(cache) == [3]


@st.composite
def mixes(draw: st.DrawFn) -> tuple[list[tuple[str, int, str]], bool]:
    """Pods of node a: (name, GPU its bound record names, how it came by it), and whether the ledger
    is reported before the pods. Genuine binds name distinct GPUs; forgeries name any."""
    genuine = draw(st.lists(st.integers(0, 3), unique=True, max_size=4))
    forged = draw(st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["absent", "other-uid"])), max_size=6))
    pods = [(f"g{i}", gpu, "genuine") for i, gpu in enumerate(genuine)]
    pods += [(f"f{i}", gpu, how) for i, (gpu, how) in enumerate(forged)]
    return draw(st.permutations(pods)), draw(st.booleans())


@settings(max_examples=60, deadline=None)
@given(mixes())
def test_the_capacity_view_is_the_ledgers_view(mix: tuple[list[tuple[str, int, str]], bool]) -> None:
    pods, ledger_first = mix
    held = [(name, whole(gpu)) for name, gpu, how in pods if how == "genuine"]
    held += [(name, whole(gpu)) for name, gpu, how in pods if how == "other-uid"]  # by name, not by uid
    pod_changes = [
        pod(name, bound_pod(name, whole(gpu), uid="uid-forger" if how == "other-uid" else None))
        for name, gpu, how in pods
    ]
    entries = ledger("a", *held)
    cache = ledger_cache(*([entries, *pod_changes] if ledger_first else [*pod_changes, entries]))
    expected, problems = rebuild(
        parse_node(NODE, PREFIX),
        [(f"default/{name}", encode_record(whole(gpu))) for name, gpu, how in pods if how == "genuine"],
    )
    assert problems == []
    state = cache.state("a")
    assert state is not None
    assert state.usage == expected.usage
    assert sorted(cache.rejected_records("a")) == sorted(f"default/{n}" for n, _, how in pods if how != "genuine")
