from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

with warnings.catch_warnings():
    # starlette 1.x asks for httpx2 behind its TestClient; httpx is what this project installs.
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from starlette.testclient import TestClient

from scheduler.extender.app import create_app
from scheduler.extender.config import load_config
from scheduler.extender.service import Extender
from scheduler.filebackend import FileBackend

from .kit import cluster_file


class Served:
    """A service over a cluster file, reached through FastAPI's TestClient."""

    def __init__(self, path: Path, **config: Any) -> None:
        self.config = load_config(env={}, flags=config)
        self.backend = FileBackend(path, self.config.prefix, clock=lambda: "2025-01-01T00:00:00Z")
        self.extender = Extender(self.config, self.backend)
        self.extender.start()
        self.http = TestClient(create_app(self.extender))

    def post(self, verb: str, payload: Any) -> Any:
        response = self.http.post(f"{self.config.url_prefix}/{verb}", json=payload)
        assert response.status_code == 200, response.text
        return response.json()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    made: list[Served] = []

    def make(*items: dict[str, Any], **config: Any) -> Served:
        served = Served(cluster_file(tmp_path / f"cluster{len(made)}.json", *items), **config)
        made.append(served)
        return served

    yield make
    for served in made:
        served.http.close()
        served.extender.stop()
