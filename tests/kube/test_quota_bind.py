"""Two replicas binding pods of one namespace on different nodes at once never take it over its
GPU quota: the namespace's quota ledger is a compare-and-set of its own (node ledgers alone
serialise binds per node only)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from scheduler.backend import Admit, BindResult, Kind, PodRef
from scheduler.core.allocation import Allocation, decode_record
from scheduler.core.quota import NOTHING, Limits, Quota, charge, refusal
from scheduler.kube import KubeBackend
from scheduler.kube.quotaledger import quota_ledger_name
from tests.fakes import FakeApiServer, FakeClock
from tests.kube.conftest import Recorder, decide_for, gpu_node, gpu_pod, gpu_quota, wait_until

Make = Callable[..., KubeBackend]
PREFIX = "gpuslice.io/"
# 20 GiB pods (a quarter of an H100-80GB each: 20480 MiB, 250 milli); 3 fit in 60 GiB
QUOTA = Quota("team", "q", Limits(memory_mib=61440))


def admit_for(seen: list[int], meet: threading.Barrier | None = None) -> Admit:
    """What the extender's admit does: the namespace's records charged, plus the allocation."""

    def admit(records: Sequence[tuple[str, str]], placed: Allocation) -> str | None:
        used = sum((charge(decode_record(text, key), None) for key, text in records), NOTHING)
        seen.append(len(records))
        if meet is not None and len(seen) <= 2:
            meet.wait()  # the first decision of each replica waits for the other's: same read
        return refusal([QUOTA], used, charge(placed, None))

    return admit


def test_two_replicas_binding_one_namespace_on_two_nodes_never_exceed_its_quota(
    apiserver: FakeApiServer, make_backend: Make
) -> None:
    nodes = {n: apiserver.put_node(gpu_node(n, gpus=2, cpu="64")) for n in ("n1", "n2")}
    names = [f"p{i}" for i in range(10)]
    pods = {name: apiserver.put_pod(gpu_pod(name, namespace="team")) for name in names}
    backends = [make_backend(conflict_retries=60), make_backend(conflict_retries=60)]
    seen: list[int] = []
    admit = admit_for(seen, threading.Barrier(2, timeout=5))

    def bind(i: int) -> tuple[str, BindResult]:
        name = names[i]
        node = ("n1", "n2")[i % 2]  # each replica binds on its own node: the node ledgers never meet
        decide = decide_for(nodes[node], pods[name])
        return name, backends[i % 2].bind(PodRef("team", name, f"uid-{name}"), node, decide, admit)

    with ThreadPoolExecutor(6) as pool:
        results = dict(pool.map(bind, range(10)))

    won = sorted(n for n, r in results.items() if r.allocation is not None)
    # 3 x 20480 = 61440 MiB = the quota: exactly three bound, on either node
    assert len(won) == 3, {n: r.error for n, r in results.items()}
    refused = [r.error for n, r in results.items() if n not in won]
    assert all(e.startswith("GPUQuota team/q: allows gpuMemory 61440 MiB") for e in refused), refused
    bound = [p for p in apiserver.pods() if p["spec"].get("nodeName")]
    assert sorted(p["metadata"]["name"] for p in bound) == won
    # the losers' node reservations were undone: no ledger of a node names them
    for node in ("n1", "n2"):
        ledger = apiserver.configmap("gpuslice", f"gpuslice-node-{node}")
        text = ledger["data"]["ledger"] if ledger is not None else "{}"
        assert all(f"team/{n}" not in text for n in set(names) - set(won))
    assert apiserver.configmap("gpuslice", quota_ledger_name("team")) is not None


def test_a_bind_without_a_quota_never_reads_a_quota_ledger(apiserver: FakeApiServer, make_backend: Make) -> None:
    node = apiserver.put_node(gpu_node("n1"))
    body = apiserver.put_pod(gpu_pod("p", namespace="team"))
    backend = make_backend()
    result = backend.bind(PodRef("team", "p", "uid-p"), "n1", decide_for(node, body))
    assert result.allocation is not None
    assert apiserver.configmap("gpuslice", quota_ledger_name("team")) is None
    assert not [r for r in apiserver.requests if r[2] == quota_ledger_name("team")]


def test_an_entry_of_a_pod_that_is_gone_no_longer_counts(apiserver: FakeApiServer, make_backend: Make) -> None:
    node = apiserver.put_node(gpu_node("n1", gpus=2))
    for name in ("a", "b", "c", "d"):
        apiserver.put_pod(gpu_pod(name, namespace="team"))
    backend = make_backend()
    seen: list[int] = []
    admit = admit_for(seen)
    for name in ("a", "b", "c"):
        pod = apiserver.pod("team", name)
        assert pod is not None
        assert backend.bind(PodRef("team", name, f"uid-{name}"), "n1", decide_for(node, pod), admit).allocation
    pod = apiserver.pod("team", "d")
    assert pod is not None
    assert backend.bind(PodRef("team", "d", "uid-d"), "n1", decide_for(node, pod), admit).error.startswith(
        "GPUQuota team/q"
    )
    apiserver.delete_pod("team", "a")
    assert backend.bind(PodRef("team", "d", "uid-d"), "n1", decide_for(node, pod), admit).allocation is not None


def test_quotas_are_listed_and_watched_and_their_status_patched(apiserver: FakeApiServer, make_backend: Make) -> None:
    apiserver.put_quota(gpu_quota("team", gpuCompute="2"))
    backend, recorder = make_backend(), Recorder()
    backend.start(recorder)
    assert recorder.keys(Kind.QUOTA) == {"team/q"}
    wait_until(lambda: apiserver.open_watches() == 4, "the four watches (node ledgers too)")
    apiserver.put_quota(gpu_quota("other", name="r"))
    wait_until(lambda: recorder.keys(Kind.QUOTA) == {"team/q", "other/r"}, "the new quota through the watch")
    backend.quota_status("team", "q", {"used": {"gpus": 1}, "overQuota": False})
    quota = apiserver.quota("team", "q")
    assert quota is not None
    assert quota["status"] == {"used": {"gpus": 1}, "overQuota": False}
    assert quota["spec"] == {"limits": {"gpuCompute": "2"}}  # the status subresource never touches the spec


def test_without_the_crd_the_backend_starts_and_enforces_no_quota(apiserver: FakeApiServer, make_backend: Make) -> None:
    apiserver.served_quotas = False
    apiserver.put_node(gpu_node("n1"))
    backend, recorder = make_backend(), Recorder()
    backend.start(recorder)
    assert backend.ready()
    assert recorder.keys(Kind.QUOTA) == set()
    assert recorder.keys(Kind.NODE) == {"n1"}


def test_an_entry_counts_until_its_pod_is_bound_or_it_goes_stale(
    apiserver: FakeApiServer, make_backend: Make, clock: FakeClock
) -> None:
    # a's bind reserved its share in the namespace's ledger, then its Binding failed and left the
    # reservation (the Binding may still land): it counts against the quota until it is stale
    node = apiserver.put_node(gpu_node("n1", gpus=2))
    for name in ("a", "b", "c", "d"):
        apiserver.put_pod(gpu_pod(name, namespace="team"))
    backend = make_backend(stale_allocation_s=60.0)
    admit = admit_for([])

    def bind(name: str) -> BindResult:
        pod = apiserver.pod("team", name)
        assert pod is not None
        return backend.bind(PodRef("team", name, f"uid-{name}"), "n1", decide_for(node, pod), admit)

    apiserver.fault("create", "pods/binding", status=504)  # no answer: the share stays reserved
    assert "stays reserved" in bind("a").error
    assert bind("b").allocation is not None and bind("c").allocation is not None
    assert bind("d").error.startswith("GPUQuota team/q")  # a's entry + b + c = 3 x 20480 = the quota
    clock.advance(61)  # a's reservation is stale: it no longer counts
    assert bind("d").allocation is not None
