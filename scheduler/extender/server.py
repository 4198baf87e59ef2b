"""Running the app under uvicorn, in the foreground (``gpuslice serve``) or in a thread (tests).

The socket is bound and listening before uvicorn starts (:meth:`Server.listen`): a port
in use is a clear error at once, and a probe that connects while the service starts
waits in the backlog instead of being refused.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Sequence

import uvicorn

from scheduler.core.errors import GpusliceError

from .app import Mount, create_app
from .service import Extender

BACKLOG = 2048  # uvicorn's default


class ListenError(GpusliceError):
    """The address or port cannot be listened on; the message names both."""


def listen_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0: any free port) and listening."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (OSError, UnicodeError) as exc:
        raise ListenError(f"--host {host!r}: cannot listen there: {exc}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise ListenError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}; accepted: a free port (--port), 0 for any"
        ) from None
    sock.set_inheritable(True)
    return sock


class Server:
    def __init__(self, extender: Extender, mounts: Sequence[Mount] = ()) -> None:
        self.extender = extender
        config = extender.config
        self.app = create_app(extender, mounts)
        self._uvicorn = uvicorn.Server(
            uvicorn.Config(
                self.app,
                host=config.host,
                port=config.port,
                ssl_certfile=str(config.tls_cert) if config.tls_cert else None,
                ssl_keyfile=str(config.tls_key) if config.tls_key else None,
                log_config=None,
                access_log=False,
                lifespan="off",
                timeout_keep_alive=30,
                # The peer address decides who may call the verbs: never take it from a header.
                proxy_headers=False,
            )
        )
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self.demo_failed = False
        self.sync_error: BaseException | None = None  # why the backend's first sync failed

    def listen(self) -> Server:
        """Bind and listen now, if not done yet; :class:`ListenError` if the port cannot be had."""
        if self._socket is None:
            config = self.extender.config
            self._socket = listen_socket(config.host, config.port)
        return self

    @property
    def started(self) -> bool:
        return self._uvicorn.started

    @property
    def port(self) -> int:
        """The bound port (the configured one, or the one chosen for port 0)."""
        if self._socket is not None and self._socket.fileno() >= 0:
            return int(self._socket.getsockname()[1])
        for server in self._uvicorn.servers:
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        return self.extender.config.port

    @property
    def url(self) -> str:
        config = self.extender.config
        host = "127.0.0.1" if config.host in ("0.0.0.0", "::", "") else config.host
        return f"{config.scheme}://{host}:{self.port}"

    def run(self) -> None:
        """Serve in this thread until :meth:`stop` (or a signal)."""
        self.listen()
        assert self._socket is not None
        try:
            self._uvicorn.run(sockets=[self._socket])
        finally:
            self._socket.close()

    def start_in_thread(self, timeout: float = 10.0) -> Server:
        self.listen()
        self._thread = threading.Thread(target=self.run, name="gpuslice-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._uvicorn.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the HTTP server did not start on {self.extender.config.host}")
            time.sleep(0.01)
        return self

    def stop_soon(self) -> None:
        """Ask the server to finish (from any thread); :meth:`run` then returns."""
        self._uvicorn.should_exit = True

    def stop(self) -> None:
        self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
