"""The webhook as the API server reaches it: mounted in gpuslice's app, over TLS with the
certificate manifests/tls/make-serving-cert.sh makes, checked by the Service's DNS name."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from scheduler.cli.serving import service_mounts
from scheduler.extender.app import create_app
from scheduler.extender.config import load_config
from scheduler.extender.service import Extender
from scheduler.filebackend import FileBackend, example_path
from scheduler.webhook.routes import router
from tests.deploy.manifests import REPO
from tests.deploy.reviews import pod, review

SERVICE_DNS = "gpuslice.gpuslice.svc"


def test_gpuslice_app_serves_the_webhook_with_its_prefix() -> None:
    config = load_config(None, {}, {"prefix": "gpus.example.com/"})
    app = create_app(Extender(config, FileBackend(example_path(), config.prefix)), service_mounts(config))

    async def post() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gpuslice") as client:
            return await client.post("/mutate", json=review(pod({"gpus.example.com/gpu-fraction": "0.5"})))

    response = asyncio.run(post())
    assert response.status_code == 200
    ops = json.loads(base64.b64decode(response.json()["response"]["patch"]))
    assert {"op": "add", "path": "/spec/schedulerName", "value": "gpuslice"} in ops
    assert any("metadata.annotations['gpus.example.com/visible-devices']" in json.dumps(op) for op in ops)


@pytest.fixture(scope="module")
def https_port(certificate: Path) -> Iterator[int]:
    app = FastAPI()
    app.include_router(router)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=0,
            ssl_certfile=str(certificate / "tls.crt"),
            ssl_keyfile=str(certificate / "tls.key"),
            log_config=None,
            access_log=False,
            lifespan="off",
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the HTTPS server did not start"
        time.sleep(0.02)
    port = int(server.servers[0].sockets[0].getsockname()[1])
    yield port
    server.should_exit = True
    thread.join(timeout=10)


def post_tls(port: int, ca: Path, server_name: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """POST as the API server does: verify the chain against caBundle and the name against the Service."""
    context = ssl.create_default_context(cafile=str(ca))
    payload = json.dumps(body).encode()
    request = (
        f"POST /mutate HTTP/1.1\r\nHost: {server_name}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    ).encode() + payload
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=server_name) as tls,
    ):
        tls.sendall(request)
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
    head, _, content = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(content)


def test_the_api_server_can_call_the_webhook_over_tls(certificate: Path, https_port: int) -> None:
    status, body = post_tls(
        https_port, certificate / "ca.crt", SERVICE_DNS, review(pod({"gpuslice.io/gpu-fraction": "0.5"}))
    )
    assert status == 200 and body["response"]["allowed"] is True and "patch" in body["response"]
    # the longer in-cluster name is in the certificate too
    status, _ = post_tls(https_port, certificate / "ca.crt", SERVICE_DNS + ".cluster.local", review(pod()))
    assert status == 200


def test_another_name_or_another_ca_is_refused(certificate: Path, https_port: int, tmp_path: Path) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        post_tls(https_port, certificate / "ca.crt", "gpuslice.default.svc", review(pod()))
    other = tmp_path / "other"
    result = subprocess.run(
        ["bash", str(REPO / "manifests/tls/make-serving-cert.sh")],
        env={**os.environ, "OUT_DIR": str(other)},
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0
    with pytest.raises(ssl.SSLCertVerificationError):
        post_tls(https_port, other / "ca.crt", SERVICE_DNS, review(pod()))


def test_the_certificate_script_rejects_a_bad_lifetime() -> None:
    result = subprocess.run(
        ["bash", str(REPO / "manifests/tls/make-serving-cert.sh"), "gpuslice", "gpuslice", "soon"],
        env={**os.environ, "OUT_DIR": "unused"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2 and "DAYS" in result.stderr
