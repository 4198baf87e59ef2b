"""Remembered NodeNames arrays (``NameLists``): a body whose names were met before is
read without decoding them again, and reads exactly as the plain decoding reads it."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.extender import wire
from scheduler.extender.answers import NameLists

NAMES = ["node-a", "node-b", "node-c"]
POD = {"metadata": {"name": "p", "uid": "u"}}


def parsed(body: bytes, known: NameLists | None) -> tuple[str, Any]:
    """("ok", (pod, names, nodes)) or ("error", message): what parse_args makes of ``body``."""
    try:
        args = wire.parse_args(body, known)
    except wire.WireError as exc:
        return "error", str(exc)
    return "ok", (args.pod, list(args.names), args.nodes)


def test_a_list_met_before_is_not_decoded_again() -> None:
    known = NameLists()
    body = orjson.dumps({"Pod": POD, "Nodes": None, "NodeNames": NAMES})
    first = wire.parse_args(body, known)
    again = wire.parse_args(orjson.dumps({"Pod": {**POD, "x": 1}, "Nodes": None, "NodeNames": NAMES}), known)
    assert list(first.names) == NAMES and again.names is first.names  # the same list object, not a new decoding
    assert again.pod == {**POD, "x": 1}


def test_names_a_filter_answer_sent_are_known_to_prioritize() -> None:
    known = NameLists()
    passed = ["node-b", "node-c"]
    raw = known.encode(passed)
    assert raw == b'["node-b","node-c"]' and known.encode(passed) is raw
    args = wire.parse_args(b'{"Pod":{"metadata":{"name":"p"}},"Nodes":null,"NodeNames":' + raw + b"}", known)
    assert args.names is passed


def test_only_the_latest_lists_are_kept() -> None:
    known = NameLists(size=2)
    for i in range(3):
        known.remember(orjson.dumps([f"n{i}"]), [f"n{i}"])
    assert known.find(b'["n0"]') is None
    assert known.find(b'["n1"]') == ["n1"] and known.find(b'["n2"]') == ["n2"]


@pytest.mark.parametrize(
    "body",
    [
        # the key inside a string of the pod: the split must not be taken there
        b'{"Pod":{"metadata":{"name":"p","annotations":{"a":",\\"NodeNames\\":[\\"x\\"]}"}}},"NodeNames":["node-a"]}',
        b'{"Pod":{"metadata":{"name":"p"},"spec":{"x":[1,"NodeNames",2]}},"NodeNames":["node-a"]}',
        # a nested NodeNames member that looks like the envelope's
        b'{"Pod":{"metadata":{"name":"p"},"x":{"y":1,"NodeNames":["ghost"]}}}',
        b'{"Pod":{"metadata":{"name":"p"}},"Nodes":{"items":[{"metadata":{"name":"node-z"}}]},"NodeNames":["node-a"]}',
        b'{"Pod":{"metadata":{"name":"p"}},"nodenames":["x"],"NodeNames":["node-a"]}',
        b'{,"NodeNames":["node-a"]}',
        b'{"Pod":{"metadata":{"name":"p"}},,"NodeNames":["node-a"]}',
        b'{"Pod":{"metadata":{"name":"p"}},"NodeNames":["node-a"], "Extra": 1}',
        b'{"Pod":{"metadata":{"name":"p"}},"NodeNames":["node-a", 7]}',
        b'{"Pod":{"metadata":{"name":"p"}},"NodeNames":["node-a"]} x',
        b'{"Pod":{"metadata":{"name":"p"}},"NodeNames":null}',
        b'{"Pod":{"metadata":{"name":"p"}} , "NodeNames" : ["node-a"] }',
        b'{"NodeNames":["node-a"],"Pod":{"metadata":{"name":"p"}}}',
        b'{"Nodes":null,"NodeNames":["node-a"]}',
    ],
)
def test_tricky_bodies_read_as_the_plain_decoding_reads_them(body: bytes) -> None:
    known = NameLists()
    known.remember(b'["node-a"]', ["node-a"])
    known.remember(b'["x"]', ["x"])
    assert parsed(body, known) == parsed(body, None)


names = st.lists(st.text(min_size=1, max_size=12), max_size=6)
values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet=st.sampled_from('ab,:"{}[] \\N')),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["NodeNames", "a", "Nodes"]), inner),
    max_leaves=8,
)
members = st.dictionaries(st.sampled_from(["Pod", "Nodes", "NodeNames", "nodenames", "Extra"]), values, max_size=4)


@given(
    envelope=members,
    listed=names,
    pod=st.dictionaries(st.sampled_from(["metadata", "spec", "NodeNames"]), values, max_size=3),
    last=st.booleans(),
    spaced=st.booleans(),
    seen=st.booleans(),
)
def test_any_body_reads_as_the_plain_decoding_reads_it(
    envelope: dict[str, Any], listed: list[str], pod: dict[str, Any], last: bool, spaced: bool, seen: bool
) -> None:
    body_obj = {**envelope, "Pod": pod}
    if last:  # Go's order: NodeNames last
        body_obj.pop("NodeNames", None)
        body_obj["NodeNames"] = listed
    text = json.dumps(body_obj, indent=1 if spaced else None)
    body = text.encode()
    known = NameLists()
    if seen:
        known.remember(json.dumps(listed, indent=1 if spaced else None).encode(), listed)
        known.remember(orjson.dumps(listed), listed)
    assert parsed(body, known) == parsed(body, None)
    assert parsed(body, known) == parsed(body, known)  # and again, with whatever it remembered


def test_a_known_list_keeps_the_bytes_it_came_with_and_moves_to_the_front() -> None:
    known = NameLists(size=2)
    came = ["node-a"]
    known.remember(b'[ "node-a" ]', came)  # as some client spaced it
    known.remember(b'["x"]', ["x"])
    assert known.encode(came, b'["node-a"]') == b'[ "node-a" ]'  # the body's bytes stay what is matched
    known.encode(["y"], b'["y"]')  # evicts the least recent: now ["x"], not came
    assert known.find(b'[ "node-a" ]') is came and known.find(b'["x"]') is None
