"""Fakes for tests: an API server over real HTTP (:mod:`.apiserver`) and a clock (:mod:`.clock`)."""

from .apiserver import FakeApiServer, Fault, audited
from .clock import FakeClock

__all__ = ["FakeApiServer", "FakeClock", "Fault", "audited"]
