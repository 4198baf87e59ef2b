"""The allocation record: encode/decode, annotations, and rebuilding a node from records."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.core.allocation import Allocation, DeviceShare, MigSlot, decode_record, encode_record, record_annotations
from scheduler.core.catalog import ProfileSpec
from scheduler.core.errors import RecordError
from scheduler.core.fit import fit
from scheduler.core.inventory import SharingMode
from scheduler.core.request import Demand, GpuKind, GpuRequest
from scheduler.core.state import NodeState, rebuild
from tests.builders import make_node


def test_round_trip_and_annotations() -> None:
    node = make_node(gpus=2, mode="mps")
    alloc = fit(
        Demand(500, 1024, GpuRequest(GpuKind.SHARE, 2, memory_mib=8192, compute_milli=300)), NodeState.empty(node)
    ).allocations[0]
    text = encode_record(alloc, "2026-11-29T12:00:00Z")
    body = json.loads(text)
    assert body["node"] == "n1" and body["timestamp"] == "2026-11-29T12:00:00Z"
    assert body["devices"][0] == {
        "uuid": "n1-gpu0",
        "index": 0,
        "mode": "mps",
        "memoryMiB": 8192,
        "computeMilli": 300,
        "mig": None,
    }
    assert decode_record(text, "ns/p") == alloc
    notes = record_annotations(alloc, "gpuslice.io/", "allocating", "t")
    assert notes["gpuslice.io/visible-devices"] == "n1-gpu0,n1-gpu1"
    assert notes["gpuslice.io/mps-thread-percentage"] == "30"
    assert notes["gpuslice.io/mps-memory-limit"] == "0=8192M,1=8192M"
    assert notes["gpuslice.io/bind-phase"] == "allocating"


def test_mig_record_round_trip() -> None:
    node = make_node(mode="mig", model="A100-80GB")
    alloc = fit(
        Demand(0, 0, GpuRequest(GpuKind.MIG, 1, profile=ProfileSpec.parse("3g.40gb"))), NodeState.empty(node)
    ).allocations[0]
    body = json.loads(encode_record(alloc))
    assert body["devices"][0]["mig"] == {"profile": "3g.40gb", "start": 4, "size": 4, "slices": 3}
    assert decode_record(encode_record(alloc), "p") == alloc


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("not json", "not JSON"),
        ("[]", "must be a JSON object"),
        ('{"node": "n1"}', "'devices' must be a list"),
        ('{"node": "n1", "devices": [1]}', "must be an object"),
        ('{"node": "n1", "devices": [{"mode": "warp"}]}', "'mode' must be one of"),
        (
            '{"node": "n1", "devices": [{"mode": "mps", "uuid": "u", "index": -1, "memoryMiB": 1, "computeMilli": 1}],'
            ' "cpuMilli": 0, "memoryMiB": 0}',
            "'index' must be an integer >= 0",
        ),
        (
            '{"node": "n1", "devices": [{"mode": "mig", "uuid": "u", "index": 0, "memoryMiB": 1, "computeMilli": 1,'
            ' "mig": null}], "cpuMilli": 0, "memoryMiB": 0}',
            "MIG share needs 'mig'",
        ),
        ('{"node": "", "devices": [], "cpuMilli": 0, "memoryMiB": 0}', "'node' must be a non-empty string"),
        ('{"node": "n1", "devices": [], "cpuMilli": true, "memoryMiB": 0}', "'cpuMilli' must be an integer"),
    ],
)
def test_malformed_records_name_the_pod_and_the_problem(text: str, fragment: str) -> None:
    with pytest.raises(RecordError) as caught:
        decode_record(text, "team/pod-1")
    assert str(caught.value).startswith("pod team/pod-1: ")
    assert fragment in str(caught.value)


def test_rebuild_equals_applying_and_reports_conflicts_without_dropping_silently() -> None:
    node = make_node(mode="mps")
    state = NodeState.empty(node)
    demand = Demand(0, 0, GpuRequest(GpuKind.SHARE, 1, memory_mib=40960, compute_milli=500))
    records = []
    for name in ("a", "b"):
        alloc = fit(demand, state).allocations[0]
        state = state.apply(name, alloc)
        records.append((name, encode_record(alloc)))
    rebuilt, problems = rebuild(node, reversed(records))
    assert problems == [] and rebuilt == state
    # a third record for the same full GPU conflicts; a garbage one does not decode: both reported by pod
    conflicting = ("c", records[0][1])
    garbage = ("d", "{")
    rebuilt, problems = rebuild(node, [*records, conflicting, garbage])
    assert rebuilt == state
    assert [p.pod for p in problems] == ["c", "d"]
    assert "conflicts on node n1" in str(problems[0])


texts = st.text(min_size=1, max_size=8) | st.sampled_from(["\x7f", "n\u00e9", "a\\b"])  # beyond ASCII too
counts = st.integers(0, 2**40)
shares = st.builds(
    DeviceShare,
    texts,
    st.integers(0, 15),
    st.sampled_from(list(SharingMode)),
    counts,
    counts,
    st.none() | st.builds(MigSlot, st.integers(0, 7), st.integers(1, 8), st.integers(1, 7), texts),
)


@given(st.builds(Allocation, texts, st.tuples(shares) | st.tuples(shares, shares), counts, counts), st.none() | texts)
def test_a_record_is_the_compact_sorted_ascii_json_of_its_allocation(alloc: Allocation, timestamp: str | None) -> None:
    """Byte for byte what json.dumps writes (records already written are compared as text)."""
    text = encode_record(alloc, timestamp)
    body = json.loads(text)
    assert text == json.dumps(body, separators=(",", ":"), sort_keys=True)
