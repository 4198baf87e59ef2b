"""The admission webhook for pods (AdmissionReview ``admission.k8s.io/v1``).

``review`` (pods) and ``eviction`` (the node agent's evictions) hold the decisions
(AdmissionReview dict in, reply dict out); ``routes`` exposes them as ``POST /mutate``,
``POST /validate`` and ``POST /validate-eviction`` on a FastAPI ``APIRouter`` that the
extender's app includes. The webhook never talks to the API server: what it needs of the
cluster (where a pod runs, whether gpuslice counts its record) the service hands it.
"""

from __future__ import annotations

from .eviction import validate_eviction
from .review import ENV_FROM_ANNOTATIONS, Reply, ReviewError, WebhookConfig, mutate, validate

__all__ = ["ENV_FROM_ANNOTATIONS", "Reply", "ReviewError", "WebhookConfig", "mutate", "validate", "validate_eviction"]
