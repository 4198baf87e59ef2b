"""What an operator types on the first day: ``example`` wherever a cluster is taken, ``--version``,
and ``simulate`` saying what it wrote (or that it wrote nothing) and comparing the serving default."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from scheduler import __version__
from scheduler.cli import app

runner = CliRunner()
METRICS = Path(__file__).resolve().parents[1] / "sim" / "data" / "advise-range.json"


def test_version_prints_the_package_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output == f"gpuslice {__version__}\n"


@pytest.mark.parametrize(
    "args",
    [
        ["simulate", "example", "-p", "fgd", "--workers", "1", "-q"],
        ["bound", "example", "--at", "10"],
        ["advise", str(METRICS), "--cluster", "example"],
    ],
    ids=lambda a: a[0],
)
def test_every_command_that_takes_a_cluster_takes_example(args: list[str]) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "no such file" not in result.output
