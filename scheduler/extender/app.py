"""The HTTP face: kube-scheduler's extender verbs plus health, metrics and inspection.

The verbs are answered from the raw ASGI messages (:class:`Verbs`), everything else by
FastAPI. They read the raw body (capped) and parse it as plain JSON, so unknown Pod and
Node fields pass. Whatever goes wrong, a verb answers HTTP 200: filter and bind with
``Error`` set, prioritize with an empty list and preempt with no candidates (their Go
types have no error field), each with an ``X-Gpuslice-Error`` header; nothing changes.

Only bind changes anything, and the verbs and ``/debug`` answer only clients in
``trusted_networks`` (by default loopback: kube-scheduler runs in gpuslice's pod); any
other client gets 403. ``/metrics``, the probes and whatever the composition root mounts
(the admission webhook) answer everyone.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from scheduler import logs
from scheduler.core.policies import over_a_copy

from . import wire
from .defrag import plan_cluster, plan_json
from .service import Extender

log = logs.get("http")

JSON = "application/json"
NOT_READY = "gpuslice is not ready: the cluster state is not synced yet"


class BodyTooLarge(wire.WireError):
    pass


class Disconnected(Exception):
    """The client went away before its body was in: there is no one to answer."""


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


async def read_body(scope: Scope, receive: Receive, cap: int) -> bytes:
    for key, value in scope["headers"]:
        if key == b"content-length" and value.isdigit() and int(value) > cap:
            raise BodyTooLarge(
                f"request body of {value.decode()} bytes is over the limit of {cap} bytes (max_body_bytes)"
            )
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > cap:
            raise BodyTooLarge(f"request body is over the limit of {cap} bytes (max_body_bytes)")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def trusted_client(
    networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network],
) -> Callable[[tuple[str, int] | None], bool]:
    """Whether a client (the ASGI scope's ``client``) is in one of ``networks``."""

    @lru_cache(maxsize=1024)  # kube-scheduler calls from one address, call after call
    def trusted_host(host: str) -> bool:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return True  # not TCP: an in-process ASGI client
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in network for network in networks)

    def trusted(client: tuple[str, int] | None) -> bool:
        return client is None or trusted_host(client[0])  # None: a Unix socket

    return trusted


def _forbidden_body(path: str, client: tuple[str, int] | None) -> tuple[bytes, str]:
    host = client[0] if client else "?"
    message = f"{path} is served to kube-scheduler only; client {host} is not in trusted_networks"
    return wire.dumps({"error": message}), _header(message)


def _forbidden(request: Request) -> Response:
    body, header = _forbidden_body(request.url.path, request.client)
    return Response(body, 403, media_type=JSON, headers={"X-Gpuslice-Error": header})


async def _answer(send: Send, status: int, body: bytes, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", JSON.encode()), (b"content-length", str(len(body)).encode()), *headers],
        }
    )
    await send({"type": "http.response.body", "body": body})


Verb = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class VerbRoute:
    path: str
    methods: frozenset[str] = frozenset({"POST"})


class Verbs:
    """The ASGI entry point: POSTs to the extender verbs are answered here from the raw ASGI
    messages; every other request goes to the FastAPI app.

    FastAPI's request handling (routing, dependency solving, the Request and Response
    objects) cost about 0.1 ms a call, as much as a whole prioritize at 5,000 nodes.
    """

    def __init__(self, app: FastAPI, verbs: Mapping[str, Verb]) -> None:
        self.app = app
        self.verbs = verbs
        self.state = app.state

    @property
    def routes(self) -> list[Any]:
        """Every route served, the verbs' first (what an audit of the routes reads)."""
        return [*(VerbRoute(path) for path in self.verbs), *self.app.routes]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        verb = self.verbs.get(scope["path"]) if scope["type"] == "http" else None
        if verb is None:
            await self.app(scope, receive, send)
        elif scope["method"] != "POST":
            await _answer(send, 405, b'{"detail":"Method Not Allowed"}', [(b"allow", b"POST")])
        else:
            await verb(scope, receive, send)


# Something that adds routes of another face to the app (the composition root mounts the
# admission webhook this way, so that the extender never imports it).
Mount = Callable[[FastAPI], None]


