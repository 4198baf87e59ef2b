"""The benchmark driver (benchmarks/extender_driver.py) plays kube-scheduler: its shortcuts
for reading answers without decoding thousands of entries read them as a full decoding does,
one short run against ``gpuslice serve`` schedules every pod without over-allocation, and a
pod that fits nowhere is retried at kube-scheduler's pace."""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from operator import itemgetter
from pathlib import Path
from typing import Any, ClassVar
from unittest.mock import ANY

import numpy as np
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.extender import wire
from tests.fakes.driver import driver

# node names are DNS subdomains: no quote, no bracket
PREFIX = "gpuslice.io/inventory"

node_names = st.lists(st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,12}[a-z0-9])?", fullmatch=True), max_size=12, unique=True)
# reasons are free text, including what the driver looks for
reasons = st.text(max_size=20) | st.sampled_from(['"NodeNames":[', "]", '"Score":10}', '"Host":"x"', "\\"])


def full_reading(data: bytes) -> tuple[dict[str, Any], Any]:
    decoded = orjson.loads(data)
    names = decoded.get("NodeNames")
    return {**decoded, "NodeNames": None}, names


@given(names=node_names, failed=st.dictionaries(st.text(max_size=8), reasons, max_size=4), cut=st.integers(0, 12))
def test_filter_answers_read_as_a_full_decoding_reads_them(names: list[str], failed: dict[str, str], cut: int) -> None:
    passed = names[:cut]
    answers = [
        # gpuslice's own writing, and the do-nothing endpoint's (orjson's key order)
        wire.filter_result(wire.ExtenderArgs({}, names, None), range(len(passed)), failed, passed_names=passed),
        orjson.dumps({"Nodes": None, "NodeNames": passed, "FailedNodes": failed or None, "Error": ""}),
        # the key inside a reason written before the real one
        orjson.dumps({"FailedNodes": failed or None, "Why": '"NodeNames":[ "x" ]', "NodeNames": passed}),
        orjson.dumps({"NodeNames": None, "Error": "not ready"}),
    ]
    for data in answers:
        rest, raw = driver.split_filter_answer(data)
        expected_rest, expected_names = full_reading(data)
        assert rest == expected_rest
        assert orjson.loads(raw) == expected_names


@given(scores=st.lists(st.integers(0, wire.MAX_PRIORITY), max_size=40))
def test_the_top_host_is_the_first_with_the_highest_score(scores: list[int]) -> None:
    names = [f"node-{i}" for i in range(len(scores))]
    answers = [
        wire.HostPriorities([wire.host_entry(n) for n in names]).encode(np.array(scores, dtype=np.int64)),
        wire.host_priorities(names, scores),
        orjson.dumps([{"Score": s, "Host": n} for n, s in zip(names, scores, strict=True)]),  # another key order
        json.dumps([{"Host": n, "Score": s} for n, s in zip(names, scores, strict=True)]).encode(),  # spaces
    ]
    for data in answers:
        decoded = orjson.loads(data)
        expected = max(decoded, key=itemgetter("Score"))["Host"] if decoded else None
        assert driver.top_host(data) == expected


def test_a_short_run_schedules_every_pod_without_over_allocation(tmp_path: Path) -> None:
    path = tmp_path / "cluster.json"
    cluster = driver.write_cluster(path, 40, 60, seed=3, mix="project")
    port = driver.free_port()
    command = [*driver.gpuslice_command(), "serve", "--cluster-file", str(path), "--port", str(port)]
    with driver.running(command, port, tmp_path / "serve.log") as (client, pid):
        scheduler = driver.KubeScheduler(port, cluster.nodes, cluster.running)
        got = scheduler.run(cluster.pending, 10, pid)
        scheduler.first_calls(got, count=6)
        bad = driver.over_allocated(client)
        placed = client.get("/debug/nodes")["nodes"]
    assert bad == 0
    assert got.attempts >= 50 and len(got.filter_ms) == len(got.prioritize_ms) == got.attempts
    assert got.bound >= 40 and got.bind_errors == 0
    held = [entry["pod"] for node in placed for entry in node.get("pods") or []]
    assert len(held) == len(set(held))  # no pod placed twice
    assert len(held) >= got.bound  # every bind the driver counted is held by the service
    # first calls of new shapes and of hopeless pods: each timed, no hopeless pod passed anywhere
    assert len(got.cold_ms) == 6 and len(got.hopeless_ms) == 3 and min(got.cold_ms + got.hopeless_ms) > 0
    assert got.hopeless_passed == 0


