"""The benchmark driver (benchmarks/extender_driver.py) plays kube-scheduler: its shortcuts
for reading answers without decoding thousands of entries read them as a full decoding does,
and one short run against ``gpuslice serve`` schedules every pod without over-allocation."""

from __future__ import annotations

import json
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.extender import wire
from tests.fakes.driver import driver

# node names are DNS subdomains: no quote, no bracket
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
