"""The composition root: the ``gpuslice`` command.

The only package that knows every face. Each command declares its options, builds what the
face needs (a backend, the webhook mounted on the service's HTTP app) and calls the face's
entry point, a plain function. No face imports this package, and the faces are imported
inside the commands, so ``gpuslice --help`` loads none of them.

Modules: ``_app`` (the Typer app and the one error handler), then one module per face's
commands: ``serving`` (serve, inspect, demo), ``simulation`` (simulate, bound, advise), ``node`` (agent).
"""

from __future__ import annotations

from . import node, serving, simulation
from ._app import app, main

__all__ = ["app", "main", "node", "serving", "simulation"]
