"""The board's parts where they meet: the texts that reasons and problems are ids into start
afresh past a bound, and whoever holds ids is told (the node problems numbered again, the
kept reasons and scores forgotten). The answers themselves are held to the plain node-by-node
ones elsewhere (test_policy_ports, test_properties)."""

from __future__ import annotations

import pytest

from scheduler.core.allocation import Allocation
from scheduler.core.board import UNKNOWN_NODE, Board, Status
from scheduler.core.policies import make_policy
from scheduler.core.request import Demand, GpuRequest
from scheduler.core.texts import Texts
from tests.builders import make_state


def test_texts_start_afresh_past_their_bound_and_say_so_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Texts, "MAX", 3)
    texts = Texts()
    told: list[tuple[list[str], list[str]]] = []
    texts.on_forget(lambda old: told.append((list(old), list(texts.values))))
    assert [texts.of(t) for t in ("a", "b", "a", "c")] == [1, 2, 1, 3]
    first = texts.values
    assert told == []
    # "", a, b, c: four texts, past the bound of 3: afresh, and "d" the first of the new list
    assert texts.of("d") == 1
    assert told == [(["", "a", "b", "c"], [""])]  # told before "d" was numbered
    assert texts.values == ["", "d"]
    assert texts.values is not first  # how an answer made before sees that its ids no longer hold
    assert first == ["", "a", "b", "c"]


def test_a_node_keeps_its_problem_when_the_texts_start_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Texts, "MAX", 4)
    board = Board([make_state(name="ok")])
    board.put_problem("bad", "no report from the agent")
    for k in range(10):  # every new problem a new text: the texts start afresh several times
        board.put_problem("worse", f"report {k} is stale")
    assert board.problem("bad") == "no report from the agent"
    assert board.problem("worse") == "report 9 is stale"
    outcomes = board.filter(make_policy("binpack"), Demand(1000, 0, GpuRequest()))
    assert outcomes.status.tolist() == [Status.FITS, Status.UNRESOLVABLE, Status.UNRESOLVABLE]
    assert outcomes.reasons(board.names(), Status.UNRESOLVABLE) == {
        "bad": "no report from the agent",
        "worse": "report 9 is stale",
    }


def test_a_filter_during_which_the_texts_start_afresh_answers_in_the_new_texts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reasons name numbers, so every pod of a new size can add a text; the call that takes the
    texts past their bound had already worked out some reasons (the problem of a node that
    cannot be used, first) as ids of the old list."""
    monkeypatch.setattr(Texts, "MAX", 4)
    busy = make_state(name="busy", gpus=0, cpu_milli=8000)
    busy = busy.apply("p", Allocation("busy", (), 6000, 0))
    board = Board([busy])
    board.put_problem("bad", "no report from the agent")
    policy = make_policy("binpack")
    for cpu in range(3000, 3010):  # one new text a call: the texts start afresh every few calls
        outcomes = board.filter(policy, Demand(cpu, 0, GpuRequest()), board.positions(["busy", "bad", "gone"]))
        assert outcomes.status.tolist() == [Status.UNSCHEDULABLE, Status.UNRESOLVABLE, Status.UNSCHEDULABLE]
        assert [outcomes.texts[r] for r in outcomes.reason.tolist()] == [
            f"insufficient cpu: needs {cpu}m",
            "no report from the agent",
            UNKNOWN_NODE,
        ]
