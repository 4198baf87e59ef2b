"""Security: TLS as kube-scheduler and the API server use it, the body cap, records gpuslice did
not write, who may call what, every route audited, and the container unprivileged.
docs/security.md is the threat model these tests hold to."""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import os
import re
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from scheduler.cli.serving import service_mounts
from scheduler.core.allocation import Allocation, DeviceShare, encode_record
from scheduler.core.inventory import SharingMode
from scheduler.extender.app import create_app
from scheduler.extender.config import load_config
from scheduler.extender.server import Server
from scheduler.extender.service import Extender
from scheduler.filebackend import FileBackend, example_path
from scheduler.webhook import mutate, validate
from scheduler.webhook.routes import MAX_BODY_BYTES
from tests.deploy.manifests import find
from tests.deploy.reviews import eviction_review, review
from tests.deploy.reviews import pod as review_pod

from .harness import PREFIX, REPO, CountingApiServer, Replica, cache_view, node_json, pod_json, wait_for

Make = Callable[..., Replica]


# ---------------------------------------------------------------- TLS


def manifest_settings() -> tuple[dict[str, Any], dict[str, Any]]:
    """(gpuslice serve's settings, kube-scheduler's extender entry) as manifests/config.yaml gives them."""
    data = find("ConfigMap", "gpuslice-config")["data"]
    serve = yaml.safe_load(data["gpuslice.yaml"])
    (extender,) = yaml.safe_load(data["scheduler-config.yaml"])["extenders"]
    return serve, extender


@pytest.fixture(scope="module")
def https_server(certificate: Path) -> Iterator[Server]:
    config = load_config(
        env={}, flags={"port": 0, "tls_cert": certificate / "tls.crt", "tls_key": certificate / "tls.key"}
    )
    extender = Extender(config, FileBackend(example_path(), config.prefix))
    extender.start()
    server = Server(extender, service_mounts(config)).start_in_thread()
    yield server
    server.stop()
    extender.stop()


def https_post(port: int, path: str, body: Any, ca: Path, server_name: str) -> tuple[int, Any]:
    """A POST as kube-scheduler (caFile, serverName) or the API server (caBundle, Service name) sends it."""
    context = ssl.create_default_context(cafile=str(ca))
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {server_name}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    )
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=server_name) as tls,
    ):
        tls.sendall(head.encode() + payload)
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
    head_bytes, _, content = data.partition(b"\r\n\r\n")
    return int(head_bytes.split(b" ", 2)[1]), json.loads(content)


def test_kube_schedulers_tls_settings_match_the_listener() -> None:
    serve, extender = manifest_settings()
    assert extender["enableHTTPS"] is True
    url = urlsplit(extender["urlPrefix"])
    assert url.scheme == "https" and url.port == serve["port"] and url.hostname == "127.0.0.1"
    tls = extender["tlsConfig"]
    assert not tls.get("insecure") and tls["serverName"] and tls["caFile"]
    # the CA, certificate and key are the three keys of one Secret mounted in both containers
    folder = Path(serve["tls_cert"]).parent
    assert {Path(tls["caFile"]), Path(serve["tls_cert"]), Path(serve["tls_key"])} == {
        folder / "ca.crt",
        folder / "tls.crt",
        folder / "tls.key",
    }
    deployment = find("Deployment", "gpuslice")["spec"]["template"]["spec"]
    for container in deployment["containers"]:
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert mounts.get(str(folder)) == "tls", container["name"]
    # kube-scheduler reaches the verbs over loopback, which is what gpuslice trusts
    assert "127.0.0.0/8" in serve["trusted_networks"]


def test_an_https_round_trip_as_kube_scheduler_and_the_api_server_make_it(
    certificate: Path, https_server: Server
) -> None:
    _, extender = manifest_settings()
    name = extender["tlsConfig"]["serverName"]
    port = https_server.port
    pod = pod_json("p", gpu_fraction="0.5")
    status, body = https_post(port, "/filter", {"Pod": pod, "NodeNames": ["l4-mps"]}, certificate / "ca.crt", name)
    assert status == 200 and body["NodeNames"] == ["l4-mps"] and body["Error"] == ""
    admission = review(review_pod({PREFIX + "gpu-fraction": "0.5"}))
    status, body = https_post(port, "/mutate", admission, certificate / "ca.crt", name)
    assert status == 200 and body["response"]["allowed"] is True