def create_app(extender: Extender, mounts: Sequence[Mount] = ()) -> Verbs:
    config = extender.config
    cap = config.max_body_bytes
    metrics = extender.metrics
    trusted = trusted_client([ipaddress.ip_network(n) for n in config.trusted_networks])
    app = FastAPI(title="gpuslice", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.extender = extender
    for mount in mounts:
        mount(app)
    webhook = getattr(app.state, "webhook_config", None)
    if webhook is not None:  # the webhook warns of a pod its namespace's GPU quota can never admit,
        # and checks the node agent's evictions against the cluster state
        app.state.webhook_config = replace(webhook, quota_advice=extender.quota_advice, placement=extender.placement)

    def verb(name: str, handle: Callable[[bytes], Awaitable[bytes]], on_error: Callable[[str], bytes]) -> Verb:
        observe = metrics.latency.labels(name).observe
        bad = metrics.bad_requests.labels(name)

        async def endpoint(scope: Scope, receive: Receive, send: Send) -> None:
            if not trusted(scope.get("client")):
                bad.inc()
                body, header = _forbidden_body(scope["path"], scope.get("client"))
                await _answer(send, 403, body, [(b"x-gpuslice-error", header.encode())])
                return
            if not extender.synced:
                # Before the first sync the cache knows no node: an answer would be a guess.
                body = on_error(NOT_READY)
                await _answer(send, 200, body, [(b"x-gpuslice-error", _header(NOT_READY).encode())])
                return
            started = time.perf_counter()
            headers: list[tuple[bytes, bytes]] = []
            try:
                body = await handle(await read_body(scope, receive, cap))
            except Disconnected:
                return
            except wire.WireError as exc:
                bad.inc()
                log.warning("malformed request", extra={"verb": name, "reason": str(exc)})
                body, headers = on_error(str(exc)), [(b"x-gpuslice-error", _header(str(exc)).encode())]
            except Exception as exc:  # a bug must not become a 500: kube-scheduler would only see "500"
                bad.inc()
                log.exception("internal error", extra={"verb": name})
                message = f"internal error in gpuslice {name}: {type(exc).__name__}: {exc}"
                body, headers = on_error(message), [(b"x-gpuslice-error", _header(message).encode())]
            observe(time.perf_counter() - started)
            await _answer(send, 200, body, headers)

        return endpoint

    async def do_filter(body: bytes) -> bytes:
        return extender.filter(wire.parse_args(body, extender.names))

    async def do_prioritize(body: bytes) -> bytes:
        return extender.prioritize(wire.parse_args(body, extender.names))

    bind_waits = extender.backend.bind_waits

    async def do_bind(body: bytes) -> bytes:
        args = wire.parse_binding(body)
        return wire.binding_result(await run_in_threadpool(extender.bind, args) if bind_waits else extender.bind(args))

    async def do_preempt(body: bytes) -> bytes:
        return extender.preempt(wire.parse_preemption(body))

    prefix = config.url_prefix
    routes = (
        ("filter", do_filter, lambda e: wire.filter_result(None, error=e)),
        ("prioritize", do_prioritize, lambda e: b"[]"),
        ("bind", do_bind, wire.binding_result),
        ("preempt", do_preempt, lambda e: wire.preemption_result({})),
    )
    verbs = {f"{prefix}/{name}": verb(name, handle, on_error) for name, handle, on_error in routes}

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response(b"ok", media_type="text/plain")

    @app.get("/readyz")
    async def readyz() -> Response:
        if extender.synced and extender.backend.ready():
            return Response(b"ready", media_type="text/plain")
        return Response(NOT_READY.encode(), status_code=503, media_type="text/plain")

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/debug/nodes")
    async def nodes(request: Request) -> Response:
        if not trusted(request.client):
            return _forbidden(request)
        return Response(wire.dumps({"nodes": extender.describe()}), media_type=JSON)

    @app.get("/debug/quotas")
    async def quotas(request: Request) -> Response:
        if not trusted(request.client):
            return _forbidden(request)
        return Response(wire.dumps({"quotas": extender.describe_quotas()}), media_type=JSON)

    @app.get("/debug/nodes/{name}")
    async def node(request: Request, name: str) -> Response:
        if not trusted(request.client):
            return _forbidden(request)
        found = extender.describe(name)
        if not found:
            return Response(wire.dumps({"error": f"node {name} is unknown to gpuslice"}), 404, media_type=JSON)
        return Response(wire.dumps(found[0]), media_type=JSON)

    @app.get("/debug/defrag")
    async def defrag(request: Request) -> Response:
        # Plan only: nothing is evicted (gpuslice defrag --apply does that). Planning runs off the
        # event loop and outside the cache's lock, on a snapshot of it.
        if not trusted(request.client):
            return _forbidden(request)
        if not (extender.synced and extender.backend.ready()):  # a plan on half a cluster would be a guess
            return Response(wire.dumps({"error": NOT_READY}), 503, media_type=JSON)
        return Response(wire.dumps(await run_in_threadpool(defrag_plan, extender)), media_type=JSON)

    return Verbs(app, verbs)


def defrag_plan(extender: Extender) -> dict[str, Any]:
    """``/debug/defrag``: the plan for the cluster as the service sees it, with its settings."""
    settings = extender.config.defrag
    options = settings.options()
    with extender.cache.lock:  # what the serving policy learned is copied whole, not half-way through a call
        serving = over_a_copy(extender.policy)
    found, inputs = plan_cluster(extender.cache, extender.config, settings.namespaces, options, serving)
    return plan_json(found, inputs, settings.namespaces, options)


_CONTROL = str.maketrans({i: " " for i in (*range(32), 127)})


def _header(text: str) -> str:
    # A header value may hold no control character: h11 would drop the connection unanswered.
    return text.encode("ascii", "replace").decode()[:500].translate(_CONTROL)
