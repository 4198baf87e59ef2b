"""Errors of the Kubernetes side; no exception of the ``kubernetes`` client leaves this package.

    GpusliceError                       (scheduler.core.errors)
    └── KubeError                       a call to the API server failed
        ├── KubeConfigError             no usable kubeconfig / in-cluster config (also a ConfigError)
        ├── ApiUnavailableError         no answer: connection refused or reset, timeout, TLS failure
        ├── ApiProtocolError            an answer that is not the JSON the call expects
        └── ApiStatusError              the API server answered with a non-2xx status
            ├── NotFoundError           404
            ├── ConflictError           409 (resourceVersion precondition, already exists, already bound)
            ├── GoneError               410 (resourceVersion too old: relist)
            └── TooManyRequestsError    429 (an eviction a PodDisruptionBudget forbids now; throttling)

Each is raised ``from`` the client's exception and names the call (verb and resource).
"""

from __future__ import annotations

import json
from typing import Any

from scheduler.core.errors import ConfigError, GpusliceError


class KubeError(GpusliceError):
    """A call to the Kubernetes API server failed; ``call`` is ``"verb resource"``."""

    def __init__(self, call: str, problem: str) -> None:
        self.call = call
        self.problem = problem
        super().__init__(f"{call}: {problem}" if call else problem)


class KubeConfigError(KubeError, ConfigError):
    """The client configuration (kubeconfig, in-cluster service account, URL) is unusable."""


class ApiUnavailableError(KubeError):
    """The API server did not answer (refused, reset, timed out): the outcome of a write is unknown."""


class ApiProtocolError(KubeError):
    """The API server answered with something other than the expected JSON."""


class ApiStatusError(KubeError):
    """The API server answered with an HTTP error status."""

    def __init__(self, call: str, status: int, reason: str, message: str) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        super().__init__(call, f"HTTP {status} {reason}: {message}" if message else f"HTTP {status} {reason}")


class NotFoundError(ApiStatusError):
    pass


class ConflictError(ApiStatusError):
    pass


class GoneError(ApiStatusError):
    pass


class TooManyRequestsError(ApiStatusError):
    pass


_BY_STATUS: dict[int, type[ApiStatusError]] = {
    404: NotFoundError,
    409: ConflictError,
    410: GoneError,
    429: TooManyRequestsError,
}


def status_error(call: str, status: int, body: str | bytes | None, default_reason: str = "") -> ApiStatusError:
    """The error for an HTTP status, with the reason and message of the Kubernetes ``Status`` body if any."""
    reason, message = default_reason, ""
    parsed: Any = None
    if body:
        try:
            parsed = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            message = (body.decode("utf-8", "replace") if isinstance(body, bytes) else body)[:200]
    if isinstance(parsed, dict):
        reason = str(parsed.get("reason") or reason)
        message = str(parsed.get("message") or "")
    return _BY_STATUS.get(status, ApiStatusError)(call, status, reason or "Error", message)
