"""The admission webhook for pods (AdmissionReview ``admission.k8s.io/v1``).

``review`` holds the pure decisions (AdmissionReview dict in, reply dict out); ``routes``
exposes them as ``POST /mutate`` and ``POST /validate`` on a FastAPI ``APIRouter`` that
the extender's app includes. The webhook never talks to the API server.
"""

from __future__ import annotations

from .review import ENV_FROM_ANNOTATIONS, Reply, ReviewError, WebhookConfig, mutate, validate

__all__ = ["ENV_FROM_ANNOTATIONS", "Reply", "ReviewError", "WebhookConfig", "mutate", "validate"]
