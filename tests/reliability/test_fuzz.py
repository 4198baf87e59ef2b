"""Every HTTP endpoint fuzzed (a few hundred bodies here; benchmarks/fuzz_endpoints.py tries
more than 10,000): never a 5xx, never a hang, never a change of allocation state, never the
catch-all internal error, and a message whenever a request is refused. See ``fuzzing``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings

from tests.fakes import FakeClock

from .fuzzing import ENDPOINTS, FuzzTarget, Probe, probes, table
from .harness import CountingApiServer, Replica

EXAMPLES = int(os.environ.get("GPUSLICE_FUZZ_EXAMPLES", "40"))


@pytest.fixture(scope="module")
def target() -> Iterator[FuzzTarget]:
    api = CountingApiServer()
    api.start()
    made: list[Replica] = []

    def make(**options: object) -> Replica:
        made.append(Replica(api.url, clock=FakeClock(), **options))  # type: ignore[arg-type]
        return made[-1]

    fuzz = FuzzTarget(api, make)
    yield fuzz
    print("\n" + table(fuzz.stats))
    fuzz.close()
    for replica in made:
        replica.stop()
    api.stop()


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_fuzz_endpoint(target: FuzzTarget, endpoint: str) -> None:
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,  # the same bodies on every CI run; the dedicated script draws new ones
        suppress_health_check=list(HealthCheck),
    )
    @given(probe=probes(endpoint, target.context, target.replica.config.url_prefix))
    def one(probe: Probe) -> None:
        verdict = target.check(probe)
        assert verdict.ok, f"{verdict.problems} <- {probe.describe()}"

    one()
    assert target.stats[endpoint].tried >= EXAMPLES


def test_invalid_utf8_is_named_as_such(target: FuzzTarget) -> None:
    # Regression: orjson calls every invalid UTF-8 body "str is not valid UTF-8: surrogates not allowed",
    # which names neither the byte nor where it is.
    body = b'{"Pod": {"metadata": {"name": "p\xff"}}, "NodeNames": []}'
    for verb in ("filter", "prioritize", "bind", "preempt"):
        verdict = target.check(Probe(verb, "POST", f"{target.replica.config.url_prefix}/{verb}", body))
        assert verdict.ok and verdict.refused
    status, headers, _ = target._send(Probe("filter", "POST", "/filter", body))
    assert status == 200
    assert headers["x-gpuslice-error"].startswith("request body is not UTF-8: byte 0xff at offset 32")


def test_a_control_character_in_an_error_message_still_gets_an_answer(target: FuzzTarget) -> None:
    # Regression (found by benchmarks/fuzz_endpoints.py): a node name with a NUL in a preempt
    # victims map went into the X-Gpuslice-Error header; h11 refused the header and the
    # connection closed with no answer at all.
    body = b'{"Pod": {"metadata": {"name": "p"}}, "NodeNameToMetaVictims": {"a\\u0000b\\u001b": {"Pods": [{}]}}}'
    verdict = target.check(Probe("preempt", "POST", "/preempt", body))
    assert verdict.ok and verdict.status == 200 and verdict.refused


def test_full_nodes_too_deep_to_send_back_are_refused_with_a_message(target: FuzzTarget) -> None:
    # Regression (found by benchmarks/fuzz_endpoints.py): filter echoes the Nodes it is sent; one
    # nesting deeper than orjson encodes (255) parsed fine, then the reply failed as an internal error.
    deep: object = 1
    for _ in range(300):
        deep = [deep]
    node = {"metadata": {"name": "mps-a"}, "x": deep}
    body = json.dumps({"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": [node]}})
    verdict = target.check(Probe("filter", "POST", "/filter", body.encode()))
    assert verdict.ok and verdict.refused
    _, headers, _ = target._send(Probe("filter", "POST", "/filter", body.encode()))
    assert "ExtenderArgs.Nodes cannot be sent back" in headers["x-gpuslice-error"]
