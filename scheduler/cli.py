"""The ``gpuslice`` command: one Typer app; each face registers its own commands."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="gpuslice",
    help="Share NVIDIA GPUs densely: a kube-scheduler extender, and a simulator for its policies.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """Share NVIDIA GPUs densely: a kube-scheduler extender, and a simulator for its policies."""


@app.command()
def demo() -> None:
    """Pack a few pods onto a small mixed cluster and print where each one went."""
    from scheduler.demo import run_demo

    run_demo()


@app.command()
def agent(
    config: str = typer.Option("", "--config", help="the agent's YAML configuration (docs/node-agent.md)"),
    node: str = typer.Option("", "--node", help="this node's name (default: the config's node, else $NODE_NAME)"),
    fake_gpus: str = typer.Option("", "--fake-gpus", help="in-memory GPUs from a YAML file, or 'example'"),
    kubeconfig: str = typer.Option("", "--kubeconfig", help="a kubeconfig (default: the in-cluster account)"),
    api_url: str = typer.Option("", "--api-url", help="an API server URL, reached without credentials"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the inventory the GPUs give and exit"),
) -> None:
    """The node agent: publish this node's GPUs, make MIG instances, hand each pod its share."""
    from scheduler.agent.main import run_agent
    from scheduler.kube.nodeapi import NodeApi

    status = run_agent(
        config or None,
        node,
        fake_gpus or None,
        dry_run,
        lambda settings: NodeApi.connect(settings.node, kubeconfig or None, api_url or None),
    )
    raise typer.Exit(status)


def _register() -> None:
    """Import the modules that add commands (``serve``, ``inspect``, ``simulate``, ``bound``).

    Imported by name at run time: those modules import this one for ``app``, and a static
    import here would tie the simulator to the service in the import contracts.
    """
    import importlib

    for module in ("scheduler.extender.commands", "scheduler.sim.commands"):
        importlib.import_module(module)


def main() -> None:
    _register()
    app()


if __name__ == "__main__":
    main()