@pytest.mark.parametrize(
    ("total", "percentage", "expected"),
    [
        (50, 0, 50),
        (1000, 0, 420),
        (5000, 0, 500),
        (20000, 0, 1000),
        (5000, 100, 5000),
        (5000, 30, 1500),
        (150, 10, 100),
    ],
)
def test_the_number_of_nodes_a_cycle_looks_for_is_kube_schedulers(total: int, percentage: int, expected: int) -> None:
    # adaptive: 50 - total / 125 percent, at least 5%, at least 100 nodes; below 100 nodes, all
    # 1000: 50 - 8 = 42% -> 420; 5000: 10% -> 500; 20000: 50 - 160 < 5 -> 5% -> 1000
    assert driver.nodes_to_find(total, percentage) == expected


def test_the_sampled_window_rotates_from_pod_to_pod() -> None:
    nodes = [driver.make_node(i, {"devices": []}) for i in range(1000)]
    scheduler = driver.KubeScheduler(0, nodes, [], percentage=0)
    first = scheduler.feasible((1000, 1024))
    second = scheduler.feasible((1000, 1024))
    assert len(first) == len(second) == 420
    assert first[0] == 0 and second[0] == 420 and scheduler.start == 840  # every node passed, so 420 were looked at
    scheduler.cpu[840:1000] = 0  # those cannot take the next pod: it looks further, wrapping around
    third = scheduler.feasible((1000, 1024))
    assert third[0] == 0 and len(third) == 420 and scheduler.start == 420


class _Scripted(BaseHTTPRequestHandler):
    """An extender that refuses every node to pods named ``hopeless-*`` (noting when it was
    asked), passes the others, and binds slowly, so the driver's loop lives on meanwhile."""

    protocol_version = "HTTP/1.1"
    asked: ClassVar[list[float]] = []

    def do_POST(self) -> None:
        args = orjson.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/bind":
            time.sleep(0.6)
            body = b'{"Error":""}'
        elif self.path == "/prioritize":
            body = orjson.dumps([{"Host": n, "Score": 1} for n in args["NodeNames"]])
        elif args["Pod"]["metadata"]["name"].startswith("hopeless"):
            _Scripted.asked.append(time.monotonic())
            body = orjson.dumps({"NodeNames": [], "FailedNodes": dict.fromkeys(args["NodeNames"], "no"), "Error": ""})
        else:
            body = orjson.dumps({"NodeNames": args["NodeNames"], "FailedNodes": None, "Error": ""})
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_pod_that_fits_nowhere_is_retried_only_once_its_back_off_has_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    # kube-scheduler moves an unschedulable pod back on cluster events, to the active queue only
    # once its back-off since its last attempt has passed (1 s doubling to 10 s; shortened here)
    monkeypatch.setattr(driver.KubeScheduler, "BACKOFF_S", (0.1, 0.2))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Scripted.asked.clear()
    try:
        nodes = [driver.make_node(i, {"devices": []}) for i in range(3)]
        pods = [driver.make_pod("hopeless-0", {}, 1, 1)] + [driver.make_pod(f"pod-{i}", {}, 1, 1) for i in range(3)]
        scheduler = driver.KubeScheduler(server.server_address[1], nodes, [], retry_every=1)
        got = scheduler.run(pods, warmup=0)
    finally:
        server.shutdown()
        server.server_close()
    gaps = np.diff(_Scripted.asked)
    assert got.bound == 3 and got.unschedulable == len(_Scripted.asked)
    assert 3 <= len(_Scripted.asked) <= 12, _Scripted.asked  # retried while the binds are under way, not 20 times
    wanted = [min(0.2, 0.1 * 2**k) for k in range(len(gaps))]
    assert (gaps >= np.array(wanted) - 0.005).all(), (gaps, wanted)


