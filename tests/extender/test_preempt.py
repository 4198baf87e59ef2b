"""The preempt verb: both forms of kube-scheduler's call, answered with the victims that free a share."""

from __future__ import annotations

from typing import Any

import pytest

from .kit import holding, k8s_node, k8s_pod


def uid(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["uid"])


def meta(*pods: dict[str, Any] | str, violations: int = 0) -> dict[str, Any]:
    return {"Pods": [{"UID": p if isinstance(p, str) else uid(p)} for p in pods], "NumPDBViolations": violations}


def answer(svc: Any, pod: dict[str, Any], victims: dict[str, Any], full: bool = False) -> Any:
    key = "NodeNameToVictims" if full else "NodeNameToMetaVictims"
    other = "NodeNameToMetaVictims" if full else "NodeNameToVictims"
    return svc.post("preempt", {"Pod": pod, key: victims, other: None})["NodeNameToMetaVictims"]


# GPU 0 of "mps": a 0.5 (priority 3) + b 0.5 (priority 1); GPU 1: c 1.0 (priority 1).
A = holding("a", "mps", 0, 500, priority=3)
B = holding("b", "mps", 0, 500, priority=1)
C = holding("c", "mps", 1, 1000, priority=1)
WEB = k8s_pod("web", cpu="2", node="mps", phase="Running")  # no GPU: gpuslice holds no share for it


@pytest.fixture
def svc(serve: Any) -> Any:
    return serve(k8s_node("mps", gpus=2), k8s_node("quiet", gpus=1), A, B, C, WEB)


def test_a_fraction_gets_the_one_victim_of_three_that_suffices(svc: Any) -> None:
    # Any one of a, b, c frees a half: fewest pods 1; lowest priority b or c (1); least GPU b (500 < 1000).
    # kube-scheduler counted 2 PDB violations among a, b, c: at most 1 can be among those kept.
    got = answer(svc, k8s_pod("p", gpu_fraction="0.5"), {"mps": meta(A, B, C, violations=2)})
    assert got == {"mps": {"Pods": [{"UID": "uid-default-b"}], "NumPDBViolations": 1}}


def test_full_pods_are_answered_with_their_own_priorities(svc: Any) -> None:
    # With NodeNameToVictims the victims come whole, their spec.priority with them: here b is the
    # most important and c the least, so c (priority 0, 1000 milli) goes before b (priority 9).
    victims = {"Pods": [A, dict(B, spec={**B["spec"], "priority": 9}), dict(C, spec={**C["spec"], "priority": 0})]}
    got = answer(svc, k8s_pod("p", gpu_fraction="0.5"), {"mps": {**victims, "NumPDBViolations": 0}}, full=True)
    assert got == {"mps": {"Pods": [{"UID": "uid-default-c"}], "NumPDBViolations": 0}}


def test_victims_without_a_share_or_unknown_are_kept(svc: Any) -> None:
    # web holds no GPU share and "uid-new" is a pod gpuslice has not seen: kube-scheduler chose them
    # for reasons gpuslice cannot judge. Of a, b, c: b, as before. Kube-scheduler's order is kept.
    proposal = meta(WEB, A, "uid-new", B, C, violations=5)
    got = answer(svc, k8s_pod("p", gpu_fraction="0.5"), {"mps": proposal})
    assert got == {
        "mps": {"Pods": [{"UID": u} for u in ("uid-default-web", "uid-new", "uid-default-b")], "NumPDBViolations": 3}
    }


def test_a_whole_gpu_needs_both_pods_of_gpu_0_or_c(svc: Any) -> None:
    pod = k8s_pod("p", gpu_count="1")
    assert answer(svc, pod, {"mps": meta(A, B, C)}) == {
        "mps": {"Pods": [{"UID": "uid-default-c"}], "NumPDBViolations": 0}
    }
    assert answer(svc, pod, {"mps": meta(A, B)}) == {
        "mps": {"Pods": [{"UID": "uid-default-a"}, {"UID": "uid-default-b"}], "NumPDBViolations": 0}
    }
    # a alone frees half of GPU 0: never a whole GPU; an unknown node and an empty proposal: dropped
    assert answer(svc, pod, {"mps": meta(A), "ghost": meta("uid-x"), "quiet": meta()}) is None