def test_tls_refuses_plain_http_and_clients_of_another_ca(
    certificate: Path, https_server: Server, tmp_path: Path
) -> None:
    with socket.create_connection(("127.0.0.1", https_server.port), timeout=5) as raw:
        raw.sendall(b"POST /bind HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        try:
            answer = raw.recv(1024)
        except ConnectionResetError:
            answer = b""
    assert not answer.startswith(b"HTTP/1.1 200")  # no verb is served in the clear
    other = tmp_path / "other"
    subprocess.run(
        ["bash", str(REPO / "manifests/tls/make-serving-cert.sh")],
        env={**os.environ, "OUT_DIR": str(other)},
        capture_output=True,
        check=True,
        timeout=60,
    )
    _, extender = manifest_settings()
    with pytest.raises(ssl.SSLCertVerificationError):
        https_post(https_server.port, "/filter", {}, other / "ca.crt", extender["tlsConfig"]["serverName"])


# ---------------------------------------------------------------- the body cap


@pytest.mark.parametrize(("path", "cap"), [("/filter", 65536), ("/bind", 65536), ("/mutate", MAX_BODY_BYTES)])
def test_a_body_over_the_cap_is_refused_before_it_is_read(
    api: CountingApiServer, replicas: Make, path: str, cap: int
) -> None:
    # Regression (webhook): it read the whole body before comparing it with the cap, so a client
    # declaring gigabytes held a connection and the memory until the bytes came.
    replica = replicas(serve={"max_body_bytes": 65536})
    host, port = replica.url.removeprefix("http://").split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {10 * 2**30}\r\n\r\n".encode())
        response = http.client.HTTPResponse(sock)
        response.begin()
        answer = response.read().decode()
    assert time.monotonic() - started < 3
    assert response.status in (200, 400)
    assert str(cap) in answer  # the reply names the limit
    status, data = replica.client.request("POST", path, b'{"Pod": "' + b"x" * cap + b'"}')
    assert status in (200, 400) and str(cap) in data.decode()


# ---------------------------------------------------------------- records gpuslice did not write


def forged(pod: dict[str, Any], node: str, phase: str | None = "bound", bound: bool = False) -> dict[str, Any]:
    """``pod`` claiming GPU 0 of ``node`` whole, with every output annotation a bind writes, and more."""
    claim = Allocation(node, (DeviceShare(f"{node}-gpu0", 0, SharingMode.EXCLUSIVE, 81920, 1000),), 100, 0)
    notes = pod["metadata"]["annotations"]
    notes[PREFIX + "allocation"] = encode_record(claim, "2024-05-01T11:00:00Z")
    notes[PREFIX + "visible-devices"] = f"{node}-gpu0"
    notes[PREFIX + "mps-memory-limit"] = "0=81920M"
    if phase is not None:
        notes[PREFIX + "bind-phase"] = phase
    if bound:
        pod["spec"]["nodeName"] = node
    return pod


def test_a_forged_record_on_a_pending_pod_neither_claims_nor_blocks_a_share(
    api: CountingApiServer, replicas: Make
) -> None:
    for name in ("ex1", "ex2"):
        api.put_node(node_json(name, gpus=1, mode="exclusive"))
    liar = api.put_pod(forged(pod_json("liar", gpu_count="1"), "ex1"))
    honest = api.put_pod(pod_json("honest", gpu_count="1"))
    replica = replicas()
    wait_for(lambda: {"default/liar", "default/honest"} <= set(replica.extender.cache.pods), "the pods")
    empty = cache_view(replica.extender, ["ex1"])["ex1"]
    assert empty is not None and empty[3] == ((0, 0, 0, False, ()),)  # the claim counts nowhere
    assert replica.client.filter(honest, ["ex1"])["NodeNames"] == ["ex1"]  # and blocks nothing
    assert replica.client.bind(honest, "ex1") == ""
    # the liar gets what gpuslice gives it, and nothing of what it wrote survives the bind
    replica.client.filter(liar, ["ex1", "ex2"])
    assert "no share" in replica.client.bind(liar, "ex1")
    assert replica.client.bind(liar, "ex2") == ""
    notes = (api.pod("default", "liar") or {})["metadata"]["annotations"]
    assert json.loads(notes[PREFIX + "allocation"])["node"] == "ex2"
    assert notes[PREFIX + "visible-devices"] == "ex2-gpu0" and PREFIX + "mps-memory-limit" not in notes


# "bound": the phase only gpuslice's Binding writes, forged too; the node's ledger holds no such pod.
@pytest.mark.parametrize("phase", [None, "allocating", "failed", "bound"])
def test_a_forged_record_on_a_pod_another_binder_placed_is_ignored(
    api: CountingApiServer, replicas: Make, phase: str | None
) -> None:
    api.put_node(node_json("ex1", gpus=1, mode="exclusive"))
    api.put_pod(forged(pod_json("squatter"), "ex1", phase=phase, bound=True))  # spec.nodeName set at creation
    honest = api.put_pod(pod_json("honest", gpu_count="1"))
    replica = replicas()
    wait_for(lambda: "default/squatter" in replica.extender.cache.pods, "the squatter")
    assert replica.client.filter(honest, ["ex1"])["NodeNames"] == ["ex1"]
    assert replica.client.bind(honest, "ex1") == ""  # the bind's own view ignores the claim too


def test_the_webhook_strips_and_refuses_forged_output_annotations() -> None:
    notes = {PREFIX + "gpu-fraction": "0.5", PREFIX + "allocation": "{}", PREFIX + "bind-phase": "bound"}
    created = mutate(review(review_pod(dict(notes))))
    ops = json.loads(base64.b64decode(created.response["patch"]))
    removed = {op["path"] for op in ops if op["op"] == "remove"}
    assert removed == {"/metadata/annotations/gpuslice.io~1allocation", "/metadata/annotations/gpuslice.io~1bind-phase"}
    denied = validate(review(review_pod(dict(notes))))
    assert not denied.response["allowed"] and "gpuslice.io/allocation" in denied.response["status"]["message"]
    before = review_pod({PREFIX + "gpu-fraction": "0.5"})
    after = review_pod(dict(notes))
    update = validate(review(after, "UPDATE", before, username="system:serviceaccount:team-a:default"))
    assert not update.response["allowed"] and update.response["status"]["code"] == 403


# ---------------------------------------------------------------- who may call what


def asgi(app: Any, client: tuple[str, int], method: str, path: str, body: Any = None) -> httpx.Response:
    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, client=client)
        async with httpx.AsyncClient(transport=transport, base_url="http://gpuslice") as http:
            return await http.request(method, path, json=body)

    return asyncio.run(call())


