"""``gpuslice simulate`` stopped by Ctrl-C (SIGINT to its process group, as a terminal sends it)
or by ``kill`` (SIGTERM to it alone), as a real process: its workers, the manager and the
resource tracker end within a second or so, the runs that had finished are written to ``--out``
and one line says how many and where, and the exit status is 128 + the signal."""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).with_name("gpuslice")
SEEDS = 300  # far more than the test waits for: runs remain when the signal comes
WORKERS = 2
STOP_SECONDS = 3.0  # the workers end within a second; slack for a loaded 2-core machine
DONE_SECONDS = 3.0  # the finished runs' data written (not the plots: seconds), then the parent ends


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (from /proc: children of children too)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pids: set[int]) -> set[int]:
    out = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.add(pid)
    return out


def _ended(process: subprocess.Popen[str], below: set[int]) -> tuple[str, str]:
    """The stopped command's output once it has ended by itself within DONE_SECONDS, every
    process it had started gone too; killed (its group) if it has not, and the test fails."""
    try:
        stdout, stderr = process.communicate(timeout=DONE_SECONDS)
        time.sleep(0.5)
        assert not alive(below | descendants(process.pid)), "a process was left behind"
        return stdout, stderr
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()


@pytest.mark.parametrize(("signum", "group"), [(signal.SIGINT, True), (signal.SIGTERM, False)], ids=["ctrl-c", "kill"])
def test_a_stopped_simulation_ends_every_process_and_keeps_the_finished_runs(
    tmp_path: Path, signum: int, group: bool
) -> None:
    out = tmp_path / "out"
    process = subprocess.Popen(
        [
            str(SCRIPT),
            "simulate",
            "-p",
            "fgd",
            "--seeds",
            f"1-{SEEDS}",
            "--workers",
            str(WORKERS),
            "-q",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a shell's foreground job
    )
    below: set[int] = set()
    try:
        # One process per run: a worker seen to end and be replaced means a run finished. Wait
        # for two replacements (the manager and the tracker count among the processes seen).
        seen: set[int] = set()
        deadline = time.monotonic() + 120
        while len(seen) < WORKERS + 2 + 2 and time.monotonic() < deadline and process.poll() is None:
            seen |= descendants(process.pid)
            time.sleep(0.05)
        assert process.poll() is None and len(seen) >= WORKERS + 4, "no run finished in 120 s"
        below = descendants(process.pid)
        if group:
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)
        sent = time.monotonic()
        while alive(below - {p for p in below if "resource_tracker" in _cmdline(p)}):
            assert time.monotonic() - sent < STOP_SECONDS, f"still running: {[_cmdline(p) for p in alive(below)]}"
            time.sleep(0.02)
        stopped_after = time.monotonic() - sent
    finally:
        stdout, stderr = _ended(process, below)
    assert process.returncode == 128 + signum, stderr
    last = stderr.strip().splitlines()[-1]
    found = re.fullmatch(
        r"gpuslice simulate: "
        r"stopped by (\S+): (\d+) of (\d+) runs had finished; wrote them to (.+)",
        last,
    )
    assert found, stderr
    assert found[1] == ("Ctrl-C" if group else "SIGTERM")
    assert found[4] == f"{out}/ (summary.csv, curves.csv, table.md); no plots (stopped: run it again to draw them)"
    finished = int(found[2])
    # The signal came after two runs had ended (so their rows must have been written) and while
    # others ran or waited (SEEDS is far more than finish in the test's seconds): some, not all.
    assert finished >= 1, f"no finished run written, though two had ended before the signal: {last}"
    assert finished < SEEDS, f"all {SEEDS} runs finished before the signal: the test did not interrupt anything"
    assert int(found[3]) == SEEDS, found[3]
    with (out / "summary.csv").open() as handle:
        assert len(list(csv.DictReader(handle))) == finished
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    assert "small-mixed" in stdout  # the finished runs' table
    print(f"workers ended {stopped_after:.2f} s after the signal")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.parametrize("after", [0.5, 1.5, 3.0])
def test_ctrl_c_at_any_moment_ends_the_command_and_every_process(tmp_path: Path, after: float) -> None:
    # Early Ctrl-Cs land while the pool starts its workers, or while the parent waits on its
    # futures: a signal raised inside concurrent.futures.wait could leave future locks taken and
    # the interpreter waiting for the pool's thread at exit forever; a worker still starting up
    # printed the interpreter's traceback.
    process = subprocess.Popen(
        [str(SCRIPT), "simulate", "-p", "fgd", "--seeds", f"1-{SEEDS}", "--workers", str(WORKERS), "-q"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    below: set[int] = set()
    try:
        time.sleep(after)
        below = descendants(process.pid)
        os.killpg(process.pid, signal.SIGINT)
    finally:
        _, stderr = _ended(process, below)
    assert process.returncode == 128 + signal.SIGINT, stderr
    assert "Traceback" not in stderr, stderr