def test_a_pod_that_fits_without_evicting_a_share_keeps_the_proposal(serve: Any) -> None:
    # roomy's GPU 1 is free: the pod fits there without evicting g; kube-scheduler proposed g for
    # its own reasons (CPU, affinity, ...), which gpuslice does not judge, and an answer without
    # victims would fail kube-scheduler's call: the proposal stands as it came.
    g = holding("g", "roomy", 0, 500)
    svc = serve(k8s_node("roomy", gpus=2), g)
    got = answer(svc, k8s_pod("p", gpu_fraction="0.5"), {"roomy": meta(g, violations=1)})
    assert got == {"roomy": {"Pods": [{"UID": "uid-default-g"}], "NumPDBViolations": 1}}


def test_cpu_kube_scheduler_needs_is_never_given_back(serve: Any) -> None:
    # 8 CPUs: d (0.25 GPU, 4 CPUs, priority 5), e (0.25 GPU, 1 CPU, priority 0), and a pod without a
    # GPU, f, with 3 CPUs: 8 used. The pod wants 0.25 GPU (0.5 is free) and 4 CPUs. Counting only
    # the pods with shares, 3 CPUs would be free and evicting e (1 more) would do; counting f too
    # none is free, and only d frees 4.
    d = holding("d", "small", 0, 250, cpu="4", priority=5)
    e = holding("e", "small", 0, 250, cpu="1", priority=0)
    f = k8s_pod("f", cpu="3", node="small", phase="Running")
    svc = serve(k8s_node("small", gpus=1, cpu="8"), d, e, f)
    got = answer(svc, k8s_pod("p", cpu="4", gpu_fraction="0.25"), {"small": meta(d, e)})
    assert got == {"small": {"Pods": [{"UID": "uid-default-d"}], "NumPDBViolations": 0}}
    # with f proposed too (and so evicted whatever gpuslice says), 3 CPUs are free: e's 1 is enough
    got = answer(svc, k8s_pod("p", cpu="4", gpu_fraction="0.25"), {"small": meta(d, e, f)})
    assert got == {"small": {"Pods": [{"UID": "uid-default-e"}, {"UID": "uid-default-f"}], "NumPDBViolations": 0}}