def test_a_run_stops_after_its_cycles() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        nodes = [driver.make_node(i, {"devices": []}) for i in range(3)]
        pods = [driver.make_pod(f"hopeless-{i}", {}, 1, 1) for i in range(5)]
        got = driver.KubeScheduler(server.server_address[1], nodes, []).run(pods, warmup=0, max_cycles=3)
    finally:
        server.shutdown()
        server.server_close()
    assert got.attempts == 3 and got.unschedulable == 3


def test_the_floor_counts_what_it_binds_and_refuses_what_fits_nowhere(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    path = tmp_path / "cluster.json"
    cluster = driver.write_cluster(path, 12, 0, seed=3, mix="project")
    names = [f"node-{i:05d}" for i in range(12)]
    mig = [n["metadata"]["name"] for n in cluster.nodes if '"mode":"mig"' in n["metadata"]["annotations"][PREFIX]]
    plain = [n for n in names if n not in mig]  # whole GPUs and shares: not on GPUs in MIG mode
    assert mig and len(plain) >= 11
    client = TestClient(driver.floor_app(path))

    def ask(route: str, name: str, wanted: dict[str, str], listed: list[str] = names) -> Any:
        pod = driver.make_pod(name, wanted, 1, 8)
        return client.post(route, content=orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": listed})).json()

    whole = ask("/filter", "whole", {"gpu-count": "8"})
    assert whole["NodeNames"] == plain and sorted(whole["FailedNodes"]) == mig  # empty nodes: every plain one fits
    assert client.post("/bind", json={"PodName": "whole", "Node": plain[0]}).json() == {"Error": ""}
    one = ask("/filter", "one", {"gpu-count": "1"})
    assert one["NodeNames"] == plain[1:] and sorted(one["FailedNodes"]) == sorted([plain[0], *mig])  # 8 GPUs taken
    # a share fits beside a quarter taken: the fullest node that still fits ranks first
    assert ask("/filter", "quarter", {"gpu-fraction": "0.25"})["NodeNames"] == plain[1:]
    assert client.post("/bind", json={"PodName": "quarter", "Node": plain[5]}).json() == {"Error": ""}
    ranked = ask("/prioritize", "next", {"gpu-fraction": "0.5"}, plain[1:])
    assert len(ranked) == 10 and ranked[0]["Host"] == plain[5] and ranked[0]["Score"] > ranked[1]["Score"]
    assert ask("/filter", "profile", {"mig-profile": "3g.40gb"})["NodeNames"] == mig  # a profile: MIG GPUs only
    nowhere = ask("/filter", "nowhere", {"gpu-count": "9"})
    assert nowhere["NodeNames"] == [] and sorted(nowhere["FailedNodes"]) == names
    assert ask("/filter", "a30", {"gpu-model": "A30", "gpu-memory": "1000"})["NodeNames"] == []
    # a node the cluster does not have fails, it does not raise
    assert ask("/filter", "stray", {"gpu-count": "1"}, ["no-such-node"])["FailedNodes"] == {"no-such-node": ANY}
    # a bind the floor can no longer honour is refused, not over-allocated
    ask("/filter", "again", {"gpu-count": "1"})
    assert client.post("/bind", json={"PodName": "again", "Node": plain[0]}).json()["Error"]


def _malformed(answer: dict[str, Any]) -> bool:
    """gpuslice's answer to a malformed pod: every node unresolvable with the one message."""
    unresolvable = answer["FailedAndUnresolvableNodes"] or {}
    return any(reason.startswith("gpuslice cannot schedule this pod:") for reason in unresolvable.values())


def _verdict(answer: dict[str, Any]) -> str:
    return "malformed" if _malformed(answer) else "fits" if answer["NodeNames"] else "nowhere"


@pytest.mark.parametrize("fill", [0.0, 0.85])
def test_the_floor_answers_the_gfd_mix_as_gpuslice_does(tmp_path: Path, fill: float) -> None:
    # the second mix: nodes by GFD labels, by allocatable alone, MIG mixed and single, nodes
    # gpuslice cannot read; pods by annotation and by nvidia.com/* resources, malformed ones and
    # ones that fit nowhere. Each pod's verdict (malformed / fits nowhere / fits somewhere) is
    # gpuslice's, every listed node is answered once, and a malformed pod gets gpuslice's error.
    from starlette.testclient import TestClient

    from scheduler.core.k8s import parse_node

    path = tmp_path / "cluster.json"
    cluster = driver.write_cluster(path, 80, 160, seed=5, mix="gfd", fill=fill)
    kinds = set()
    for node in cluster.nodes:
        try:
            devices = parse_node(node).devices
            kinds.add((devices[0].model.name, devices[0].mode.value) if devices else "none")
        except Exception:
            kinds.add("unreadable")
    assert {("UNKNOWN", "exclusive"), ("A100-80GB", "mig"), ("L4", "time-slicing"), "unreadable"} <= kinds
    assert ("A100-40GB", "mig") in kinds  # MIG single: its MIG devices read as static MIG GPUs
    names = [n["metadata"]["name"] for n in cluster.nodes]
    floor = TestClient(driver.floor_app(path))
    port = driver.free_port()
    command = [*driver.gpuslice_command(), "serve", "--cluster-file", str(path), "--port", str(port)]
    seen: dict[str, int] = {}
    with driver.running(command, port, tmp_path / "serve.log"):
        conn = driver.Connection(port)
        for pod in cluster.pending:
            body = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})
            theirs = orjson.loads(conn.post(b"/filter", body))
            response = floor.post("/filter", content=body)
            assert response.status_code == 200
            ours = response.json()
            assert _verdict(ours) == _verdict(theirs), pod["metadata"]
            seen[_verdict(ours)] = seen.get(_verdict(ours), 0) + 1
            assert not ours["Error"] and not theirs["Error"]
            if _malformed(ours):
                assert ours["FailedAndUnresolvableNodes"] == theirs["FailedAndUnresolvableNodes"]
                assert sorted(ours["FailedAndUnresolvableNodes"]) == sorted(names) and not ours["NodeNames"]
                ranked = floor.post("/prioritize", content=body).json()
                assert [(r["Host"], r["Score"]) for r in ranked] == [(n, 0) for n in names]  # as gpuslice
            else:
                assert sorted(ours["NodeNames"] + list(ours["FailedNodes"] or {})) == sorted(names)
        conn.close()
    assert seen["malformed"] >= 5 and seen["nowhere"] >= 3 and seen["fits"] >= 100, seen


