"""The client seam: the exact API surface, error wrapping, configuration."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from scheduler.backend import Kind, PodRef
from scheduler.core.errors import ConfigError, GpusliceError
from scheduler.kube import (
    API_CALLS,
    ApiProtocolError,
    ApiStatusError,
    ApiUnavailableError,
    ConflictError,
    GoneError,
    KubeApi,
    KubeBackend,
    KubeConfigError,
    KubeError,
    NotFoundError,
)
from scheduler.kube.ledger import ledger_name
from tests.fakes import FakeApiServer
from tests.kube.conftest import Recorder, decide_for, gpu_node, gpu_pod, gpu_quota, wait_until

Make = Callable[..., KubeBackend]


def test_the_api_surface_is_exactly_these_calls() -> None:
    # The ClusterRole is built from this set: a change here is a change of permissions.
    expected = {
        ("list", "", "nodes"),
        ("watch", "", "nodes"),
        ("list", "", "pods"),
        ("watch", "", "pods"),
        ("get", "", "pods"),
        ("patch", "", "pods"),
        ("create", "", "pods/binding"),
        ("create", "", "events"),  # a Warning on a node whose inventory cannot be read
        ("get", "", "configmaps"),
        ("list", "", "configmaps"),  # the sweep of what interrupted binds left
        ("watch", "", "configmaps"),  # the node ledgers, followed: what gpuslice itself bound
        ("create", "", "configmaps"),
        ("update", "", "configmaps"),
        ("list", "gpuslice.io", "gpuquotas"),  # GPU quotas, followed
        ("watch", "gpuslice.io", "gpuquotas"),
        ("patch", "gpuslice.io", "gpuquotas/status"),  # their status kept current
    }
    assert expected == API_CALLS


def test_every_declared_call_is_made_and_no_other(apiserver: FakeApiServer, make_backend: Make) -> None:
    # The apiserver fixture checks in every test that what was served is declared; this scenario
    # touches every code path that makes a call, so the declared set is not larger than needed.
    node = apiserver.put_node(gpu_node("n1"))
    for name in ("a", "b", "c"):
        body = gpu_pod(name)
        if name == "b":  # an annotation of ours its record does not set: removed by a patch before the Binding
            body["metadata"]["annotations"]["gpuslice.io/bound-at"] = "2024-01-01T00:00:00Z"
        apiserver.put_pod(body)
    backend = make_backend()
    apiserver.put_quota(gpu_quota("default"))
    backend.start(Recorder())
    wait_until(lambda: apiserver.open_watches() == 4, "the four watches (node ledgers too)")
    for name in ("a", "b"):
        live = apiserver.pod("default", name)
        assert live is not None
        assert backend.bind(PodRef("default", name, f"uid-{name}"), "n1", decide_for(node, live)).error == ""
    apiserver.fault("create", "pods/binding", status=409)
    live = apiserver.pod("default", "c")
    assert live is not None
    assert "rolled back" in backend.bind(PodRef("default", "c", "uid-c"), "n1", decide_for(node, live)).error
    backend.sweep()
    backend.node_event("n1", "GpusliceInvalidInventory", "bad inventory")
    wait_until(lambda: len(apiserver.events()) == 1, "the event")
    backend.quota_status("default", "q", {"overQuota": False})
    assert apiserver.served == {(verb, resource) for verb, _, resource in API_CALLS}


def test_a_call_missing_from_api_calls_cannot_be_made() -> None:
    api = KubeApi.from_url("http://127.0.0.1:1")
    with pytest.raises(AssertionError, match="API call delete pods is missing from API_CALLS"):
        api._raw("delete", "pods", lambda **_: None)


@pytest.mark.parametrize(
    ("status", "error"),
    [(404, NotFoundError), (409, ConflictError), (410, GoneError), (403, ApiStatusError), (500, ApiStatusError)],
)
def test_status_answers_become_the_projects_errors(
    apiserver: FakeApiServer, status: int, error: type[KubeError]
) -> None:
    api = KubeApi.from_url(apiserver.url, request_timeout_s=1)
    apiserver.put_pod(gpu_pod("a"))
    apiserver.fault("get", "pods", status=status, message="said the server")
    with pytest.raises(error) as caught:
        api.get_pod("default", "a")
    exc = caught.value
    assert type(exc) is error and isinstance(exc, GpusliceError)
    assert isinstance(exc, ApiStatusError) and exc.status == status
    assert str(exc).startswith(f"get pods: HTTP {status} ") and str(exc).endswith(": said the server")
    assert exc.__cause__ is not None and type(exc.__cause__).__module__.startswith("kubernetes")


def test_no_answer_is_unavailable_and_names_the_call() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    api = KubeApi.from_url(f"http://127.0.0.1:{port}", request_timeout_s=0.5)
    with pytest.raises(ApiUnavailableError, match=r"^list nodes: NewConnectionError") as caught:
        api.list("nodes")
    assert type(caught.value.__cause__).__module__.startswith("urllib3")


def test_a_slow_answer_times_out(apiserver: FakeApiServer) -> None:
    api = KubeApi.from_url(apiserver.url, request_timeout_s=0.3)
    apiserver.fault("list", "nodes", status=None, delay_s=1.0)
    with pytest.raises(ApiUnavailableError, match="Read timed out"):
        api.list("nodes")


@pytest.mark.parametrize("body", ["not json", "[1, 2]"])
def test_a_garbled_answer_is_a_protocol_error(apiserver: FakeApiServer, body: str) -> None:
    api = KubeApi.from_url(apiserver.url, request_timeout_s=1)
    apiserver.fault("get", "configmaps", status=200, body=body)
    with pytest.raises(ApiProtocolError, match=r"^get configmaps: response is not"):
        api.get_configmap("gpuslice", "x")


def test_a_bearer_token_is_sent(apiserver: FakeApiServer) -> None:
    KubeApi.from_url(apiserver.url, token="s3cret").list("nodes")
    assert apiserver.authorizations == {"Bearer s3cret"}


def test_a_kubeconfig_is_followed(apiserver: FakeApiServer, tmp_path: Path) -> None:
    apiserver.put_node(gpu_node("from-kubeconfig"))
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "fake",
                "clusters": [{"name": "fake", "cluster": {"server": apiserver.url}}],
                "users": [{"name": "u", "user": {"token": "kc-token"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}],
            }
        )
    )
    backend = KubeBackend.from_config(kubeconfig=str(path), prefix="example.com/", request_timeout_s=1)
    recorder = Recorder()
    backend.start(recorder)
    backend.stop()
    assert recorder.keys(Kind.NODE) == {"from-kubeconfig"}
    assert backend.options.prefix == "example.com/"
    assert apiserver.authorizations == {"Bearer kc-token"}


def test_configuration_errors_name_what_is_wrong(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(KubeConfigError, match=r"cannot load .*missing.*"):
        KubeBackend.from_kubeconfig(str(tmp_path / "missing"))
    with pytest.raises(KubeConfigError, match=r"must start with http:// or https://"):
        KubeBackend.from_url("127.0.0.1:6443")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeConfigError, match="no in-cluster service account configuration"):
        KubeBackend.in_cluster()
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")  # inside a pod, but without its token
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(KubeConfigError, match="no in-cluster service account configuration"):
        KubeBackend.from_environment()
    with pytest.raises(ConfigError, match=r"^kube.namespce: unknown option; accepted: .*namespace"):
        KubeBackend.from_url("http://127.0.0.1:1", namespce="x")
    with pytest.raises(ConfigError, match=r"^kube.conflict_retries: must be a positive number, got 0"):
        KubeBackend.from_url("http://127.0.0.1:1", conflict_retries=0)
    with pytest.raises(ConfigError, match=r"^kube.prefix: 'gpuslice.io' must be a DNS subdomain followed by '/'"):
        KubeBackend.from_url("http://127.0.0.1:1", prefix="gpuslice.io")


def test_ledger_names_are_valid_object_names() -> None:
    assert ledger_name("gpu-node-1") == "gpuslice-node-gpu-node-1"
    long = "n" * 253
    name = ledger_name(long)
    assert len(name) <= 253 and name != ledger_name("n" * 252)
    assert name.startswith("gpuslice-node-n") and name[-13] == "-"
