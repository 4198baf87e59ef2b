"""``gpuslice agent``: the node agent face, with the cluster side it needs built here."""

from __future__ import annotations

from typing import Annotated

import typer

from scheduler.core.errors import UsageError

from . import _options as opt
from ._app import command


@command("agent")
def agent(
    config: Annotated[str, typer.Option(help="The agent's YAML configuration (docs/node-agent.md).")] = "",
    node: Annotated[str, typer.Option(help="This node's name (default: the config's node, else $NODE_NAME).")] = "",
    fake_gpus: Annotated[str, typer.Option(help="In-memory GPUs from a YAML file, or 'example'.")] = "",
    kubeconfig: Annotated[str, typer.Option(help="A kubeconfig (default: the in-cluster service account).")] = "",
    api_url: Annotated[str, typer.Option(help="An API server URL, reached without credentials.")] = "",
    dry_run: Annotated[bool, typer.Option(help="Print the inventory the GPUs give, and exit.")] = False,
    demo: Annotated[
        bool,
        typer.Option(
            help="Without a cluster: run on the example's fake GPUs against a local stand-in for the API "
            "server and kubelet, show the inventory, one admission and /metrics, and exit."
        ),
    ] = False,
) -> None:
    """The node agent: publish this node's GPUs, make MIG instances, hand each pod its share."""
    if node:
        opt.node_name("--node", node)
    if demo:
        if kubeconfig or api_url or dry_run:
            raise UsageError("--demo needs no cluster: drop --kubeconfig, --api-url and --dry-run")
        from scheduler.agent.demo import run_demo_agent

        run_demo_agent(config or None, node, fake_gpus or "example")
        return
    from scheduler.agent.main import run_agent
    from scheduler.kube.nodeapi import NodeApi

    run_agent(
        config or None,
        node,
        fake_gpus or None,
        dry_run,
        lambda settings: NodeApi.connect(settings.node, kubeconfig or None, api_url or None),
    )
