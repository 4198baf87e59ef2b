"""The control-plane benchmark's retry of a creation cut short by the transport."""

from __future__ import annotations

import random
from typing import Any

import httpx
import pytest

from benchmarks import controlplane_bench as bench
from tests.e2e.controlplane import ApiError


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench.time, "sleep", lambda _s: None)


def failing(errors: list[Exception], result: Any = "made") -> tuple[Any, list[int]]:
    calls: list[int] = []

    def call(*_args: Any) -> Any:
        calls.append(1)
        if errors:
            raise errors.pop(0)
        return result

    return call, calls


def test_a_transport_error_is_tried_again_until_the_call_lands() -> None:
    call, calls = failing([httpx.ReadError("TLS record cut short"), httpx.ConnectError("reset")])
    assert bench.retried(call, "node-1") == "made"
    assert len(calls) == 3


def test_a_transport_error_on_every_try_is_raised() -> None:
    call, calls = failing([httpx.ReadError("a"), httpx.ReadError("b"), httpx.ReadError("c")])
    with pytest.raises(httpx.ReadError):
        bench.retried(call)
    assert len(calls) == 3


def test_a_conflict_after_a_cut_short_try_means_the_first_one_landed() -> None:
    call, calls = failing([httpx.ReadError("cut"), ApiError(409, {"message": "already exists"})])
    assert bench.retried(call) is None
    assert len(calls) == 2


@pytest.mark.parametrize("status", [409, 403, 500])
def test_an_api_error_on_the_first_try_is_raised_not_retried(status: int) -> None:
    call, calls = failing([ApiError(status, {"message": "no"})])
    with pytest.raises(ApiError):
        bench.retried(call)
    assert len(calls) == 1


def test_the_fitting_only_mix_has_no_pod_that_fits_nowhere_and_the_plain_mix_has_them() -> None:
    rng_plain, rng_fitting = random.Random(11), random.Random(11)
    plain = [bench.shape(rng_plain, False) for _ in range(2000)]
    fitting = [bench.shape(rng_fitting, True) for _ in range(2000)]
    assert any(p in bench.HOPELESS for p in plain)
    assert not any(p in bench.HOPELESS for p in fitting)
    assert {tuple(sorted(p)) for p in fitting} & {tuple(sorted(p)) for p in plain if p not in bench.HOPELESS}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--modes", "default,fast"], "--modes default,fast: unknown fast; accepted: default,binpack,noop,none"),
        (["--max-backoff", "0"], "--max-backoff 0: accepted: a whole number of seconds, 1 or more"),
    ],
)
def test_bad_options_are_one_line_errors_before_anything_starts(
    argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench, "build", lambda: pytest.fail("nothing may start on bad options"))
    monkeypatch.setattr(bench.sys, "argv", ["controlplane_bench.py", "--tls", "tls", *argv])
    with pytest.raises(SystemExit) as exit_:
        bench.main()
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