ROUTES = {
    ("POST", "/filter"),
    ("POST", "/prioritize"),
    ("POST", "/bind"),
    ("POST", "/preempt"),
    ("POST", "/mutate"),
    ("POST", "/validate"),
    ("POST", "/validate-eviction"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/debug/nodes"),
    ("GET", "/debug/nodes/{name}"),
    ("GET", "/debug/defrag"),
    ("GET", "/debug/quotas"),
}


def route_table(routes: Any, prefix: str = "") -> set[tuple[str, str]]:
    """(method, path) of every route, those of included routers too (a mount counts as method "*")."""
    out: set[tuple[str, str]] = set()
    for route in routes:
        nested = getattr(route, "original_router", None)  # FastAPI's lazily included router
        if nested is not None:
            out |= route_table(nested.routes, prefix + getattr(route.include_context, "prefix", ""))
        elif isinstance(getattr(route, "path", None), str):
            methods = getattr(route, "methods", None) or ("*",)
            out |= {(m, prefix + route.path) for m in methods if m != "HEAD"}
        else:
            out.add(("*", repr(route)))
    return out


def test_every_route_is_audited() -> None:
    # A new route fails here until it is added, with its threat, to docs/security.md.
    config = load_config(env={}, flags={})
    app = create_app(Extender(config, FileBackend(example_path(), config.prefix)), service_mounts(config))
    assert route_table(app.routes) == ROUTES
    threat_model = (REPO / "docs/security.md").read_text(encoding="utf-8")
    for _, path in ROUTES:
        assert f"`{path.split('{')[0].rstrip('/')}" in threat_model, path


@pytest.mark.parametrize("client", ["10.2.3.4", "192.168.1.9", "::ffff:10.0.0.1", "2001:db8::1"])
def test_only_trusted_networks_reach_the_verbs_and_debug(client: str) -> None:
    config = load_config(env={}, flags={})
    extender = Extender(config, FileBackend(example_path(), config.prefix))
    extender.start()
    app = create_app(extender, service_mounts(config))
    pod = pod_json("p", gpu_fraction="0.5")
    bind = {"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": "l4-mps"}
    for path, body in (("/filter", {"Pod": pod}), ("/prioritize", {"Pod": pod}), ("/bind", bind), ("/preempt", {})):
        response = asgi(app, (client, 40000), "POST", path, body)
        assert response.status_code == 403 and "trusted_networks" in response.json()["error"], path
        assert asgi(app, ("127.0.0.1", 40000), "POST", path, body).status_code == 200
    assert asgi(app, (client, 40000), "GET", "/debug/nodes").status_code == 403
    assert asgi(app, (client, 40000), "GET", "/debug/nodes/l4-mps").status_code == 403
    assert asgi(app, (client, 40000), "GET", "/debug/quotas").status_code == 403
    assert asgi(app, (client, 40000), "GET", "/debug/defrag").status_code == 403
    assert asgi(app, ("127.0.0.1", 40000), "GET", "/debug/defrag").status_code == 200
    for method, path in (("GET", "/metrics"), ("GET", "/healthz"), ("GET", "/readyz")):
        assert asgi(app, (client, 40000), method, path).status_code == 200, path
    assert asgi(app, (client, 40000), "POST", "/mutate", review(review_pod())).status_code == 200
    extender.stop()


def test_only_bind_changes_the_allocation_state(api: CountingApiServer, replicas: Make) -> None:
    api.put_node(node_json("n1", gpus=1))
    pod = api.put_pod(pod_json("p", gpu_fraction="0.5"))
    replica = replicas()
    wait_for(lambda: "default/p" in replica.extender.cache.pods, "the pod")

    def state() -> tuple[int, Any]:
        return api.resource_version, cache_view(replica.extender, ["n1"])

    before = state()
    client = replica.client
    calls: list[tuple[str, str, Any]] = [
        ("POST", "/filter", {"Pod": pod, "NodeNames": ["n1"]}),
        ("POST", "/prioritize", {"Pod": pod, "NodeNames": ["n1"]}),
        ("POST", "/preempt", {"Pod": pod, "NodeNameToMetaVictims": {"n1": {"Pods": [], "NumPDBViolations": 0}}}),
        ("POST", "/mutate", review(pod)),
        ("POST", "/validate", review(pod)),
        ("POST", "/validate-eviction", eviction_review("p", "default", nodes=["n1"])),
        ("GET", "/debug/nodes", None),
        ("GET", "/debug/nodes/n1", None),
        ("GET", "/debug/defrag", None),
        ("GET", "/debug/quotas", None),
        ("GET", "/metrics", None),
        ("GET", "/healthz", None),
        ("GET", "/readyz", None),
    ]
    for method, path, body in calls:
        status, _ = client.request(method, path, json.dumps(body).encode() if body is not None else None)
        assert status == 200, path
        if path == "/prioritize":  # it holds the node it ranks first for the pod, in memory only
            cache = replica.extender.cache
            assert cache.held("default/p") is not None and api.resource_version == before[0]
            cache.unreserve("default/p")
        assert state() == before, f"{method} {path} changed the allocation state"
    assert client.bind(pod, "n1") == ""
    assert state() != before


# ---------------------------------------------------------------- the container


def test_the_container_runs_unprivileged() -> None:
    text = re.sub(r"\\\n\s*", " ", (REPO / "Dockerfile").read_text(encoding="utf-8"))
    final_stage = text.split("\nFROM ")[-1]
    (user,) = re.findall(r"^USER\s+(\S+)", final_stage, re.M)
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0  # numeric, so that runAsNonRoot can check it
    spec = find("Deployment", "gpuslice")["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True and str(spec["securityContext"]["runAsUser"]) == uid
    assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
    for container in spec["containers"]:
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False, container["name"]
        assert context["readOnlyRootFilesystem"] is True, container["name"]
        assert context["capabilities"]["drop"] == ["ALL"] and not context["capabilities"].get("add")
        assert context.get("privileged") in (None, False)


def test_a_record_edited_after_its_bind_does_not_free_the_share_it_holds(
    api: CountingApiServer, replicas: Make
) -> None:
    api.put_node(node_json("ex1", gpus=2, mode="exclusive"))
    first = api.put_pod(pod_json("first", gpu_count="1"))
    replica = replicas()
    wait_for(lambda: "default/first" in replica.extender.cache.pods, "the pod")
    assert replica.client.bind(first, "ex1") == ""
    held = json.loads((api.pod("default", "first") or {})["metadata"]["annotations"][PREFIX + "allocation"])
    index = held["devices"][0]["index"]
    # while the update webhook is down, the pod's record is edited to claim the other GPU instead
    edited = json.loads(json.dumps(held))
    edited["devices"][0]["index"] = 1 - index
    edited["devices"][0]["uuid"] = f"ex1-gpu{1 - index}"
    api.patch_pod("default", "first", {"metadata": {"annotations": {PREFIX + "allocation": json.dumps(edited)}}})
    second = api.put_pod(pod_json("second", gpu_count="1"))
    wait_for(lambda: "default/second" in replica.extender.cache.pods, "the second pod")
    # the bind decides against gpuslice's ledger: the GPU the first pod really holds is not given again
    assert replica.client.bind(second, "ex1") == ""
    got = json.loads((api.pod("default", "second") or {})["metadata"]["annotations"][PREFIX + "allocation"])
    assert got["devices"][0]["index"] == 1 - index  # the GPU the edit pretended to take, really free
