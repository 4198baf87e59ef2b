"""The extender wire protocol, with bodies shaped as kube-scheduler's Go client sends them."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from .kit import PREFIX, binding, filter_args, k8s_node, k8s_pod

BROKEN = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {"name": "broken", "annotations": {PREFIX + "inventory": "{not json"}},
    "status": {"allocatable": {"cpu": "8", "memory": "16Gi"}},
}


def nodes() -> list[dict[str, Any]]:
    return [
        k8s_node("mps-a", gpus=4),  # 4 x H100-80GB (81920 MiB), MPS
        k8s_node("mps-b", gpus=2),
        k8s_node("t4", gpus=2, model="T4", mode="time-slicing", replicas=2),  # 15360 MiB each
        k8s_node("mig", gpus=1, model="A100-80GB", mode="mig"),
        k8s_node("small", gpus=1),  # one H100 under MPS
        k8s_node("cpu", gpus=0),
        BROKEN,
    ]


NAMES = ["mps-a", "mps-b", "t4", "mig", "small", "cpu", "broken"]


@pytest.fixture
def svc(serve: Any) -> Any:
    big = k8s_pod("big", gpu_memory="70000")
    served = serve(*nodes(), big, policy="binpack")  # the scores below are worked out for binpack
    assert served.post("bind", binding(big, "small")) == {"Error": ""}  # small keeps 11920 MiB and 14.5% compute
    return served


class TestFilter:
    def test_names_mode_splits_passed_failed_and_unresolvable(self, svc: Any) -> None:
        pod = k8s_pod("p", gpu_memory="20Gi")  # 20480 MiB on one GPU
        got = svc.post("filter", filter_args(pod, [*NAMES, "ghost"]))
        assert set(got) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
        assert got["Nodes"] is None and got["Error"] == ""
        # MIG: 20480 MiB and ceil(20480 * 1000 / 81920) = 250 milli -> the 2g.20gb profile covers it
        assert got["NodeNames"] == ["mps-a", "mps-b", "mig"]
        assert got["FailedNodes"] == {
            # big took ceil(70000 * 1000 / 81920) = 855 milli of compute; 20480 MiB needs 250: fits once big is gone
            # what is asked, not the node's own 14.5 percent free: kube-scheduler counts nodes by reason
            "small": "needs 25 percent compute on one GPU, more than is free",
            "ghost": "node unknown to gpuslice",
        }
        never = got["FailedAndUnresolvableNodes"]
        assert set(never) == {"t4", "cpu", "broken"}
        assert "20480" in never["t4"] and never["cpu"] == "node has no GPUs"
        assert "broken" in never["broken"] and "inventory" in never["broken"]

    def test_full_nodes_are_answered_with_nodes_unknown_fields_kept(self, svc: Any) -> None:
        items = [dict(n, futureField={"x": 1}) for n in nodes()]
        got = svc.post("filter", filter_args(k8s_pod("p", gpu_fraction="0.5"), nodes=items))
        assert got["NodeNames"] is None
        passed = got["Nodes"]["items"]
        # half a GPU: t4 gives 15360 // 2 = 7680 MiB of a replica; MIG: 500 milli needs 4 of 7 slices (4g.40gb)
        assert [n["metadata"]["name"] for n in passed] == ["mps-a", "mps-b", "t4", "mig"]
        assert all(n["futureField"] == {"x": 1} for n in passed)
        assert got["FailedNodes"] == {"small": "needs 50 percent compute on one GPU, more than is free"}

    @pytest.mark.parametrize(
        "payload",
        [
            {"Pod": None, "Nodes": None, "NodeNames": None},
            {"Pod": "x", "NodeNames": []},
            {"Pod": {}, "NodeNames": "mps-a"},
            {"Pod": {}, "Nodes": {"items": [{"metadata": {}}]}},
            [1, 2],
        ],
    )
    def test_malformed_envelopes_get_an_error_not_a_500(self, svc: Any, payload: Any) -> None:
        before = svc.extender.cache.snapshot()
        got = svc.post("filter", payload)
        assert got["Error"] and got["NodeNames"] is None and got["Nodes"] is None
        assert svc.extender.cache.snapshot() == before

    def test_null_and_empty_node_lists(self, svc: Any) -> None:
        pod = k8s_pod("p", gpu_fraction="0.5")
        for payload in ({"Pod": pod, "Nodes": None, "NodeNames": None}, filter_args(pod, [])):
            got = svc.post("filter", payload)
            assert got == {
                "Nodes": None,
                "NodeNames": [],
                "FailedNodes": None,
                "FailedAndUnresolvableNodes": None,
                "Error": "",
            }
        got = svc.post("filter", filter_args(pod, nodes=[]))
        assert got["Nodes"] == {"metadata": {}, "items": []} and got["NodeNames"] is None

    def test_not_json(self, svc: Any) -> None:
        response = svc.http.post("/filter", content=b'{"Pod": ', headers={"Content-Type": "application/json"})
        assert response.status_code == 200
        assert "not JSON" in response.json()["Error"]

    def test_oversized_body_is_refused_before_parsing(self, serve: Any) -> None:
        svc = serve(*nodes(), max_body_bytes=2048)
        pod = k8s_pod("p", gpu_fraction="0.5")
        response = svc.http.post("/filter", json=filter_args(pod, [f"node-{i:04d}" for i in range(400)]))
        assert response.status_code == 200
        assert "over the limit of 2048 bytes" in response.json()["Error"]

    def test_oversized_body_without_a_length_is_refused_as_it_streams(self, serve: Any) -> None:
        svc = serve(*nodes(), max_body_bytes=2048)
        body = orjson.dumps(filter_args(k8s_pod("p", gpu_fraction="0.5"), [f"node-{i:04d}" for i in range(400)]))
        chunks = iter([body[i : i + 1000] for i in range(0, len(body), 1000)])  # sent chunked: no Content-Length
        response = svc.http.post("/filter", content=chunks, headers={"Content-Type": "application/json"})
        assert response.status_code == 200
        assert "request body is over the limit of 2048 bytes" in response.json()["Error"]
        assert svc.post("filter", filter_args(k8s_pod("q", gpu_fraction="0.5"), ["mps-a"]))["NodeNames"] == ["mps-a"]

    @pytest.mark.parametrize("verb", ["filter", "prioritize", "bind", "preempt"])
    def test_a_verb_answers_post_only(self, svc: Any, verb: str) -> None:
        response = svc.http.get(f"/{verb}")
        assert response.status_code == 405 and response.headers["allow"] == "POST"
        assert svc.http.post(f"/{verb}x", json={}).status_code == 404  # other paths go to the app's routes

    def test_malformed_request_leaves_every_node_unresolvable_with_one_message(self, svc: Any) -> None:
        # Not a top-level Error: kube-scheduler counts that as a scheduling error and retries it
        # with back-off; every node unresolvable makes the pod Unschedulable like any that fits nowhere.
        names = [f"node-{i}" for i in range(5000)]
        got = svc.post("filter", filter_args(k8s_pod("p", gpu_fraction="1.5"), names))
        assert got["Error"] == "" and got["NodeNames"] == [] and got["FailedNodes"] is None
        unresolvable = got["FailedAndUnresolvableNodes"]
        assert sorted(unresolvable) == sorted(names)
        (reason,) = set(unresolvable.values())
        assert reason.startswith("gpuslice cannot schedule this pod: ")
        assert "gpuslice.io/gpu-fraction" in reason and "accepted" in reason

    def test_malformed_request_with_full_nodes_returns_no_node(self, svc: Any) -> None:
        got = svc.post("filter", filter_args(k8s_pod("p", gpu_fraction="1.5"), nodes=[{"metadata": {"name": "mps-a"}}]))
        assert got["Error"] == "" and got["Nodes"]["items"] == []
        assert list(got["FailedAndUnresolvableNodes"]) == ["mps-a"]

    def test_reasons_read_right_through_go_format_strings(self, svc: Any) -> None:
        # no "%" reaches kube-scheduler, which has formatted extender messages with fmt verbs
        got = svc.post("filter", filter_args(k8s_pod("p", gpu_compute="50%%"), ["mps-a"]))
        reason = got["FailedAndUnresolvableNodes"]["mps-a"]
        assert "%" not in reason and "50\uff05\uff05" in reason

    def test_pod_without_gpu_passes_everywhere(self, svc: Any) -> None:
        got = svc.post("filter", filter_args(k8s_pod("web"), [*NAMES, "ghost"]))
        assert got["NodeNames"] == [*NAMES, "ghost"] and got["FailedNodes"] is None

    def test_pod_with_fields_no_client_knows(self, svc: Any) -> None:
        pod = k8s_pod("p", gpu_fraction="0.5")
        pod["spec"]["resourceClaims"] = [{"name": "gpu", "futureKnob": True}]
        pod["spec"]["containers"][0]["restartPolicyRules"] = [{"action": "Restart"}]
        pod["status"] = {"phase": "Pending", "resize": "Proposed", "brandNew": {"a": [1]}}
        pod["someTopLevelThing"] = 3
        got = svc.post("filter", filter_args(pod, ["mps-a"]))
        assert got["NodeNames"] == ["mps-a"]

    def test_envelope_keys_match_case_insensitively_as_in_go(self, svc: Any) -> None:
        got = svc.post("filter", {"pod": k8s_pod("p", gpu_fraction="0.5"), "nodenames": ["mps-a"]})
        assert got["NodeNames"] == ["mps-a"]

    def test_a_bind_counts_at_once(self, serve: Any) -> None:
        first, second = k8s_pod("first", gpu_fraction="0.5"), k8s_pod("second", gpu_fraction="0.6")
        svc = serve(k8s_node("one", gpus=1), first, second)
        assert svc.post("filter", filter_args(second, ["one"]))["NodeNames"] == ["one"]
        assert svc.post("bind", binding(first, "one"))["Error"] == ""
        got = svc.post("filter", filter_args(second, ["one"]))  # 0.5 + 0.6 > 1 GPU
        assert got["NodeNames"] == [] and "one" in got["FailedNodes"]


class TestPrioritize:
    def test_top_level_array_of_ints_in_request_order(self, svc: Any) -> None:
        pod = k8s_pod("p", gpu_fraction="0.5")
        got = svc.post("prioritize", filter_args(pod, ["mps-a", "mps-b", "cpu", "ghost"]))
        assert isinstance(got, list)
        assert [set(hp) for hp in got] == [{"Host", "Score"}] * 4
        # binpack: mps-a 500 / 4000 = 12.5% -> 12 -> 1; mps-b 500 / 2000 = 25%: the node ranked
        # first gets 10 (the others at most 9); cpu has no GPU and ghost is unknown -> 0
        assert got == [
            {"Host": "mps-a", "Score": 1},
            {"Host": "mps-b", "Score": 10},
            {"Host": "cpu", "Score": 0},
            {"Host": "ghost", "Score": 0},
        ]
        assert all(type(hp["Score"]) is int for hp in got)

    def test_full_nodes_mode(self, svc: Any) -> None:
        got = svc.post("prioritize", filter_args(k8s_pod("p", gpu_fraction="0.5"), nodes=nodes()[:2]))
        assert got == [{"Host": "mps-a", "Score": 1}, {"Host": "mps-b", "Score": 10}]

    def test_malformed_gets_an_empty_list_and_a_header(self, svc: Any) -> None:
        response = svc.http.post("/prioritize", content=b"[")
        assert response.status_code == 200 and response.json() == []
        assert "not JSON" in response.headers["X-Gpuslice-Error"]

    def test_malformed_request_scores_zero(self, svc: Any) -> None:
        got = svc.post("prioritize", filter_args(k8s_pod("p", gpu_count="x"), ["mps-a"]))
        assert got == [{"Host": "mps-a", "Score": 0}]

    def test_empty(self, svc: Any) -> None:
        assert svc.post("prioritize", {"Pod": k8s_pod("p", gpu_fraction="0.5"), "Nodes": None, "NodeNames": None}) == []


class TestBind:
    def test_bind_writes_one_record_and_is_idempotent(self, svc: Any) -> None:
        pod = k8s_pod("p", gpu_fraction="0.25")
        svc.backend.put_pod(pod)
        assert svc.post("bind", binding(pod, "mps-a")) == {"Error": ""}
        assert svc.post("bind", binding(pod, "mps-a")) == {"Error": ""}
        stored = svc.backend.pods()["default/p"]
        assert stored["spec"]["nodeName"] == "mps-a"
        record = json.loads(stored["metadata"]["annotations"][PREFIX + "allocation"])
        assert record["node"] == "mps-a" and len(record["devices"]) == 1
        assert record["devices"][0]["memoryMiB"] == 81920 // 4
        state = svc.extender.cache.state("mps-a")
        assert [k for k, _ in state.pods] == ["default/p"]
        again = svc.post("bind", binding(pod, "mps-b"))
        assert "already bound to node mps-a" in again["Error"]

    def test_bind_refused_when_it_does_not_fit(self, svc: Any) -> None:
        pod = k8s_pod("p", gpu_memory="20Gi")
        svc.backend.put_pod(pod)
        got = svc.post("bind", binding(pod, "small"))
        assert got["Error"] == "needs 25 percent compute on one GPU, more than is free"
        assert "nodeName" not in svc.backend.pods()["default/p"]["spec"]
        assert [k for k, _ in svc.extender.cache.state("small").pods] == ["default/big"]

    @pytest.mark.parametrize(
        ("payload", "expected"),
        [
            ({"PodName": "nobody", "PodNamespace": "default", "PodUID": "u", "Node": "mps-a"}, "not known"),
            ({"PodName": "big", "PodNamespace": "default", "PodUID": "other-uid", "Node": "small"}, "replaced"),
            ({"PodName": "", "PodNamespace": "default", "PodUID": "", "Node": "mps-a"}, "PodName"),
            ({"PodName": "x", "PodNamespace": None, "PodUID": None, "Node": None}, "Node"),
            ({"PodName": 3, "Node": "mps-a"}, "PodName must be a string"),
        ],
    )
    def test_bind_errors(self, svc: Any, payload: dict[str, Any], expected: str) -> None:
        got = svc.post("bind", payload)
        assert set(got) == {"Error"} and expected in got["Error"]

    def test_bind_malformed_json(self, svc: Any) -> None:
        response = svc.http.post("/bind", content=b"nope")
        assert response.status_code == 200 and "not JSON" in response.json()["Error"]

    def test_bind_to_unusable_or_unknown_node(self, svc: Any) -> None:
        pod = k8s_pod("p", gpu_fraction="0.5")
        svc.backend.put_pod(pod)
        assert "not found" in svc.post("bind", binding(pod, "ghost"))["Error"]
        assert "inventory" in svc.post("bind", binding(pod, "broken"))["Error"]

    def test_pod_without_gpu_is_bound_with_its_cpu(self, svc: Any) -> None:
        pod = k8s_pod("web", cpu="3")
        svc.backend.put_pod(pod)
        assert svc.post("bind", binding(pod, "cpu")) == {"Error": ""}
        assert svc.extender.cache.state("cpu").cpu_milli == 3000


class TestPreempt:
    def test_keeps_nodes_where_the_victims_free_enough(self, svc: Any) -> None:
        pod = k8s_pod("p", gpu_memory="20Gi")
        got = svc.post(
            "preempt",
            {
                "Pod": pod,
                "NodeNameToVictims": None,
                "NodeNameToMetaVictims": {
                    "small": {"Pods": [{"UID": "uid-default-big"}], "NumPDBViolations": 0},  # frees 70000 MiB
                    "t4": {"Pods": [], "NumPDBViolations": 0},  # T4 has 15360 MiB: never
                },
            },
        )
        assert got == {
            "NodeNameToMetaVictims": {"small": {"Pods": [{"UID": "uid-default-big"}], "NumPDBViolations": 0}}
        }

    def test_full_victims_and_nothing_to_gain(self, svc: Any) -> None:
        pod = k8s_pod("p", gpu_memory="20Gi")
        victim = k8s_pod("other")
        got = svc.post(
            "preempt", {"Pod": pod, "NodeNameToVictims": {"small": {"Pods": [victim], "NumPDBViolations": 1}}}
        )
        assert got == {"NodeNameToMetaVictims": None}

    def test_malformed(self, svc: Any) -> None:
        response = svc.http.post("/preempt", json={"Pod": {}, "NodeNameToMetaVictims": {"x": {"Pods": [{}]}}})
        assert response.json() == {"NodeNameToMetaVictims": None}
        assert "UID" in response.headers["X-Gpuslice-Error"]


def test_url_prefix(serve: Any) -> None:
    svc = serve(k8s_node("one", gpus=1), url_prefix="/gpuslice/")
    assert svc.config.url_prefix == "/gpuslice"
    got = svc.post("filter", filter_args(k8s_pod("p", gpu_fraction="0.5"), ["one"]))
    assert got["NodeNames"] == ["one"]
    assert svc.http.post("/filter", json={}).status_code == 404


def test_a_client_gone_before_its_body_is_in_gets_no_answer_and_changes_nothing(serve: Any) -> None:
    import asyncio

    from scheduler.extender.app import create_app

    svc = serve(*nodes())
    app = create_app(svc.extender)
    before = svc.extender.describe()
    sent: list[Any] = []
    messages = [{"type": "http.request", "body": b'{"PodName":"p",', "more_body": True}, {"type": "http.disconnect"}]

    async def receive() -> Any:
        return messages.pop(0)

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/bind", "headers": [], "client": ("127.0.0.1", 1)}
    asyncio.run(app(scope, receive, send))
    assert sent == [] and messages == []
    assert svc.extender.describe() == before
