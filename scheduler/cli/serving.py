"""``gpuslice serve``, ``gpuslice inspect`` and ``gpuslice demo``: the extender face, its backend
(a Kubernetes cluster or a cluster file) and the admission webhook, wired together."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from scheduler.core.errors import GpusliceError, UsageError
from scheduler.extender.defaults import DEFAULT_PORT, DEFAULT_URL

from ._app import command

if TYPE_CHECKING:
    from scheduler.backend import Backend
    from scheduler.extender.app import Mount
    from scheduler.extender.config import ServeConfig
    from scheduler.filebackend import FileBackend


class NoCluster(GpusliceError):
    """``gpuslice serve`` found no Kubernetes cluster to serve."""

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
    from scheduler import logs
    from scheduler.extender import run
    from scheduler.extender.config import load_config

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
    config = load_config(config_file, os.environ, flags)
    logs.configure(config.log_level)
    plan: run.DemoPlan | None = None
    if cluster_file is not None:
        from scheduler.filebackend import FileBackend, resolve_cluster_file

        file_backend = FileBackend(resolve_cluster_file(cluster_file), config.prefix)
        if demo or demo_exit:
            plan = run.DemoPlan(pending_pods(file_backend), sorted(file_backend.nodes()), demo_exit)
        extender = run.start(config, file_backend)
        source = f"cluster file {file_backend.path}"
    elif demo or demo_exit:
        raise UsageError("--demo needs --cluster-file (try --cluster-file example)")
    else:
        try:
            extender = run.start(config, kube_backend(config, kubeconfig))
        except (GpusliceError, OSError) as exc:
            raise NoCluster(str(exc)) from exc
        source = "kubernetes"
    status = run.serve(extender, source, service_mounts(config), plan)
    if status:
        raise typer.Exit(status)


@command("inspect")
def inspect(
    node: Annotated[str | None, typer.Argument(help="Only this node.")] = None,
    url: Annotated[str, typer.Option(help="Where gpuslice serve listens.")] = DEFAULT_URL,
    json_output: Annotated[bool, typer.Option("--json", help="Print the raw JSON.")] = False,
) -> None:
    """Show each node's GPUs, their shares and free capacity, as the running service sees them."""
    from scheduler.extender import run

    run.inspect(url, node, json_output)


@command("demo")
def demo() -> None:
    """Pack a few pods onto a small mixed cluster and print where each one went."""
    from scheduler.demo import run_demo

    run_demo()


__all__ = ["demo", "inspect", "kube_backend", "pending_pods", "serve", "service_mounts"]
