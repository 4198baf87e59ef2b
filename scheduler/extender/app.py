"""The HTTP face: kube-scheduler's extender verbs plus health, metrics and inspection.

The verbs read the raw body (capped) and parse it as plain JSON, so unknown Pod and
Node fields pass. Whatever goes wrong, a verb answers HTTP 200: filter and bind with
``Error`` set, prioritize with an empty list and preempt with no candidates (their Go
types have no error field), each with an ``X-Gpuslice-Error`` header; nothing changes.

Only bind changes anything, and the verbs and ``/debug`` answer only clients in
``trusted_networks`` (by default loopback: kube-scheduler runs in gpuslice's pod); any
other client gets 403. The admission webhook, ``/metrics`` and the probes answer everyone.
"""

from __future__ import annotations

import ipaddress
import os
import time
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from scheduler.webhook import WebhookConfig
from scheduler.webhook.routes import router as webhook_router

from . import logs, wire
from .service import Extender

log = logs.get("http")

JSON = "application/json"


class BodyTooLarge(wire.WireError):
    pass


async def read_body(request: Request, cap: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > cap:
        raise BodyTooLarge(f"request body of {declared} bytes is over the limit of {cap} bytes (max_body_bytes)")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise BodyTooLarge(f"request body is over the limit of {cap} bytes (max_body_bytes)")
        chunks.append(chunk)
    return b"".join(chunks)


def trusted_client(networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> Callable[[Request], bool]:
    """Whether a request comes from one of ``networks``."""

    def trusted(request: Request) -> bool:
        client = request.client
        if client is None:
            return True  # a Unix socket
        try:
            address = ipaddress.ip_address(client.host)
        except ValueError:
            return True  # not TCP: an in-process ASGI client
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in network for network in networks)

    return trusted


def _forbidden(request: Request) -> Response:
    host = request.client.host if request.client else "?"
    message = f"{request.url.path} is served to kube-scheduler only; client {host} is not in trusted_networks"
    return Response(
        wire.dumps({"error": message}), 403, media_type=JSON, headers={"X-Gpuslice-Error": _header(message)}
    )


def create_app(extender: Extender) -> FastAPI:
    config = extender.config
    cap = config.max_body_bytes
    metrics = extender.metrics
    trusted = trusted_client([ipaddress.ip_network(n) for n in config.trusted_networks])
    app = FastAPI(title="gpuslice", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.extender = extender
    app.state.webhook_config = WebhookConfig.from_env(os.environ, prefix=config.prefix)
    app.include_router(webhook_router)  # POST /mutate, /validate: the admission webhook (scheduler/webhook)

    def verb(
        name: str, handle: Callable[[bytes], Awaitable[bytes]], on_error: Callable[[str], bytes]
    ) -> Callable[[Request], Awaitable[Response]]:
        observe = metrics.latency.labels(name).observe

        async def endpoint(request: Request) -> Response:
            if not trusted(request):
                metrics.bad_requests.labels(name).inc()
                return _forbidden(request)
            started = time.perf_counter()
            headers = None
            try:
                body = await handle(await read_body(request, cap))
            except wire.WireError as exc:
                metrics.bad_requests.labels(name).inc()
                log.warning("malformed request", extra={"verb": name, "reason": str(exc)})
                body, headers = on_error(str(exc)), {"X-Gpuslice-Error": _header(str(exc))}
            except Exception as exc:  # a bug must not become a 500: kube-scheduler would only see "500"
                metrics.bad_requests.labels(name).inc()
                log.exception("internal error", extra={"verb": name})
                message = f"internal error in gpuslice {name}: {type(exc).__name__}: {exc}"
                body, headers = on_error(message), {"X-Gpuslice-Error": _header(message)}
            observe(time.perf_counter() - started)
            return Response(body, media_type=JSON, headers=headers)

        endpoint.__name__ = name
        return endpoint

    async def do_filter(body: bytes) -> bytes:
        return extender.filter(wire.parse_args(body))

    async def do_prioritize(body: bytes) -> bytes:
        return extender.prioritize(wire.parse_args(body))

    async def do_bind(body: bytes) -> bytes:
        args = wire.parse_binding(body)
        return wire.binding_result(await run_in_threadpool(extender.bind, args))

    async def do_preempt(body: bytes) -> bytes:
        return extender.preempt(wire.parse_preemption(body))

    prefix = config.url_prefix
    routes = (
        ("filter", do_filter, lambda e: wire.filter_result(None, error=e)),
        ("prioritize", do_prioritize, lambda e: b"[]"),
        ("bind", do_bind, wire.binding_result),
        ("preempt", do_preempt, lambda e: wire.preemption_result({})),
    )
    for name, handle, on_error in routes:
        app.add_api_route(f"{prefix}/{name}", verb(name, handle, on_error), methods=["POST"])

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response(b"ok", media_type="text/plain")

    @app.get("/readyz")
    async def readyz() -> Response:
        if extender.backend.ready():
            return Response(b"ready", media_type="text/plain")
        return Response(b"not ready: cluster state not synced", status_code=503, media_type="text/plain")

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/debug/nodes")
    async def nodes(request: Request) -> Response:
        if not trusted(request):
            return _forbidden(request)
        return Response(wire.dumps({"nodes": extender.describe()}), media_type=JSON)

    @app.get("/debug/nodes/{name}")
    async def node(request: Request, name: str) -> Response:
        if not trusted(request):
            return _forbidden(request)
        found = extender.describe(name)
        if not found:
            return Response(wire.dumps({"error": f"node {name} is unknown to gpuslice"}), 404, media_type=JSON)
        return Response(wire.dumps(found[0]), media_type=JSON)

    return app


_CONTROL = str.maketrans({i: " " for i in (*range(32), 127)})


def _header(text: str) -> str:
    # A header value may hold no control character: h11 would drop the connection unanswered.
    return text.encode("ascii", "replace").decode()[:500].translate(_CONTROL)
