"""``gpuslice serve`` and ``gpuslice inspect``."""

from __future__ import annotations

import gc
import importlib
import importlib.resources
import os
import sys
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from scheduler.backend import Backend
from scheduler.cli import app
from scheduler.core.errors import ConfigError, GpusliceError

from . import logs
from .config import DEFAULT_PORT, ServeConfig, load_config
from .filebackend import FileBackend
from .server import Server
from .service import Extender

EXAMPLE = "example"
NO_CLUSTER = """gpuslice serve: no Kubernetes cluster reachable ({reason}).
To try gpuslice without a cluster, serve the embedded example cluster:
    gpuslice serve --cluster-file example --demo
or your own nodes and pods:  kubectl get nodes,pods -A -o yaml > cluster.yaml
                             gpuslice serve --cluster-file cluster.yaml"""


def example_path() -> Path:
    """The example cluster shipped with the package (usable after ``pip install``)."""
    return Path(str(importlib.resources.files("scheduler") / "examples" / "cluster.yaml"))


def resolve_cluster_file(value: str) -> Path:
    path = Path(value)
    if value == EXAMPLE and not path.exists():
        return example_path()
    return path


def _fail(message: str, code: int = 2) -> typer.Exit:
    print(message, file=sys.stderr)
    return typer.Exit(code)


def kube_backend(config: ServeConfig, kubeconfig: str | None) -> Backend:
    """The Kubernetes backend, imported by name so the extender never imports ``kubernetes``."""
    module = importlib.import_module("scheduler.kube")
    factory: Any = getattr(module, "KubeBackend", None)
    if factory is None:
        raise ModuleNotFoundError("scheduler.kube has no KubeBackend", name="scheduler.kube")
    make = getattr(factory, "from_config", None)
    options = config.kube.options()
    backend: Backend = (
        make(prefix=config.prefix, kubeconfig=kubeconfig, **options)
        if make
        else factory(prefix=config.prefix, **options)
    )
    return backend


