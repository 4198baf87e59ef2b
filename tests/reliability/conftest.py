"""Fixtures of the reliability suites: a conflict-counting fake API server, a fake clock, replicas."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.fakes import FakeClock

from .harness import CountingApiServer, Replica


@pytest.fixture
def api() -> Iterator[CountingApiServer]:
    server = CountingApiServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def replicas(api: CountingApiServer, clock: FakeClock) -> Iterator[Callable[..., Replica]]:
    """Start a service replica against ``api`` (on the fake clock unless ``clock=None`` is passed)."""
    made: list[Replica] = []

    def make(**options: Any) -> Replica:
        options.setdefault("clock", clock)
        replica = Replica(api.url, seed=len(made), **options)
        made.append(replica)
        return replica

    yield make
    for replica in made:
        replica.stop()
