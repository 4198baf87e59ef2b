"""kube-scheduler's node order learned from filter lists (``NodeOrder``): a list that is a
stretch of it is placed from its bytes alone, and every list is placed exactly where the
board's name lookup places it, whatever came before."""

from __future__ import annotations

import numpy as np
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.board import Board
from scheduler.extender.answers import Answers, Entries, NodeOrder
from tests.builders import make_state

NAMES = [f"node-{i:03d}" for i in range(40)]


def board_of(names: list[str]) -> Board:
    return Board(make_state(name=n) for n in names)


def windows(order: list[str], size: int, turns: int) -> list[list[str]]:
    """kube-scheduler's sampling: each list the next ``size`` of ``order``, wrapping around."""
    out, start = [], 0
    for _ in range(turns * len(order) // size + 1):
        out.append([order[(start + k) % len(order)] for k in range(size)])
        start = (start + size) % len(order)
    return out


def test_after_a_turn_the_stretches_of_kube_schedulers_order_are_matched_from_their_bytes() -> None:
    board = board_of(NAMES)
    order = NAMES[::2] + NAMES[1::2]  # not the board's own: it is learned
    learned = NodeOrder()
    lists = windows(order, 7, turns=3)  # 7 does not divide 40: the stretches start everywhere
    matched = 0
    for names in lists:
        raw = orjson.dumps(names)
        found = learned.match(raw, board)
        if found is None:
            learned.learn(board.positions(names), board, Entries(board))
        else:
            matched += 1
            assert found.tolist() == board.positions(names).tolist()
    # one turn (and one list, for the link from the last list to the first) to learn it
    assert matched >= len(lists) - (len(NAMES) // 7 + 2)


def test_a_list_that_is_not_a_stretch_is_not_matched() -> None:
    board = board_of(NAMES)
    learned = NodeOrder()
    for names in windows(NAMES, 10, turns=2):
        learned.learn(board.positions(names), board, Entries(board))
    assert learned.match(orjson.dumps(NAMES[3:9]), board) is not None
    for names in (
        NAMES[3:5] + NAMES[6:9],  # a node left out
        [NAMES[4], NAMES[3], *NAMES[5:9]],  # out of order
        [*NAMES[3:9], "elsewhere"],  # a name the board has not
        NAMES + NAMES[:1],  # longer than the cluster
        ["elsewhere", *NAMES[:3]],
    ):
        assert learned.match(orjson.dumps(names), board) is None, names
    spaced = b'["' + b'", "'.join(n.encode() for n in NAMES[3:9]) + b'"]'
    assert learned.match(spaced, board) is None  # not Go's spacing: read the plain way
    escaped = orjson.dumps(NAMES[3:9]).replace(b"node-004", b"node-00\\u0034")
    assert orjson.loads(escaped) == NAMES[3:9] and learned.match(escaped, board) is None


def test_a_node_joining_forgets_the_order() -> None:
    board = board_of(NAMES)
    learned = NodeOrder()
    for names in windows(NAMES, 10, turns=2):
        learned.learn(board.positions(names), board, Entries(board))
    assert learned.match(orjson.dumps(NAMES[:5]), board) is not None
    board.put(make_state(name="node-new"))
    assert learned.match(orjson.dumps(NAMES[:5]), board) is None


def test_links_that_make_no_single_cycle_make_no_order() -> None:
    board = board_of(NAMES)
    learned = NodeOrder()
    halves = [NAMES[:20], NAMES[20:]]  # each list starts again at its own half's start
    for _ in range(4):
        for names in halves:
            learned.learn(board.positions(names), board, Entries(board))
            learned.learn(board.positions(names), board, Entries(board))
    assert learned.match(orjson.dumps(NAMES[:5]), board) is None


lists = st.lists(
    st.one_of(
        st.tuples(st.integers(0, 39), st.integers(1, 40)).map(lambda t: [NAMES[(t[0] + k) % 40] for k in range(t[1])]),
        st.lists(st.sampled_from([*NAMES, "ghost"]), max_size=12),
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(order=st.permutations(NAMES), size=st.integers(3, 40), others=lists, mixed=st.booleans())
def test_every_list_is_placed_where_the_name_lookup_places_it(
    order: list[str], size: int, others: list[list[str]], mixed: bool
) -> None:
    """Through the answers' listing, as filter reads lists: windows of an order, then any lists."""
    board = board_of(NAMES)
    answers = Answers()
    stream = windows(order, size, turns=2) + (others if mixed else [])
    stream += windows(order, size, turns=1)
    for names in stream:
        listing = answers.listing(names, board, "filter", orjson.dumps(names))
        assert listing.positions.tolist() == board.positions(names).tolist(), names
        assert np.array_equal(listing.positions, board.positions(names))
