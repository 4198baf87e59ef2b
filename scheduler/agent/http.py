"""The agent's small HTTP endpoint: ``/metrics`` for Prometheus, ``/healthz`` and ``/readyz`` for
the kubelet's probes (``metrics.address`` / ``metrics.port``; port 0 serves nothing).

``/healthz`` fails once no round has finished for :data:`STALL_ROUNDS` rounds (the agent is
stuck: the kubelet restarts it); ``/readyz`` fails until the agent has started (read its Node,
its pods and the hardware, and published). The standard library's threading server is
enough for a scrape every few seconds and two probes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

STALL_ROUNDS = 10
MIN_STALL_S = 30.0


class Health:
    """When the last round finished, and whether start-up is done (set by the agent's loop)."""

    def __init__(self, poll_s: float, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._limit = max(MIN_STALL_S, STALL_ROUNDS * poll_s)
        self.started = False
        self.last_round = clock()

    def round_done(self) -> None:
        self.last_round = self._clock()

    def healthy(self) -> bool:
        return self._clock() - self.last_round <= self._limit


class MetricsServer:
    def __init__(self, registry: CollectorRegistry, health: Health, address: str, port: int) -> None:
        served, checks = registry, health

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._reply(200, generate_latest(served), CONTENT_TYPE_LATEST)
                elif path == "/healthz":
                    ok = checks.healthy()
                    self._reply(200 if ok else 503, b"ok" if ok else b"no round finished lately")
                elif path == "/readyz":
                    ok = checks.started
                    self._reply(200 if ok else 503, b"ready" if ok else b"starting")
                else:
                    self._reply(404, b"not found: /metrics, /healthz, /readyz")

            def _reply(self, code: int, body: bytes, kind: str = "text/plain; charset=utf-8") -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # a scrape every few seconds is not news

        self._server = ThreadingHTTPServer((address, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="agent-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
