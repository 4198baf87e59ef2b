"""Running the app under uvicorn, in the foreground (``gpuslice serve``) or in a thread (tests)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import uvicorn

from .app import Mount, create_app
from .service import Extender


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
        self.demo_failed = False

    @property
    def started(self) -> bool:
        return self._uvicorn.started

    @property
    def port(self) -> int:
        """The bound port (the configured one, or the one chosen for port 0)."""
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
        self._uvicorn.run()

    def start_in_thread(self, timeout: float = 10.0) -> Server:
        self._thread = threading.Thread(target=self._uvicorn.run, name="gpuslice-http", daemon=True)
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
