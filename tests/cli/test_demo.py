"""The demo's lines an operator reads first: why a pod fits nowhere (every node accounted for),
and the inspect command to run next, as this shell can run it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scheduler.extender.demo import nowhere, runnable_name


def test_fits_nowhere_names_three_nodes_and_counts_the_rest() -> None:
    reasons = {f"node-{i}": f"reason {i}" for i in range(6)}
    assert nowhere(reasons) == "node-0: reason 0; node-1: reason 1; node-2: reason 2; and 3 more"
    assert nowhere(dict(list(reasons.items())[:3])) == "node-0: reason 0; node-1: reason 1; node-2: reason 2"
    assert nowhere({}) == "no node to try"


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An executable ``gpuslice`` in ``tmp_path/.venv/bin``, the working folder ``tmp_path``."""
    path = tmp_path / ".venv" / "bin" / "gpuslice"
    path.parent.mkdir(parents=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    return path


def test_the_next_command_is_the_script_as_started_when_path_does_not_find_it(
    script: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # the README's set-up puts nothing on PATH
    assert runnable_name(".venv/bin/gpuslice") == ".venv/bin/gpuslice"
    assert runnable_name(str(script)) == ".venv/bin/gpuslice"
    elsewhere = script.parents[2] / "elsewhere"
    elsewhere.mkdir()
    os.chdir(elsewhere)
    assert runnable_name(str(script)) == str(script)  # not below the working folder: the whole path


def test_the_next_command_is_gpuslice_when_path_finds_this_very_script(
    script: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{script.parent}:/usr/bin:/bin")
    assert runnable_name(".venv/bin/gpuslice") == "gpuslice"
    assert runnable_name("python") == "gpuslice"  # not started as the script: the plain name
