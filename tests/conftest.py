"""Fixtures every test package may use."""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with ``ca.crt``, ``tls.crt`` and ``tls.key`` for gpuslice.gpuslice.svc, made by
    the script the deployment docs give (manifests/tls/make-serving-cert.sh)."""
    out = tmp_path_factory.mktemp("tls")
    result = subprocess.run(
        ["bash", str(REPO / "manifests/tls/make-serving-cert.sh"), "gpuslice", "gpuslice", "30"],
        env={**os.environ, "OUT_DIR": str(out)},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert {p.name for p in out.iterdir()} == {"ca.crt", "tls.crt", "tls.key"}
    return out


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """The logging set-up as it was before the test (a command run in-process configures it)."""
    names = ("gpuslice", "gpuslice.cache", "uvicorn", "uvicorn.error")
    loggers = [logging.getLogger(n) for n in names]
    saved = [(logger, logger.handlers[:], logger.level, logger.propagate) for logger in loggers]
    yield
    for logger, handlers, level, propagate in saved:
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate
