"""``gpuslice serve``, ``gpuslice inspect`` and ``gpuslice demo``: the extender face, its backend
(a Kubernetes cluster or a cluster file) and the admission webhook, wired together.

The service's settings are validated by its configuration (:mod:`scheduler.extender.config`),
whatever their source: numbers arrive here as text and are handed over as they came, so that
a bad ``--port`` and a bad ``GPUSLICE_PORT`` get the same message.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from scheduler.core.errors import GpusliceError, UsageError
from scheduler.extender.defaults import DEFAULT_PORT, DEFAULT_URL

from . import _options as opt
from ._app import command

if TYPE_CHECKING:
    from scheduler.backend import Backend
    from scheduler.extender.app import Mount
    from scheduler.extender.config import ServeConfig
    from scheduler.extender.run import DemoPlan
    from scheduler.filebackend import FileBackend


class NoCluster(GpusliceError):
    """``gpuslice serve`` found no Kubernetes cluster to serve."""

    exit_code = 1

    def __init__(self, reason: str) -> None:
        super().__init__(
            f"no Kubernetes cluster reachable ({reason}); to try gpuslice without one, serve the embedded "
            "example: gpuslice serve --cluster-file example --demo (or your own: kubectl get nodes,pods -A "
            "-o yaml > cluster.yaml, then gpuslice serve --cluster-file cluster.yaml)"
        )


def service_mounts(config: ServeConfig) -> list[Mount]:
    """What the service's HTTP app serves besides the extender: the admission webhook."""
    from scheduler.webhook import WebhookConfig
    from scheduler.webhook.routes import mount

    return [functools.partial(mount, config=WebhookConfig.from_env(os.environ, prefix=config.prefix))]


def kube_backend(config: ServeConfig, kubeconfig: str | None) -> Backend:
    """The Kubernetes backend: in-cluster, then ``kubeconfig`` or ``~/.kube/config``."""
    from scheduler.kube import KubeBackend

    return KubeBackend.from_config(prefix=config.prefix, kubeconfig=kubeconfig, **config.kube.options())


def pending_pods(backend: FileBackend) -> list[Mapping[str, Any]]:
    """The cluster file's pods that wait for a node, in file order."""
    return [
        obj
        for obj in backend.pods().values()
        if not (obj.get("spec") or {}).get("nodeName") and (obj.get("status") or {}).get("phase") in (None, "Pending")
    ]


def run_service(
    config: ServeConfig, cluster_file: str | None, kubeconfig: str | None, demo: bool, demo_exit: bool
) -> int:
    """Build the backend the options name and serve it; the exit status."""
    from scheduler.extender import run

    plan: DemoPlan | None = None
    if cluster_file is not None:
        from scheduler.filebackend import FileBackend, resolve_cluster_file

        file_backend = FileBackend(resolve_cluster_file(cluster_file), config.prefix)
        if demo or demo_exit:
            plan = run.DemoPlan(pending_pods(file_backend), sorted(file_backend.nodes()), demo_exit)
        source = f"cluster file {file_backend.path}"
        return run.Service(config, file_backend, source, service_mounts(config), plan).run()
    try:
        backend = kube_backend(config, kubeconfig)
    except (GpusliceError, OSError) as exc:
        raise NoCluster(str(exc)) from exc
    try:
        return run.Service(config, backend, "kubernetes", service_mounts(config)).run()
    except run.SyncError as exc:
        raise NoCluster(str(exc.__cause__)) from exc


@command("serve")
def serve(
    cluster_file: Annotated[
        str | None,
        typer.Option(
            help="Serve a Kubernetes v1 List of nodes and pods (YAML or JSON) instead of a cluster; "
            "'example' for the embedded example cluster."
        ),
    ] = None,
    config_file: Annotated[Path | None, typer.Option("--config", help="YAML file of settings.")] = None,
    policy: Annotated[str | None, typer.Option(help="Placement policy (see README: Policies).")] = None,
    prefix: Annotated[str | None, typer.Option(help="Annotation prefix (default gpuslice.io/).")] = None,
    url_prefix: Annotated[str | None, typer.Option(help="Path before /filter, /prioritize, /bind, /preempt.")] = None,
    host: Annotated[str | None, typer.Option(help="Address to listen on (default 127.0.0.1).")] = None,
    port: Annotated[
        str | None, typer.Option(metavar="PORT", help=f"Port to listen on (default {DEFAULT_PORT}; 0: any free one).")
    ] = None,
    tls_cert: Annotated[Path | None, typer.Option(help="TLS certificate (PEM); with --tls-key.")] = None,
    tls_key: Annotated[Path | None, typer.Option(help="TLS private key (PEM).")] = None,
    max_body_bytes: Annotated[str | None, typer.Option(metavar="BYTES", help="Largest request body accepted.")] = None,
    mps_compute_oversub_pct: Annotated[
        str | None, typer.Option(metavar="PCT", help="Default MPS compute oversubscription, percent (100 = none).")
    ] = None,
    ts_memory_oversub_pct: Annotated[
        str | None,
        typer.Option(metavar="PCT", help="Default time-slicing memory oversubscription, percent (100 = none)."),
    ] = None,
    log_level: Annotated[str | None, typer.Option(help="debug, info, warning or error.")] = None,
    log_format: Annotated[
        str | None, typer.Option(help="text or json (default: text when stderr is a terminal, else json).")
    ] = None,
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
    from scheduler import logs
    from scheduler.extender.config import load_config

    if (demo or demo_exit) and cluster_file is None:
        raise UsageError("--demo needs --cluster-file (try --cluster-file example)")
    if kubeconfig is not None:
        if cluster_file is not None:
            raise UsageError("--kubeconfig with --cluster-file: a cluster file needs no cluster; give one of them")
        opt.readable_file("--kubeconfig", Path(kubeconfig))
    if config_file is not None:
        opt.readable_file("--config", config_file)
    if cluster_file is not None:
        opt.cluster_file("--cluster-file", Path(cluster_file))
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
        "log_format": log_format,
    }
    config = load_config(config_file, os.environ, flags)
    logs.configure(config.log_level, fmt=config.log_format)
    status = run_service(config, cluster_file, kubeconfig, demo, demo_exit)
    if status:
        raise typer.Exit(status)


@command("inspect")
def inspect(
    node: Annotated[str | None, typer.Argument(help="Only this node.")] = None,
    url: Annotated[str, typer.Option(help="Where gpuslice serve listens.")] = DEFAULT_URL,
    output: Annotated[
        str, typer.Option("--output", "-o", help="table (default), wide, json or yaml.", show_default=False)
    ] = "table",
    quotas: Annotated[
        bool, typer.Option("--quotas", help="Per namespace GPUQuota: used/allowed memory, compute, whole GPUs.")
    ] = False,
) -> None:
    """Show each node's GPUs, their shares and free capacity, as the running service sees them
    (with --quotas, each namespace's GPU quotas and what it holds of them)."""
    from scheduler.extender.inspection import OUTPUTS
    from scheduler.extender.inspection import inspect as show

    print(show(opt.service_url("--url", url), node, opt.choice("--output", output, OUTPUTS), quotas))


@command("demo")
def demo(
    policy: Annotated[str | None, typer.Option(help="Placement policy (default: the service's default).")] = None,
) -> None:
    """Serve the embedded example cluster, schedule its pending pods through the service over
    HTTP, print where each one went, and exit (gpuslice serve --cluster-file example --demo-exit)."""
    from scheduler import logs
    from scheduler.extender.config import load_config

    config = load_config(None, {}, {"policy": policy, "port": 0, "log_level": "warning"})
    logs.configure(config.log_level, fmt=config.log_format)
    status = run_service(config, "example", None, False, True)
    if status:
        raise typer.Exit(status)


__all__ = ["demo", "inspect", "kube_backend", "pending_pods", "run_service", "serve", "service_mounts"]