def test_the_floor_serves_a_run_of_the_gfd_mix(tmp_path: Path) -> None:
    path = tmp_path / "cluster.json"
    cluster = driver.write_cluster(path, 40, 120, seed=4, mix="gfd", fill=0.5)
    port = driver.free_port()
    command = [sys.executable, str(driver.__file__), "--floor-cluster", str(path), "--noop-port", str(port)]
    with driver.running(command, port, tmp_path / "floor.log") as (_, pid):
        scheduler = driver.KubeScheduler(port, cluster.nodes, cluster.running)
        got = scheduler.run(cluster.pending, 10, pid)
    # every call answered (a 500 or a closed connection raises in the driver), pods bound and
    # malformed or hopeless ones turned away; a bind fails only where the GPUs are gone (the
    # floor keeps no holds), never for an error of its own
    assert got.attempts >= 100 and got.bound >= 40 and got.unschedulable >= 5
    assert set(scheduler.errors) <= {"no GPU free"}


def test_collection_time_is_counted_where_it_falls_inside_a_call() -> None:
    # pauses: (start, seconds, generation, collected); spans: (start, end)
    pauses = [(1.0, 0.5, 0, 0), (2.9, 0.2, 1, 3), (5.0, 1.0, 2, 0)]
    assert driver.inside((0.0, 0.9), pauses) == 0.0
    assert driver.inside((1.2, 3.0), pauses) == pytest.approx(0.3 + 0.1)  # the end of one, the start of another
    assert driver.inside((4.0, 7.0), pauses) == pytest.approx(1.0)  # one whole
    got = driver.Result(spans=[(0.0, 0.9), (1.2, 3.0), (4.0, 7.0)], cold_spans=[(5.5, 5.6)])
    got.filter_ms, got.prioritize_ms = [900.0, 1800.0, 3000.0], [0.0, 0.0, 0.0]
    got.cold_run_ms, got.cold_wait_ms, got.cold_labels = [30.0], [70.0], ["cold gpu-fraction=0.5"]
    line = driver.gc_report(got, pauses)
    assert "cold gpu-fraction=0.5: 100.0 ms = 30.0 on a CPU + 70.0 waiting (collection 100.0)" in line
    got.cold_driver_wait_ms = [4.0]
    assert "waiting (collection 100.0), the driver waiting 4.0" in driver.gc_report(got, pauses)
    unlogged = driver.gc_report(got, None)  # the do-nothing extender and the floor: no collection log
    assert "collection" not in unlogged and "cold gpu-fraction=0.5: 100.0 ms = 30.0 on a CPU + 70.0 waiting" in unlogged
    assert "3 collections (gen 0/1/2: 1/1/1)" in line and "1700.0 ms in all" in line
    assert "first calls: 1 of 1 with a collection inside (100.0 ms in all)" in line
    assert "the slowest: 30.0 on a CPU + 70.0 waiting" in line


