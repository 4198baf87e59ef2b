"""The Kubernetes side: list + watch of nodes and pods, and binds serialised per node.

The only package that imports ``kubernetes``; none of the client's exceptions or models
leave it. :data:`API_CALLS` is every call it makes, as ``(verb, apiGroup, resource)``.
"""

from .api import API_CALLS, DEFRAG_API_CALLS, KubeApi
from .backend import KubeBackend
from .clock import SYSTEM_CLOCK, Clock, SystemClock
from .errors import (
    ApiProtocolError,
    ApiStatusError,
    ApiUnavailableError,
    ConflictError,
    GoneError,
    KubeConfigError,
    KubeError,
    NotFoundError,
    TooManyRequestsError,
)
from .evict import Eviction, Evictor, Outcome
from .ledger import ledger_name
from .options import KubeOptions

__all__ = [
    "API_CALLS",
    "DEFRAG_API_CALLS",
    "SYSTEM_CLOCK",
    "ApiProtocolError",
    "ApiStatusError",
    "ApiUnavailableError",
    "Clock",
    "ConflictError",
    "Eviction",
    "Evictor",
    "GoneError",
    "KubeApi",
    "KubeBackend",
    "KubeConfigError",
    "KubeError",
    "KubeOptions",
    "NotFoundError",
    "Outcome",
    "SystemClock",
    "TooManyRequestsError",
    "ledger_name",
]
