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


def test_simulate_without_out_says_nothing_was_written_and_how_to_write() -> None:
    result = runner.invoke(app, ["simulate", "-p", "fgd", "--workers", "1", "-q"])
    assert result.exit_code == 0, result.output
    last = result.output.strip().splitlines()[-1]
    assert last == "nothing written (no --out): add --out DIR for summary.csv, curves.csv, table.md and the plots"


def test_simulate_with_out_says_what_it_wrote(tmp_path: Path) -> None:
    result = runner.invoke(app, ["simulate", "-p", "fgd", "--workers", "1", "-q", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert f"wrote {tmp_path / 'summary.csv'}" in result.output
    assert "nothing written" not in result.output


def test_simulate_compares_the_serving_default_among_its_default_policies() -> None:
    from scheduler.extender.config import PolicyConfig
    from scheduler.sim.commands import parse_policies

    assert PolicyConfig().name in parse_policies(None)
    assert parse_policies(None)[:6] == ["random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd"]
