"""A clock that moves only when told: ``FakeClock().advance(seconds)``; both wall and monotonic time."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta


class FakeClock:
    def __init__(self, start: datetime = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)) -> None:
        self._lock = threading.Lock()
        self._now = start
        self._mono = 1000.0

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += timedelta(seconds=seconds)
            self._mono += seconds
