"""The Typer app, and the one place where an error becomes a line on stderr and an exit status.

Every command is registered through :func:`command`, which runs it under :func:`reported`:
the project's errors (:class:`GpusliceError`, whose message already names what was wrong and
what is accepted) and OS errors (a file that cannot be read or written, a port in use) end
the command with one line, ``gpuslice <command>: <message>``, and a non-zero exit status,
never a traceback. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer

from scheduler.core.errors import GpusliceError

app = typer.Typer(
    name="gpuslice",
    help="Share NVIDIA GPUs densely: a kube-scheduler extender, and a simulator for its policies.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help and usage errors, as most command-line tools print them: no boxes (and
    # rich is not imported for --help, which keeps it fast).
    rich_markup_mode=None,
)

F = TypeVar("F", bound=Callable[..., Any])

# Exit status of a command that failed on purpose: bad input or configuration, or a file that
# cannot be read or written (2, as for a usage error); a service or cluster that could not be
# reached (1: the error's own ``exit_code``).
EXIT_USAGE = 2


def os_error_text(exc: OSError) -> str:
    """``cannot write out/summary.csv: Permission denied``-style text of an OS error."""
    reason = exc.strerror or str(exc)
    return f"{exc.filename}: {reason}" if exc.filename else reason


def reported(name: str, fn: F) -> F:
    """``fn`` with the project's errors and OS errors turned into one line and an exit status."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except GpusliceError as exc:
            print(f"gpuslice {name}: {exc}", file=sys.stderr)
            raise typer.Exit(getattr(exc, "exit_code", EXIT_USAGE)) from None
        except BrokenPipeError:
            # The reader went away (gpuslice inspect | head): nothing to report, nothing more to
            # write; stdout goes nowhere, so that flushing it at exit does not fail again.
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (open until the process ends)
            raise typer.Exit(0) from None
        except OSError as exc:
            print(f"gpuslice {name}: {os_error_text(exc)}", file=sys.stderr)
            raise typer.Exit(EXIT_USAGE) from None

    return run  # type: ignore[return-value]


def command(name: str) -> Callable[[F], F]:
    """Register a command under ``name``, run under :func:`reported`."""

    def register(fn: F) -> F:
        app.command(name)(reported(name, fn))
        return fn

    return register


def _version(asked: bool) -> None:
    if asked:
        from scheduler import __version__

        print(f"gpuslice {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Share NVIDIA GPUs densely: a kube-scheduler extender, and a simulator for its policies."""


def main() -> None:
    app()
