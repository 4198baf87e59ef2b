"""The project's exception tree (one root, raised ``from`` the cause where there is one).

    GpusliceError
    ├── RequestError        a pod's GPU request is malformed or contradictory
    ├── InventoryError      a node's GPU inventory is malformed
    ├── RecordError         an allocation record does not decode or conflicts with the node
    ├── QuotaError          a GPUQuota object is malformed
    ├── ConfigError         configuration rejected at start-up (raised outside the core)
    └── UsageError          a command's option or input rejected before any work starts

"Does not fit" is not an error: fit returns a reason string instead.
"""

from __future__ import annotations


class GpusliceError(Exception):
    """Root of every error gpuslice raises on purpose."""


class RequestError(GpusliceError, ValueError):
    """A pod's GPU request cannot be understood.

    The message always names the key, the value and the accepted forms.
    """

    def __init__(self, key: str, value: object, accepted: str) -> None:
        self.key = key
        self.value = value
        self.accepted = accepted
        super().__init__(f"{key}: invalid value {value!r}; accepted: {accepted}")


class InventoryError(GpusliceError, ValueError):
    """A node's GPU inventory (annotation, labels or allocatable) is malformed."""


class RecordError(GpusliceError, ValueError):
    """An allocation record is malformed or conflicts with the inventory or another record."""

    def __init__(self, pod: str, problem: str) -> None:
        self.pod = pod
        self.problem = problem
        super().__init__(f"pod {pod}: {problem}")


class QuotaError(GpusliceError, ValueError):
    """A GPUQuota object is malformed; the message names the quota, the field path and what is accepted."""


class ConfigError(GpusliceError, ValueError):
    """Configuration rejected at start-up; the message starts with the field's path."""


class UsageError(GpusliceError, ValueError):
    """A command-line option or input rejected before any work starts; the message names the
    option, the value and what is accepted."""
