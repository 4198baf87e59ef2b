"""Every HTTP endpoint fuzzed (a few hundred bodies here; benchmarks/fuzz_endpoints.py tries
more than 10,000): never a 5xx, never a hang, never a change of allocation state, never the
catch-all internal error, and a message whenever a request is refused. See ``fuzzing``."""

from __future__ import annotations

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
