"""``POST /mutate``, ``POST /validate`` and ``POST /validate-eviction``: the webhook on a FastAPI ``APIRouter``.

The app that includes ``router`` may set ``app.state.webhook_config`` to a
:class:`~scheduler.webhook.review.WebhookConfig` (its annotation prefix, scheduler name,
policies); without one the webhook uses the defaults plus the environment
(``WebhookConfig.from_env``). The body is read raw, never through FastAPI's validation, so
a malformed body gets the webhook's own 400 reply rather than a 422 or a 500.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from functools import cache

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse

from .eviction import validate_eviction
from .review import Reply, WebhookConfig, internal_error, malformed, mutate, validate

router = APIRouter(tags=["admission webhook"])
log = logging.getLogger("gpuslice.webhook")

# The API server never sends more than a few MiB; anything larger is not a review.
MAX_BODY_BYTES = 16 * 1024 * 1024


@cache
def _default_config() -> WebhookConfig:
    return WebhookConfig.from_env(os.environ)


def config_of(request: Request) -> WebhookConfig:
    config = getattr(request.app.state, "webhook_config", None)
    return config if isinstance(config, WebhookConfig) else _default_config()


async def _read(request: Request) -> object | Reply:
    # Stop reading at the cap: a client streaming gigabytes must not make the service hold them.
    too_large = f"body: larger than the {MAX_BODY_BYTES} bytes accepted; accepted: an AdmissionReview of one pod"
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        return malformed(too_large)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return malformed(too_large)
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        body: object = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return malformed(f"body: not JSON ({exc}); accepted: an AdmissionReview admission.k8s.io/v1 as JSON")
    return body


def _send(reply: Reply) -> JSONResponse:
    return JSONResponse(reply.body, status_code=reply.status)


async def _answer(request: Request, decide: Callable[[object, WebhookConfig], Reply]) -> JSONResponse:
    body = await _read(request)
    if isinstance(body, Reply):
        return _send(body)
    try:
        return _send(decide(body, config_of(request)))
    except Exception as exc:  # a bug must not become an opaque 500: deny, saying why
        log.exception("admission review failed")
        return _send(internal_error(body, exc))


@router.post("/mutate")
async def mutate_pod(request: Request) -> JSONResponse:
    """Mutating admission for pods: scheduler name, device environment, no forged records."""
    return await _answer(request, mutate)


@router.post("/validate")
async def validate_pod(request: Request) -> JSONResponse:
    """Validating admission for pods: request annotations, and output annotations kept to gpuslice."""
    return await _answer(request, validate)


@router.post("/validate-eviction")
async def validate_pod_eviction(request: Request) -> JSONResponse:
    """Validating admission for the node agent's evictions: only pods gpuslice placed on its node."""
    return await _answer(request, validate_eviction)


def mount(app: FastAPI, config: WebhookConfig) -> None:
    """Serve ``/mutate``, ``/validate`` and ``/validate-eviction`` on ``app`` with ``config``."""
    app.state.webhook_config = config
    app.include_router(router)
