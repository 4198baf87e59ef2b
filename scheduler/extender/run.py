"""Running the service (``gpuslice serve``) once its configuration and backend are built:
the composition root (``scheduler.cli``) parses the command line, builds the backend and
runs a :class:`Service`.

The port opens first and the backend syncs behind it: ``/readyz`` answers 503 and the
verbs answer "not ready" until the first full list of nodes and pods is in, then 200. A
first sync that fails stops the service with the reason (:class:`SyncError`).
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy.ma  # noqa: F401  numpy imports it on the first np.unique: 40 ms of the first pod's filter

from scheduler import logs
from scheduler.backend import Backend
from scheduler.core.errors import GpusliceError

from .app import Mount
from .config import ServeConfig
from .server import Server
from .service import Extender

log = logs.get("serve")


class SyncError(GpusliceError):
    """The backend's first full sync failed; raised from the backend's own error."""

    exit_code = 1


@dataclass(frozen=True, slots=True)
class DemoPlan:
    """``--demo``: the pending pods to schedule through the running service, over ``nodes``."""

    pods: Sequence[Mapping[str, Any]]
    nodes: Sequence[str]
    exit_after: bool


class Service:
    """The service: its port is listening from construction on (a port in use is a
    :class:`~scheduler.extender.server.ListenError` here), and the backend syncs once
    :meth:`run` starts. ``source`` says where the cluster state comes from, for the log."""

    def __init__(
        self,
        config: ServeConfig,
        backend: Backend,
        source: str,
        mounts: Sequence[Mount] = (),
        demo: DemoPlan | None = None,
    ) -> None:
        self.server = Server(Extender(config, backend), mounts).listen()
        self.source = source
        self.demo = demo

    @property
    def url(self) -> str:
        return self.server.url

    def run(self) -> int:
        """Sync behind the open port and serve HTTP until :meth:`stop` (or a signal; or, with
        ``demo.exit_after``, the demo's end); the exit status. :class:`SyncError` if the first
        sync fails."""
        server, backend = self.server, self.server.extender.backend
        for target, args in (
            (_sync, (server, self.source)),
            (_freeze_when_synced, (backend,)),
            (_announce, (server, self.demo)),
        ):
            threading.Thread(target=target, args=args, name=f"gpuslice-{target.__name__[1:]}", daemon=True).start()
        try:
            server.run()
        finally:
            server.extender.stop()
        if server.sync_error is not None:
            raise SyncError(f"first sync with {self.source} failed: {server.sync_error}") from server.sync_error
        demo = self.demo
        return 1 if demo is not None and demo.exit_after and server.demo_failed else 0

    def stop(self) -> None:
        """Ask :meth:`run` to return (from any thread)."""
        self.server.stop_soon()


def _sync(server: Server, source: str) -> None:
    """The backend's first full sync; on failure, stop the server with the reason."""
    extender = server.extender
    # The first sync builds the whole cache, and the collector, run as it grew, walked all of
    # it again every time it had grown by a quarter: at 5,000 nodes and 42,500 pods, eleven
    # full collections and 3.7 s of a start of about 10 s. It is paused until the sync is in;
    # _freeze_when_synced then collects once and starts it again (as does a failed sync).
    gc.disable()
    try:
        extender.start()
    except Exception as exc:  # whatever it is, the process must stop and say why
        gc.enable()
        log.error("first sync failed", extra={"backend": source, "reason": str(exc)})
        server.sync_error = exc
        server.stop_soon()
        return
    unusable = extender.cache.unusable()
    log.info(
        "ready",
        extra={"backend": source, "nodes": len(extender.cache.nodes), "invalid": sorted(unusable) or None},
    )


# The cyclic collector's thresholds while serving (CPython's default: 700, 10, 10).
GC_THRESHOLDS = (10_000, 10, 10)


def _freeze_when_synced(backend: Backend) -> None:
    """Once the first full sync is in, hide what it built from the garbage collector, and
    let it run less often.

    The cluster cache holds a few hundred objects per node (states, devices, records): at
    5,000 nodes each full collection walked them all and cost tens of milliseconds, taken
    from whichever call was running. Frozen objects are never walked; what changes later
    (a node's new state after a bind) is collected as usual.

    The board's tables built after the sync (scores per node state and kind of pod) still make
    hundreds of thousands of long-lived objects: at CPython's default thresholds a full
    collection came every hundred pods or so and took about 0.1 s, and collections took
    a fifth of fgd's CPU at 5,000 nodes. With the first threshold at 10,000 allocations
    the young generation is collected a tenth as often (a few ms each time), and none of
    the 600 pods of the benchmark met a full collection.
    """
    while not backend.ready():
        time.sleep(0.05)
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    gc.enable()  # paused by _sync during the first sync


def _announce(server: Server, demo: DemoPlan | None) -> None:
    """Once listening: say where and how to try it; once synced, play the demo if asked."""
    while not server.started:
        time.sleep(0.02)
    url = server.url
    config = server.extender.config
    log.info(
        "listening",
        extra={
            "url": url,
            "verbs": [f"{config.url_prefix}/{v}" for v in ("filter", "prioritize", "bind", "preempt")],
            "policy": config.policy.name,
            "try": f"curl {url}/debug/nodes  |  gpuslice inspect --url {url}",
        },
    )
    if demo is None:
        return
    backend = server.extender.backend
    while not backend.ready():
        if server.sync_error is not None:
            return
        time.sleep(0.02)
    _run_demo(server, demo)


def _run_demo(server: Server, demo: DemoPlan) -> None:
    from .client import ExtenderClient
    from .demo import play, show

    config = server.extender.config
    client = ExtenderClient(server.url, config.url_prefix)
    try:
        outcomes = play(client, demo.pods, demo.nodes)
        print(show(outcomes, config.policy.name), flush=True)
        if not demo.exit_after:
            print(f"\ninspect the result:  gpuslice inspect --url {server.url}", flush=True)
    except Exception as exc:  # the demo must not take the service down
        print(f"demo failed: {exc}", file=sys.stderr)
        server.demo_failed = True
    finally:
        client.close()
        if demo.exit_after:
            server.stop_soon()
