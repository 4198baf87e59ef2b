"""Time, behind a seam: wall time for the timestamps other replicas read, monotonic time for grace periods.

Tests pass a fake clock; nothing in this package calls ``time`` or ``datetime.now`` directly
except :class:`SystemClock` (waits between retries use real time, through ``threading.Event``).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The current wall time, timezone-aware."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back."""


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()


SYSTEM_CLOCK = SystemClock()


def rfc3339(moment: datetime) -> str:
    """``2024-05-01T12:00:00Z``: the Kubernetes timestamp format (whole seconds, UTC)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: object) -> datetime | None:
    """The moment ``text`` names, or None if it is not an RFC 3339 timestamp."""
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
