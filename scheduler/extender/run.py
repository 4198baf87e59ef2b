"""Running the service (``gpuslice serve``) once its configuration and backend are built,
and asking it (``gpuslice inspect``). Plain functions: the composition root
(``scheduler.cli``) parses the command line, builds the backend and calls them.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from scheduler import logs
from scheduler.backend import Backend

from .app import Mount
from .config import ServeConfig
from .debug import holder_text, stray_lines
from .server import Server
from .service import Extender


@dataclass(frozen=True, slots=True)
class DemoPlan:
    """``--demo``: the pending pods to schedule through the running service, over ``nodes``."""

    pods: Sequence[Mapping[str, Any]]
    nodes: Sequence[str]
    exit_after: bool


def start(config: ServeConfig, backend: Backend) -> Extender:
    """The extender over ``backend``, with the first full sync done.

    Raises what the backend raises when it cannot sync (a :class:`GpusliceError` or an
    ``OSError``): the caller says why the cluster is not reachable.
    """
    extender = Extender(config, backend)
    extender.start()
    return extender


def serve(extender: Extender, source: str, mounts: Sequence[Mount] = (), demo: DemoPlan | None = None) -> int:
    """Serve HTTP until stopped (or, with ``demo.exit_after``, once the demo is done); the exit status.

    ``source`` says where the cluster state comes from, for the first log line.
    """
    server = Server(extender, mounts)
    threading.Thread(target=_freeze_when_synced, args=(extender.backend,), name="gc-freeze", daemon=True).start()
    threading.Thread(target=_announce, args=(server, source, demo), daemon=True).start()
    try:
        server.run()
    finally:
        extender.stop()
    return 1 if demo is not None and demo.exit_after and server.demo_failed else 0


# The cyclic collector's thresholds while serving (CPython's default: 700, 10, 10).
GC_THRESHOLDS = (10_000, 10, 10)


def _freeze_when_synced(backend: Backend) -> None:
    """Once the first full sync is in, hide what it built from the garbage collector, and
    let it run less often.

    The cluster cache holds a few hundred objects per node (states, devices, memos): at
    5,000 nodes each full collection walked them all and cost tens of milliseconds, taken
    from whichever call was running. Frozen objects are never walked; what changes later
    (a node's new state after a bind) is collected as usual.

    The score tables built after the sync (a memo per node and kind of pod) still make
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


def _announce(server: Server, source: str, demo: DemoPlan | None) -> None:
    """Once listening: say where and how to try it; then play the demo if asked."""
    while not server.started:
        time.sleep(0.02)
    url = server.url
    config = server.extender.config
    logs.get("serve").info(
        "listening",
        extra={
            "url": url,
            "verbs": [f"{config.url_prefix}/{v}" for v in ("filter", "prioritize", "bind", "preempt")],
            "policy": config.policy.name,
            "backend": source,
            "try": f"curl {url}/debug/nodes  |  gpuslice inspect --url {url}",
        },
    )
    if demo is not None:
        _run_demo(server, demo)


def _run_demo(server: Server, demo: DemoPlan) -> None:
    from .client import ExtenderClient
    from .demo import play, show

    config = server.extender.config
    client = ExtenderClient(server.url, config.url_prefix)
    try:
        outcomes = play(client, demo.pods, demo.nodes, config.prefix)
        show(outcomes, Console(file=sys.stdout))
        print(f"inspect the result:  gpuslice inspect --url {server.url}", flush=True)
    except Exception as exc:  # the demo must not take the service down
        print(f"demo failed: {exc}", file=sys.stderr)
        server.demo_failed = True
    finally:
        client.close()
        if demo.exit_after:
            server.stop_soon()


def inspect(url: str, node: str | None = None, json_output: bool = False) -> None:
    """Print each node's GPUs, their shares and free capacity, as the service at ``url`` sees
    them; :class:`~scheduler.extender.client.ServiceError` if it cannot be asked."""
    from .client import ExtenderClient

    client = ExtenderClient(url)
    try:
        data = client.get(f"/debug/nodes/{node}") if node else client.get("/debug/nodes")
    finally:
        client.close()
    nodes = [data] if node else data["nodes"]
    if json_output:
        import json

        print(json.dumps(nodes if not node else data, indent=2))
        return
    render(nodes, Console(file=sys.stdout))


def render(nodes: list[dict[str, Any]], console: Console) -> None:
    table = Table(title="gpuslice: GPUs, shares and free capacity")
    for column in (
        "node",
        "GPU",
        "model",
        "mode",
        "memory allocated/total MiB",
        "free MiB",
        "compute allocated/free %",
        "detail",
        "pods",
    ):
        table.add_column(column, overflow="fold")
    for n in nodes:
        if not n.get("usable"):
            table.add_row(n["name"], "-", "-", "-", "-", "-", "-", f"[red]unusable: {n.get('problem')}[/red]", "")
            continue
        holders: dict[int, list[str]] = {}
        for pod in n.get("pods", []):
            for share in pod["shares"]:
                holders.setdefault(share["index"], []).append(holder_text(pod, share))
        devices = n.get("devices", [])
        if not devices:
            cpu = n.get("cpuMilli", {})
            table.add_row(
                n["name"],
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
                f"no GPUs; cpu {cpu.get('allocated', 0)}/{cpu.get('allocatable', 0)}m",
                "",
            )
        for i, d in enumerate(devices):
            table.add_row(
                n["name"] if i == 0 else "",
                str(d["index"]),
                d["model"],
                d["mode"],
                f"{d['memoryAllocatedMiB']}/{d['memoryMiB']}",
                str(d["memoryFreeMiB"]),
                f"{d['computeAllocatedMilli'] / 10:g}/{d['computeFreeMilli'] / 10:g}",
                d["detail"],
                ", ".join(holders.get(d["index"], [])),
            )
        for line in stray_lines(n):
            table.add_row("", "", "", "", "", "", "", f"[yellow]{escape(line)}[/yellow]", "")
        for pod, reason in (n.get("recordErrors") or {}).items():
            table.add_row("", "", "", "", "", "", "", f"[red]record of {pod} rejected: {reason}[/red]", "")
    console.print(table)