def test_schedstat_counts_a_threads_time_on_a_cpu() -> None:
    import os

    run0, wait0 = driver.schedstat(os.getpid())
    sum(range(3_000_000))
    run1, wait1 = driver.schedstat(os.getpid())
    assert run1 - run0 > 1.0 and wait1 >= wait0  # ms
    assert driver.schedstat(None) != driver.schedstat(None)  # nan: no server to read


def test_a_reestimate_is_laid_beside_the_attempts_after_it() -> None:
    spans = [(float(t), t + 0.010 * (3 if 4 <= t < 6 else 1)) for t in range(10)]  # attempts 4 and 5: 30 ms
    got = driver.Result(spans=spans)
    line = driver.learn_report(got, [(4.0, 0.002, 316)], after=2)
    assert line is not None and "at pod 316: 2.0 ms, then f+p median 30.0 / max 30.0 ms over 2 attempts" in line
    assert "run median f+p 10.0 ms" in line
    assert "none (1 in all, at pods [9])" in str(driver.learn_report(got, [(99.0, 0.001, 9)]))


def test_an_unknown_policy_is_refused_before_anything_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    # Regression: `--policy default` ran the do-nothing extender, the floor and the other
    # policies first, then ended in a traceback when gpuslice refused the name.
    started: list[Any] = []
    monkeypatch.setattr(driver, "run", started.append)
    monkeypatch.setattr(sys, "argv", ["extender_driver.py", "--policy", "binpack", "default"])
    with pytest.raises(SystemExit) as raised:
        driver.main()
    assert str(raised.value).startswith("--policy default: unknown; accepted: ")
    assert "fgd-reserve" in str(raised.value) and started == []
