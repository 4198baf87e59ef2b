"""The usage annotation's codec: what the node agent writes, the extender reads back the same."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.errors import InventoryError
from scheduler.core.measured import MAX_STRAY, Measured, MeasuredShare, StrayUse, parse_usage, usage_annotation

shares = st.builds(
    MeasuredShare,
    st.integers(0, 15),
    st.integers(0, 200_000),
    st.one_of(st.none(), st.integers(0, 1000)),
    st.booleans(),
)
strays = st.builds(
    StrayUse, st.integers(0, 15), st.integers(1, 4_000_000), st.integers(0, 200_000), st.text(max_size=40)
)
pods = st.dictionaries(
    st.from_regex(r"[a-z0-9-]{1,12}/[a-z0-9-]{1,20}", fullmatch=True),
    st.lists(shares, max_size=3).map(tuple),
    max_size=6,
)


def canonical(stray: list[StrayUse]) -> tuple[StrayUse, ...]:
    return tuple(sorted(stray, key=lambda s: (-s.memory_mib, s.index, s.pid)))


@settings(max_examples=100, deadline=None)
@given(pods, st.lists(strays, max_size=MAX_STRAY), st.integers(0, 50), st.sampled_from(["", "2026-01-01T00:00:00Z"]))
def test_what_the_agent_writes_reads_back_the_same(
    by_pod: dict[str, tuple[MeasuredShare, ...]], stray: list[StrayUse], omitted: int, at: str
) -> None:
    measured = Measured(at, by_pod, canonical(stray), omitted)
    assert parse_usage("gpu-1", usage_annotation(measured)) == measured


@settings(max_examples=50, deadline=None)
@given(st.lists(strays, min_size=MAX_STRAY + 1, max_size=MAX_STRAY + 15))
def test_strays_past_the_limit_are_counted_and_the_largest_kept(stray: list[StrayUse]) -> None:
    back = parse_usage("gpu-1", usage_annotation(Measured("", {}, tuple(stray))))
    assert back.stray == canonical(stray)[:MAX_STRAY]
    assert back.stray_omitted == len(stray) - MAX_STRAY


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("not json", "usage annotation: not JSON"),
        ([], "usage annotation: usage must be an object"),
        ({"pods": {"a/b": [{"index": 0, "usedMiB": -1}]}}, "pods['a/b'][0].usedMiB must be an integer >= 0, got -1"),
        (
            {"pods": {"a/b": [{"index": 0, "usedMiB": 1, "overrun": "yes"}]}},
            "pods['a/b'][0].overrun must be true or false",
        ),
        ({"pods": {"a/b": [{"index": 0, "usedMiB": 1, "used": 2}]}}, "pods['a/b'][0].used: unknown key; accepted"),
        ({"pods": []}, "pods must be an object of pod -> shares"),
        ({"stray": [{"index": 0, "pid": 1, "memoryMiB": 5, "why": 7}]}, "stray[0].why must be a string"),
        ({"colour": 1}, "usage.colour: unknown key"),
    ],
)
def test_a_bad_annotation_is_named(body: object, message: str) -> None:
    text = body if isinstance(body, str) else json.dumps(body)
    with pytest.raises(InventoryError) as caught:
        parse_usage("gpu-1", text)
    assert str(caught.value).startswith("node gpu-1: usage annotation: ") and message in str(caught.value)
