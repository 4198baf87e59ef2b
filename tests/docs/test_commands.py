"""The cheap commands the documents quote, run as written: the README's first command and, while
it serves, every ``gpuslice inspect`` and the metrics it quotes; ``gpuslice demo``; the help the
benchmarks time. (``gpuslice simulate`` without arguments runs in tests/sim/test_cli.py; the
commands that need a cluster or the Alibaba trace are parsed in test_docs.py.)"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from scheduler.extender.client import ExtenderClient

from .reading import DOCUMENTS, REPO, blocks, gpuslice_commands, shell_lines

SCRIPT = Path(sys.executable).with_name("gpuslice")  # the console script the install puts beside python


def gpuslice(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def first_command() -> list[str]:
    """The README's first command, after its set-up step: ``.venv/bin/gpuslice serve ...``."""
    block = next(b for b in blocks(REPO / "README.md") if "install-venv.sh" in b.text)
    (setup, serve) = shell_lines(block.text)
    assert setup == "bash scripts/install-venv.sh .venv"
    words = shlex.split(serve)
    assert words[0] == ".venv/bin/gpuslice"
    return words[1:]


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, list[str]]]:
    """The README's first command running (on a free port: GPUSLICE_PORT=0, which its flags leave
    alone), its URL and its demo's output."""
    pytest.importorskip("uvicorn")
    assert SCRIPT.exists(), f"no console script at {SCRIPT}: install the package (pip install -e .)"
    process = subprocess.Popen(
        [str(SCRIPT), *first_command()],
        cwd=REPO,
        env={**os.environ, "GPUSLICE_PORT": "0"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stderr is not None
    logs: list[str] = []
    reader = threading.Thread(target=lambda: logs.extend(process.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    lines: list[str] = []
    deadline = time.monotonic() + 60
    for line in process.stdout:
        lines.append(line.rstrip("\n"))
        if line.startswith("inspect the result:") or time.monotonic() > deadline:
            break
    try:
        url = lines[-1].split("--url ", 1)[1] if lines and "--url " in lines[-1] else ""
        assert url, "\n".join(lines + logs)
        yield url, lines
    finally:
        process.terminate()
        process.wait(10)
        for stream in (process.stdout, process.stderr):
            stream.close()


DEMO_FIRST_LINE = "gpuslice demo: 7 pending pods through filter -> prioritize -> bind, policy fgd-reserve"


def test_the_first_command_serves_the_example_and_plays_the_demo(served: tuple[str, list[str]]) -> None:
    url, lines = served
    assert lines[0].startswith(DEMO_FIRST_LINE)
    table = lines[2 : lines.index("", 2)]
    assert table[0].split() == ["POD", "NODE", "SCORE", "SHARE", "/", "REASON"]
    assert all("/10" in row or "not scheduled" in row for row in table[1:])
    client = ExtenderClient(url)
    try:
        assert client.request("GET", "/readyz") == (200, b"ready")
        status, metrics = client.request("GET", "/metrics")  # the README's curl
        assert status == 200 and b"gpuslice_binds_total" in metrics
    finally:
        client.close()


def test_the_demo_suggests_an_inspect_that_runs_as_printed(served: tuple[str, list[str]]) -> None:
    # after the README's set-up nothing is on PATH: the line must name the script it can run
    _, lines = served
    suggested = lines[-1].split("inspect the result:", 1)[1].strip()
    done = subprocess.run(suggested, shell=True, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (suggested, done.stderr)
    assert done.stdout.split()[:3] == ["NODE", "GPU", "MODE"]


def test_the_demo_puts_the_pod_without_gpus_on_the_node_without_gpus(served: tuple[str, list[str]]) -> None:
    # the example's cpu-only node has room: the default policy keeps GPU nodes' CPU for GPU pods
    _, lines = served
    assert next(line for line in lines if line.startswith("demo/web ")).split()[1] == "cpu-only"


def quoted_inspects() -> list[list[str]]:
    return sorted({tuple(c) for path in DOCUMENTS for c in gpuslice_commands(path) if c[:1] == ["inspect"]})  # type: ignore[return-value]


@pytest.mark.parametrize("command", quoted_inspects(), ids=" ".join)
def test_every_quoted_inspect_runs(served: tuple[str, list[str]], command: tuple[str, ...]) -> None:
    url, _ = served
    done = gpuslice(*command, "--url", url)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    if "-o" in command and command[command.index("-o") + 1] in ("json", "yaml"):
        parsed = json.loads(out) if command[command.index("-o") + 1] == "json" else yaml.safe_load(out)
        assert parsed
    elif "--quotas" in command:
        # the example cluster's GPUQuota of team-a, with what its bound pods hold of it
        lines = out.splitlines()
        assert lines[0].split() == ["NAMESPACE", "QUOTA", "MODEL", "MEMORY", "COMPUTE", "GPUS", "OVER"]
        assert lines[1].split()[:3] == ["team-a", "team-a", "*"] and lines[1].split()[-1] == "no"
    else:
        assert out.splitlines()[0].split()[:3] == ["NODE", "GPU", "UUID" if "wide" in command else "MODE"]
        if "wide" not in command:
            assert max(len(line) for line in out.splitlines()) <= 80  # the default view fits 80 columns


def test_gpuslice_demo_plays_the_same_demo_and_exits() -> None:
    done = gpuslice("demo")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(DEMO_FIRST_LINE)
    assert "demo/mig-3g" in done.stdout and "/10 " in done.stdout  # prioritize's scores, 0..10
    assert done.stderr == ""  # warnings only: the table is not mixed with log lines


@pytest.mark.parametrize("args", [["--help"], ["simulate", "--help"], ["serve", "--help"], ["inspect", "--help"]])
def test_the_help_the_benchmark_times_prints(args: list[str]) -> None:
    done = gpuslice(*args)
    assert done.returncode == 0 and done.stdout.startswith("Usage: gpuslice"), done.stderr


def test_inspect_into_a_reader_that_stops_early_says_nothing(served: tuple[str, list[str]], tmp_path: Path) -> None:
    # gpuslice inspect | head: the pipe closes before inspect writes; that is no error to report
    url, _ = served
    errors = tmp_path / "stderr"
    command = f"{shlex.quote(str(SCRIPT))} inspect --url {url} -o yaml 2>{shlex.quote(str(errors))} | true"
    subprocess.run(command, shell=True, check=False, timeout=60)
    assert errors.read_text() == ""


def quoted(first: str) -> list[list[str]]:
    """Every command the documents quote whose first argument is ``first``, once each."""
    found = {tuple(c) for path in DOCUMENTS for c in gpuslice_commands(path) if c[:1] == [first]}
    return [list(c) for c in sorted(found)]


def test_the_quoted_version_prints_the_version() -> None:
    from scheduler import __version__

    assert quoted("--version"), "no document quotes gpuslice --version"
    for command in quoted("--version"):
        done = gpuslice(*command)
        assert (done.returncode, done.stdout) == (0, f"gpuslice {__version__}\n"), done.stderr


SHIPPED = ("example", "example-defrag")  # the examples that stand in for a file


def on_shipped_examples(command: list[str]) -> bool:
    """A command that reads only what ships with the package: its cluster is an example, and so
    is every other input it names (no live cluster, no file of the reader's)."""
    cluster = next((command[i + 1] for i, w in enumerate(command[:-1]) if w in ("--cluster-file", "--cluster")), "")
    inputs = [w for i, w in enumerate(command[1:], 1) if not w.startswith("-") and not command[i - 1].startswith("-")]
    return cluster in SHIPPED and all(w in SHIPPED for w in inputs)


EXPECTED = {"advise": "SUGGESTED", "defrag": "move 1: evict "}  # the table's header; the plan's first move


@pytest.mark.parametrize("first", sorted(EXPECTED))
def test_the_documents_quote_a_runnable_command_for(first: str) -> None:
    assert any(on_shipped_examples(c) for c in quoted(first)), f"no document quotes gpuslice {first} on an example"


@pytest.mark.parametrize(
    "command", [c for first in sorted(EXPECTED) for c in quoted(first) if on_shipped_examples(c)], ids=" ".join
)
def test_every_quoted_command_on_the_shipped_examples_runs(command: list[str]) -> None:
    done = gpuslice(*command)
    assert done.returncode == 0, done.stderr
    assert EXPECTED[command[0]] in done.stdout, done.stdout


def test_the_quoted_agent_demo_runs_without_a_cluster() -> None:
    demos = [c for c in quoted("agent") if "--demo" in c]
    assert demos, "no document quotes gpuslice agent --demo"
    for command in demos:
        done = gpuslice(*command)
        assert done.returncode == 0, done.stderr
        assert "CDI device  nvidia.com/gpu=" in done.stdout and "gpuslice_share_" in done.stdout


def test_the_readme_says_how_long_its_two_commands_take() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    for command in ("bash scripts/install-venv.sh .venv && ", "bash scripts/test.sh\n"):
        after = text.split(command, 1)[1].split("```", 1)[1]  # the prose after the command's block
        first = after.strip().split("\n\n", 1)[0]
        assert re.match(r"\(About [\d.]+(-[\d.]+)? minutes", first), (command, first)