def test_a_pod_whose_requests_cannot_be_read_keeps_the_whole_proposal(serve: Any) -> None:
    d = holding("d", "small", 0, 500)
    e = holding("e", "small", 0, 500)
    odd = k8s_pod("odd", node="small", phase="Running")
    odd["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    svc = serve(k8s_node("small", gpus=1), d, e, odd)
    got = answer(svc, k8s_pod("p", gpu_fraction="0.5"), {"small": meta(d, e)})
    assert got == {"small": {"Pods": [{"UID": "uid-default-d"}, {"UID": "uid-default-e"}], "NumPDBViolations": 0}}
    assert answer(svc, k8s_pod("p", gpu_fraction="0.5"), {"small": meta()}) is None


def test_a_3g_gets_the_two_1g_at_the_right_slots_not_the_2g(serve: Any) -> None:
    # H100 under dynamic MIG: p1 1g@0, p2 1g@1, q 2g@4 (slots 4-5), r 1g@6. A 3g.40gb starts at 0
    # or 4: evicting q leaves r blocking 4; evicting p1 and p2 frees 0-3.
    pods = [
        holding("p1", "mig", 0, 0, mig=("1g.10gb", 0, 1)),
        holding("p2", "mig", 0, 0, mig=("1g.10gb", 1, 1)),
        holding("q", "mig", 0, 0, mig=("2g.20gb", 4, 2)),
        holding("r", "mig", 0, 0, mig=("1g.10gb", 6, 1)),
    ]
    svc = serve(k8s_node("mig", gpus=1, mode="mig"), *pods)
    got = answer(svc, k8s_pod("p", mig_profile="3g.40gb"), {"mig": meta(pods[2], pods[0], pods[1])})
    assert got == {"mig": {"Pods": [{"UID": "uid-default-p1"}, {"UID": "uid-default-p2"}], "NumPDBViolations": 0}}
    assert answer(svc, k8s_pod("p", mig_profile="3g.40gb"), {"mig": meta(pods[2])}) is None


def test_a_pod_without_a_gpu_request_gets_the_proposal_back_without_empty_nodes(svc: Any) -> None:
    got = answer(svc, k8s_pod("p"), {"mps": meta(WEB, violations=1), "quiet": meta()})
    assert got == {"mps": {"Pods": [{"UID": "uid-default-web"}], "NumPDBViolations": 1}}


@pytest.mark.parametrize(
    ("victims", "fragment"),
    [
        ({"mps": {"Pods": [{"metadata": {"uid": "u"}, "spec": {"priority": "high"}}]}}, "spec.priority"),
        ({"mps": {"Pods": [], "NumPDBViolations": -1}}, "NumPDBViolations"),
    ],
)
def test_malformed_victims_are_refused_with_no_candidates(svc: Any, victims: Any, fragment: str) -> None:
    response = svc.http.post("/preempt", json={"Pod": k8s_pod("p", gpu_fraction="0.5"), "NodeNameToVictims": victims})
    assert response.json() == {"NodeNameToMetaVictims": None}
    assert fragment in response.headers["X-Gpuslice-Error"]


def prioritised(pod: dict[str, Any], priority: int) -> dict[str, Any]:
    return dict(pod, spec={**pod["spec"], "priority": priority})


def test_victims_beyond_the_proposal_on_the_right_gpu(svc: Any) -> None:
    # kube-scheduler proposes a (GPU 0, priority 3) alone: a whole GPU needs GPU 0 emptied (a and b)
    # or c (GPU 1). A preemptor of priority 2 may evict b and c (priority 1) but not a unproposed:
    # c alone is the fewest, on the right GPU, though kube-scheduler did not name it.
    pod = prioritised(k8s_pod("p", gpu_count="1"), 2)
    assert answer(svc, pod, {"mps": meta(A, violations=1)}) == {
        "mps": {"Pods": [{"UID": "uid-default-c"}], "NumPDBViolations": 1}
    }
    # a fraction: b (priority 1, 500) frees half of GPU 0 and beats the proposed a (priority 3)
    assert answer(svc, prioritised(k8s_pod("q", gpu_fraction="0.5"), 2), {"mps": meta(A)}) == {
        "mps": {"Pods": [{"UID": "uid-default-b"}], "NumPDBViolations": 0}
    }


def test_only_pods_of_strictly_lower_priority_are_added(svc: Any) -> None:
    # priority 1: b and c are not below it (kube-scheduler's rule is strictly lower), so only the
    # proposed a may go, and a alone frees no whole GPU: the node is dropped
    assert answer(svc, prioritised(k8s_pod("p", gpu_count="1"), 1), {"mps": meta(A)}) is None


def test_a_pod_already_being_deleted_is_not_added(serve: Any) -> None:
    # GPU 0: d (whole, being deleted); GPU 1: f (whole). The pod wants a whole GPU; kube-scheduler
    # proposes f. d would tie with f on every count and come first by name, but its deletion is
    # under way: evicting it again frees nothing sooner, and the pod would wait for it anyway.
    d = holding("d", "n", 0, 1000, priority=0)
    d["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    f = holding("f", "n", 1, 1000, priority=0)
    svc = serve(k8s_node("n", gpus=2), d, f)
    got = answer(svc, prioritised(k8s_pod("p", gpu_count="1"), 5), {"n": meta(f)})
    assert got == {"n": {"Pods": [{"UID": "uid-default-f"}], "NumPDBViolations": 0}}
