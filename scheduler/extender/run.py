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

from . import collector
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
        stopping = threading.Event()
        sync, collecting, announce = (
            threading.Thread(target=target, args=args, name=f"gpuslice-{target.__name__[1:]}", daemon=True)
            for target, args in (
                (_sync, (server, self.source)),
                (_freeze_when_synced, (backend, stopping)),
                (_announce, (server, self.demo)),
            )
        )
        reporting = threading.Thread(
            target=_report_quotas, args=(server, stopping), name="gpuslice-quota-status", daemon=True
        )
        for thread in (sync, collecting, announce, reporting):
            thread.start()
        try:
            server.run()
        finally:
            stopping.set()
            server.extender.stop()
            collecting.join(timeout=10)  # a sweep under way ends first
            collector.release()
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


def _freeze_when_synced(backend: Backend, stopping: threading.Event) -> None:
    """Once the first full sync is in, run the collector as :mod:`.collector` says: settle, then
    sweep whenever the frozen objects have grown by a quarter, until ``stopping``. During the
    sync it is paused (see _sync)."""
    while not backend.ready():
        if stopping.wait(0.05):
            return
    collector.settle()
    collector.sweep_when_grown(stopping)


QUOTA_STATUS_S = 5.0  # how often the GPUQuotas' status is brought up to date


def _report_quotas(server: Server, stopping: threading.Event) -> None:
    """Once synced, keep every GPUQuota's status current (written only when it changed)."""
    extender = server.extender
    while not stopping.wait(QUOTA_STATUS_S):
        if extender.synced and extender.backend.ready():
            try:
                extender.report_quotas()
            except Exception:  # the loop must live on; the next round tries again
                log.exception("GPUQuota status not written")


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
    from .demo import play, runnable_name, show

    config = server.extender.config
    client = ExtenderClient(server.url, config.url_prefix)
    try:
        outcomes = play(client, demo.pods, demo.nodes)
        print(show(outcomes, config.policy.name), flush=True)
        if not demo.exit_after:
            print(f"\ninspect the result:  {runnable_name()} inspect --url {server.url}", flush=True)
    except Exception as exc:  # the demo must not take the service down
        print(f"demo failed: {exc}", file=sys.stderr)
        server.demo_failed = True
    finally:
        client.close()
        if demo.exit_after:
            server.stop_soon()