@app.command()
def serve(
    cluster_file: Annotated[
        str | None,
        typer.Option(
            help="Serve a Kubernetes v1 List of nodes and pods (YAML or JSON) instead of a cluster; "
            "'example' for the embedded example cluster."
        ),
    ] = None,
    config_file: Annotated[Path | None, typer.Option("--config", help="YAML file of settings.")] = None,
    policy: Annotated[str | None, typer.Option(help="Placement policy: binpack, spread, bestfit, fgd, random.")] = None,
    prefix: Annotated[str | None, typer.Option(help="Annotation prefix (default gpuslice.io/).")] = None,
    url_prefix: Annotated[str | None, typer.Option(help="Path before /filter, /prioritize, /bind.")] = None,
    host: Annotated[str | None, typer.Option(help="Address to listen on (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help=f"Port to listen on (default {DEFAULT_PORT}).")] = None,
    tls_cert: Annotated[Path | None, typer.Option(help="TLS certificate (PEM); with --tls-key.")] = None,
    tls_key: Annotated[Path | None, typer.Option(help="TLS private key (PEM).")] = None,
    max_body_bytes: Annotated[int | None, typer.Option(help="Largest request body accepted.")] = None,
    mps_compute_oversub_pct: Annotated[
        int | None, typer.Option(help="Default MPS compute oversubscription, percent (100 = none).")
    ] = None,
    ts_memory_oversub_pct: Annotated[
        int | None, typer.Option(help="Default time-slicing memory oversubscription, percent (100 = none).")
    ] = None,
    log_level: Annotated[str | None, typer.Option(help="debug, info, warning or error.")] = None,
    kubeconfig: Annotated[str | None, typer.Option(help="kubeconfig file (default: in-cluster, then ~/.kube).")] = None,
    demo: Annotated[
        bool,
        typer.Option(
            help="Schedule the cluster file's pending pods through the service, print where they went, keep serving."
        ),
    ] = False,
    demo_exit: Annotated[bool, typer.Option(help="Like --demo, then exit.")] = False,
) -> None:
    """Run the kube-scheduler extender (filter, prioritize, bind over HTTP)."""
    flags = {
        "policy": policy,
        "prefix": prefix,
        "url_prefix": url_prefix,
        "host": host,
        "port": port,
        "tls_cert": tls_cert,
        "tls_key": tls_key,
        "max_body_bytes": max_body_bytes,
        "mps_compute_oversub_pct": mps_compute_oversub_pct,
        "ts_memory_oversub_pct": ts_memory_oversub_pct,
        "log_level": log_level,
    }
    try:
        config = load_config(config_file, os.environ, flags)
    except ConfigError as exc:
        raise _fail(f"gpuslice serve: {exc}") from None
    logs.configure(config.log_level)

    backend: Backend
    file_backend: FileBackend | None = None
    if cluster_file is not None:
        try:
            file_backend = FileBackend(resolve_cluster_file(cluster_file), config.prefix)
        except GpusliceError as exc:
            raise _fail(f"gpuslice serve: {exc}") from None
        backend = file_backend
    elif demo or demo_exit:
        raise _fail("gpuslice serve: --demo needs --cluster-file (try --cluster-file example)")
    else:
        try:
            backend = kube_backend(config, kubeconfig)
        except ModuleNotFoundError as exc:
            if exc.name is None or (not "scheduler.kube".startswith(exc.name) and exc.name != "kubernetes"):
                raise
            raise _fail(NO_CLUSTER.format(reason="the Kubernetes backend is not installed")) from None
        except (GpusliceError, OSError) as exc:
            raise _fail(NO_CLUSTER.format(reason=str(exc))) from None
    try:
        extender = Extender(config, backend)
        extender.start()
    except ConfigError as exc:
        raise _fail(f"gpuslice serve: {exc}") from None
    except (GpusliceError, OSError) as exc:
        if file_backend is not None:
            raise _fail(f"gpuslice serve: {exc}") from None
        raise _fail(NO_CLUSTER.format(reason=str(exc))) from None
    server = Server(extender)
    threading.Thread(target=_freeze_when_synced, args=(backend,), name="gc-freeze", daemon=True).start()
    threading.Thread(
        target=_announce, args=(server, file_backend, config, demo or demo_exit, demo_exit), daemon=True
    ).start()
    try:
        server.run()
    finally:
        extender.stop()
    if demo_exit and server.demo_failed:
        raise typer.Exit(1)


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


def _announce(server: Server, backend: FileBackend | None, config: ServeConfig, demo: bool, exit_after: bool) -> None:
    """Once listening: say where and how to try it; then play the demo if asked."""
    while not server.started:
        time.sleep(0.02)
    url = server.url
    logs.get("serve").info(
        "listening",
        extra={
            "url": url,
            "verbs": [f"{config.url_prefix}/{v}" for v in ("filter", "prioritize", "bind", "preempt")],
            "policy": config.policy.name,
            "backend": f"cluster file {backend.path}" if backend else "kubernetes",
            "try": f"curl {url}/debug/nodes  |  gpuslice inspect --url {url}",
        },
    )
    if demo:
        assert backend is not None
        _run_demo(server, backend, config, exit_after)


def _run_demo(server: Server, backend: FileBackend, config: ServeConfig, exit_after: bool) -> None:
    from .client import ExtenderClient
    from .demo import play, show

    pending = [
        obj
        for obj in backend.pods().values()
        if not (obj.get("spec") or {}).get("nodeName") and (obj.get("status") or {}).get("phase") in (None, "Pending")
    ]
    names = sorted(backend.nodes())
    client = ExtenderClient(server.url, config.url_prefix)
    try:
        outcomes = play(client, pending, names, config.prefix)
        show(outcomes, Console(file=sys.stdout))
        print(f"inspect the result:  gpuslice inspect --url {server.url}", flush=True)
    except Exception as exc:  # the demo must not take the service down
        print(f"demo failed: {exc}", file=sys.stderr)
        server.demo_failed = True
    finally:
        client.close()
        if exit_after:
            server.stop_soon()


@app.command()
def inspect(
    node: Annotated[str | None, typer.Argument(help="Only this node.")] = None,
    url: Annotated[str, typer.Option(help="Where gpuslice serve listens.")] = f"http://127.0.0.1:{DEFAULT_PORT}",
    json_output: Annotated[bool, typer.Option("--json", help="Print the raw JSON.")] = False,
) -> None:
    """Show each node's GPUs, their shares and free capacity, as the running service sees them."""
    from .client import ExtenderClient, ServiceError

    client = ExtenderClient(url)
    try:
        data = client.get(f"/debug/nodes/{node}") if node else client.get("/debug/nodes")
    except ServiceError as exc:
        raise _fail(f"gpuslice inspect: {exc}", 1) from None
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
        "memory used/total MiB",
        "free MiB",
        "compute used/free %",
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
                mark = " (binding)" if pod.get("inFlight") else ""
                holders.setdefault(share["index"], []).append(pod["pod"] + mark)
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
        for pod, reason in (n.get("recordErrors") or {}).items():
            table.add_row("", "", "", "", "", "", "", f"[red]record of {pod} rejected: {reason}[/red]", "")
    console.print(table)
