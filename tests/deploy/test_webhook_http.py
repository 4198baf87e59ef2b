"""The webhook's HTTP face: POST /mutate and /validate, malformed bodies, the app's config."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from scheduler.webhook import WebhookConfig
from scheduler.webhook.routes import router
from tests.deploy.reviews import pod, review


class Client:
    """Requests to the app in process (httpx's ASGI transport; no socket, no thread)."""

    def __init__(self) -> None:
        self.app = FastAPI()
        self.app.include_router(router)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://webhook") as client:
                return await client.post(path, **kwargs)

        return asyncio.run(go())


@pytest.fixture
def client() -> Client:
    return Client()


def test_mutate_over_http(client: Client) -> None:
    response = client.post("/mutate", json=review(pod({"gpuslice.io/gpu-fraction": "0.5"})))
    assert response.status_code == 200
    body = response.json()
    assert body["response"]["allowed"] is True
    ops = json.loads(base64.b64decode(body["response"]["patch"]))
    assert {"op": "add", "path": "/spec/schedulerName", "value": "gpuslice"} in ops


def test_validate_over_http_denies_a_bad_request(client: Client) -> None:
    response = client.post("/validate", json=review(pod({"gpuslice.io/gpu-count": "two"})))
    assert response.status_code == 200
    status = response.json()["response"]["status"]
    assert status["code"] == 422 and "gpuslice.io/gpu-count" in status["message"]


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"", "not JSON"),
        (b"{not json", "not JSON"),
        (b"\xff\xfe\x00", "not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "not JSON"),  # nesting deeper than the decoder allows
        (b"42", "expected a JSON object, got int"),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": []}', "request: expected"),
    ],
)
@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_a_malformed_body_is_a_400_with_a_message(client: Client, path: str, content: bytes, fragment: str) -> None:
    response = client.post(path, content=content, headers={"content-type": "application/json"})
    assert response.status_code == 400
    body = response.json()
    assert body["kind"] == "AdmissionReview" and body["response"]["allowed"] is False
    assert fragment in body["response"]["status"]["message"]


def test_the_app_config_is_used(client: Client) -> None:
    client.app.state.webhook_config = WebhookConfig(prefix="gpus.example.com/")
    response = client.post("/mutate", json=review(pod({"gpus.example.com/gpu-fraction": "0.5"})))
    ops = json.loads(base64.b64decode(response.json()["response"]["patch"]))
    assert any("gpus.example.com/visible-devices" in json.dumps(op) for op in ops)


def test_a_bug_denies_the_pod_with_a_message_not_a_500(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    import scheduler.webhook.routes as routes

    def broken(body: object, config: WebhookConfig) -> Any:
        raise KeyError("spec")

    monkeypatch.setattr(routes, "mutate", broken)
    response = client.post("/mutate", json=review(pod({"gpuslice.io/gpu-fraction": "0.5"})))
    assert response.status_code == 200
    body = response.json()["response"]
    assert body["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002" and body["allowed"] is False
    assert (
        body["status"]["code"] == 500
        and "internal error in the gpuslice webhook: KeyError" in (body["status"]["message"])
    )
