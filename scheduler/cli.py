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
