"""MPS control daemons: the NVIDIA device plugin's where it runs one, else one per MPS GPU of our own.

Caps apply when a client connects to its GPU's control daemon. A client's own
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` / ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` can only lower
what the daemon allows (NVIDIA's MPS documentation), so each daemon the agent starts gets
defaults (``set_default_active_thread_percentage``, ``set_default_device_pinned_mem_limit``)
that bound a client which drops its environment. Processes go through a
:class:`ProcessRunner`, so tests never start one.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .config import MpsSettings

log = logging.getLogger("gpuslice.agent.mps")

CONTROL = "nvidia-cuda-mps-control"


class Running(Protocol):
    def poll(self) -> int | None:
        """None while running, else the exit status."""

    def stop(self) -> None: ...


class ProcessRunner(Protocol):
    def start(self, argv: Sequence[str], env: Mapping[str, str]) -> Running:
        """Start a long-running process."""

    def run(self, argv: Sequence[str], env: Mapping[str, str], stdin: str) -> str:
        """Run a short command to its end, with ``stdin``; its output (OSError or
        subprocess.CalledProcessError if it cannot run or fails)."""


class _Popen:
    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self._process = process

    def poll(self) -> int | None:
        return self._process.poll()

    def stop(self) -> None:
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()


class SubprocessRunner:
    """Real processes (the agent's container has the driver's tools from the NVIDIA toolkit)."""

    def start(self, argv: Sequence[str], env: Mapping[str, str]) -> Running:
        return _Popen(subprocess.Popen(list(argv), env={**os.environ, **env}, stdin=subprocess.DEVNULL))

    def run(self, argv: Sequence[str], env: Mapping[str, str], stdin: str) -> str:
        done = subprocess.run(
            list(argv), env={**os.environ, **env}, input=stdin, capture_output=True, text=True, timeout=30, check=True
        )
        return done.stdout


@dataclass(frozen=True, slots=True)
class Pipe:
    """Where a GPU's MPS clients reach their daemon: the host directory to mount."""

    host_directory: str
    ours: bool  # started by the agent (else the NVIDIA device plugin's)


class MpsDaemons:
    """Finds or runs the control daemon of each MPS GPU."""

    def __init__(self, settings: MpsSettings, runner: ProcessRunner) -> None:
        self._settings = settings
        self._runner = runner
        self._running: dict[str, Running] = {}
        self.restarts: dict[str, int] = {}

    def _external(self) -> bool:
        mode = self._settings.daemon
        if mode == "auto":
            return Path(self._settings.external_pipe_directory, "control").exists()
        return mode == "external"

    def _env(self, gpu_uuid: str) -> dict[str, str]:
        base = Path(self._settings.root, gpu_uuid)
        return {
            "CUDA_VISIBLE_DEVICES": gpu_uuid,
            "CUDA_MPS_PIPE_DIRECTORY": str(base / "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": str(base / "log"),
        }

    def pipe(self, gpu_uuid: str) -> Pipe:
        if self._external():
            return Pipe(self._settings.external_pipe_directory, False)
        return Pipe(self._env(gpu_uuid)["CUDA_MPS_PIPE_DIRECTORY"], True)

    def down(self, gpu_uuid: str) -> str:
        """Why no daemon would enforce an MPS share's caps on that GPU now ("" if one would)."""
        if self._external():
            control = Path(self._settings.external_pipe_directory, "control")
            if not control.exists():
                return f"the NVIDIA device plugin's MPS control daemon has no pipe at {control}"
            return ""
        running = self._running.get(gpu_uuid)
        if running is None or running.poll() is not None:
            return f"the MPS control daemon of {gpu_uuid} is not running"
        return ""

    def ensure(self, gpu_uuids: Sequence[str]) -> list[str]:
        """Start (again) the daemon of every MPS GPU that has none; what went wrong, one line each."""
        if self._external():
            return []
        problems = []
        for uuid in gpu_uuids:
            running = self._running.get(uuid)
            if running is not None and running.poll() is None:
                continue
            if running is not None:
                self.restarts[uuid] = self.restarts.get(uuid, 0) + 1
                log.warning("MPS control daemon of %s exited (%s); starting it again", uuid, running.poll())
            env = self._env(uuid)
            try:
                for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
                    Path(env[key]).mkdir(parents=True, exist_ok=True)
                self._running[uuid] = self._runner.start([CONTROL, "-f"], env)
                self._set_defaults(env)
            except (OSError, subprocess.SubprocessError) as exc:
                problems.append(f"MPS control daemon for {uuid}: {exc}")
        return problems

    def _set_defaults(self, env: Mapping[str, str]) -> None:
        lines = [f"set_default_active_thread_percentage {self._settings.default_thread_percentage}"]
        if self._settings.default_pinned_memory_mib:
            # device 0: the daemon sees only its own GPU (CUDA_VISIBLE_DEVICES)
            lines.append(f"set_default_device_pinned_mem_limit 0 {self._settings.default_pinned_memory_mib}M")
        self._runner.run([CONTROL], env, "\n".join(lines) + "\n")

    def stop(self) -> None:
        for uuid, running in sorted(self._running.items()):
            try:
                self._runner.run([CONTROL], self._env(uuid), "quit\n")
            except (OSError, subprocess.SubprocessError):
                running.stop()
        self._running.clear()
