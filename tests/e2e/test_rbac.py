"""Row 2: RBAC for real. Each account of the manifests, with a TokenRequest token, may make the
calls its code makes, and the API server forbids what docs/security.md says it cannot do (one
row each)."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

import pytest

from tests.e2e.controlplane import ApiError, Client, ControlPlane, wait_for
from tests.e2e.deployed import put_node
from tests.e2e.nodes import gpu_node

pytestmark = pytest.mark.controlplane

NODE = "e2e-rbac-node"
TENANT = "e2e-rbac-tenant"
POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "victim", "namespace": TENANT},
    "spec": {"containers": [{"name": "main", "image": "registry.example.com/app:1"}]},
}
LEDGER = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "gpuslice-node-x", "namespace": "gpuslice"}}
BINDING = {
    "apiVersion": "v1",
    "kind": "Binding",
    "metadata": {"name": "victim", "namespace": TENANT},
    "target": {"apiVersion": "v1", "kind": "Node", "name": NODE},
}
EVICTION = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "victim", "namespace": TENANT}}
POD_PATH = f"/api/v1/namespaces/{TENANT}/pods/victim"
RECORD = {"metadata": {"annotations": {"gpuslice.io/allocation": '{"gpus": [0]}'}}}

ACCOUNTS = {
    "gpuslice": ("gpuslice", "gpuslice"),
    "agent": ("gpuslice-agent", "gpuslice-agent"),
    "defrag": ("gpuslice", "gpuslice-defrag"),
    "tenant": (TENANT, "tenant"),
}

# (account, what docs/security.md says it cannot do, method, path, body)
FORBIDDEN: list[tuple[str, str, str, str, Any]] = [
    ("gpuslice", "read Secrets", "GET", "/api/v1/namespaces/gpuslice/secrets", None),
    (
        "gpuslice",
        "evict (the defrag job's account evicts, not the service's)",
        "POST",
        f"{POD_PATH}/eviction",
        EVICTION,
    ),
    (
        "gpuslice",
        "write ConfigMaps outside its own namespace",
        "POST",
        f"/api/v1/namespaces/{TENANT}/configmaps",
        {**LEDGER, "metadata": {"name": "gpuslice-node-x", "namespace": TENANT}},
    ),
    ("gpuslice", "change Nodes", "PATCH", f"/api/v1/nodes/{NODE}", {"metadata": {"labels": {"x": "y"}}}),
    # RBAC lets it patch pods; the ValidatingAdmissionPolicy keeps it to their gpuslice.io/ annotations
    ("gpuslice", "change a pod's labels", "PATCH", POD_PATH, {"metadata": {"labels": {"x": "y"}}}),
    ("gpuslice", "change a pod's other annotations", "PATCH", POD_PATH, {"metadata": {"annotations": {"e2e": "1"}}}),
    # RBAC lets it patch Nodes; the policy keeps it to the Node its (pod-bound) token names: this token names none
    (
        "agent",
        "change a Node its token does not name",
        "PATCH",
        f"/api/v1/nodes/{NODE}",
        {"metadata": {"annotations": {"gpuslice.io/inventory": "[]"}}},
    ),
    ("agent", "write pods or records", "PATCH", POD_PATH, RECORD),
    ("agent", "bind", "POST", f"{POD_PATH}/binding", BINDING),
    ("agent", "read Secrets", "GET", "/api/v1/namespaces/gpuslice/secrets", None),
    ("agent", "write the ledgers", "POST", "/api/v1/namespaces/gpuslice/configmaps", LEDGER),
    ("defrag", "write pods or records", "PATCH", POD_PATH, RECORD),
    ("defrag", "write the ledgers", "POST", "/api/v1/namespaces/gpuslice/configmaps", LEDGER),
    ("defrag", "bind", "POST", f"{POD_PATH}/binding", BINDING),
    ("defrag", "delete pods outright", "DELETE", POD_PATH, None),
    ("tenant", "write the ledgers", "POST", "/api/v1/namespaces/gpuslice/configmaps", LEDGER),
]

# (account, a call its code makes, method, path, body)
ALLOWED: list[tuple[str, str, str, str, Any]] = [
    ("gpuslice", "list nodes", "GET", "/api/v1/nodes", None),
    ("gpuslice", "list pods", "GET", "/api/v1/pods", None),
    (
        "gpuslice",
        "patch pods (the records)",
        "PATCH",
        POD_PATH,
        {"metadata": {"annotations": {"gpuslice.io/e2e": "1"}}},
    ),
    ("gpuslice", "list the ledgers", "GET", "/api/v1/namespaces/gpuslice/configmaps", None),
    (  # a watch of nothing (no such label), ended by the server after a second
        "gpuslice",
        "watch the ledgers",
        "GET",
        "/api/v1/namespaces/gpuslice/configmaps?watch=true&timeoutSeconds=1&labelSelector=e2e-rbac%3Dnone",
        None,
    ),
    ("agent", "get its node", "GET", f"/api/v1/nodes/{NODE}", None),
    ("agent", "list the pods of its node", "GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}", None),
    ("defrag", "list nodes", "GET", "/api/v1/nodes", None),
    ("defrag", "list pods", "GET", "/api/v1/pods", None),
    ("defrag", "list the ledgers", "GET", "/api/v1/namespaces/gpuslice/configmaps", None),
]


@pytest.fixture(scope="module")
def clients(control_plane: ControlPlane, applied: list[dict[str, Any]]) -> dict[str, Client]:
    admin = control_plane.client()
    admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TENANT}})
    admin.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "tenant", "namespace": TENANT}})
    admin.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "tenant-edit", "namespace": TENANT},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
            "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": TENANT}],
        }
    )
    node = gpu_node(NODE)
    node["spec"]["taints"].append({"key": "e2e-rbac", "value": "yes", "effect": "NoSchedule"})  # no pod lands here
    put_node(admin, node)
    admin.post(f"/api/v1/namespaces/{TENANT}/pods", POD)
    clients = {name: control_plane.client(admin.account_token(ns, account)) for name, (ns, account) in ACCOUNTS.items()}
    # The API server enforces a ValidatingAdmissionPolicy only once its informer has loaded it (about a
    # second after the manifests were applied): wait until both accounts' policies refuse a dry run.
    for name, path, body in (
        ("gpuslice", POD_PATH, {"metadata": {"labels": {"x": "y"}}}),
        ("agent", f"/api/v1/nodes/{NODE}", {"metadata": {"annotations": {"gpuslice.io/inventory": "[]"}}}),
    ):
        wait_for(f"the admission policy on {name}'s account", lambda n=name, p=path, b=body: refused(clients[n], p, b))
    return clients


def refused(client: Client, path: str, body: Any) -> bool:
    """Whether the API server refuses ``body`` as a dry-run merge patch of ``path``."""
    try:
        client.request("PATCH", path, body, "application/merge-patch+json", dryRun="All")
    except ApiError as error:
        assert error.status == 403, error.body
        return True
    return False


def call(client: Client, method: str, path: str, body: Any) -> Any:
    content_type = "application/merge-patch+json" if method == "PATCH" else "application/json"
    if "?" in path:
        path, query = path.split("?", 1)
        return client.request(method, path, body, content_type, **dict(parse_qsl(query)))
    return client.request(method, path, body, content_type)


@pytest.mark.parametrize(
    ("account", "cannot", "method", "path", "body"), FORBIDDEN, ids=[f"{r[0]}: {r[1]}" for r in FORBIDDEN]
)
def test_the_api_server_forbids_what_the_account_must_not_do(
    clients: dict[str, Client], account: str, cannot: str, method: str, path: str, body: Any
) -> None:
    with pytest.raises(ApiError) as refused:
        call(clients[account], method, path, body)
    assert refused.value.status == 403, (cannot, refused.value.body)


@pytest.mark.parametrize(
    ("account", "can", "method", "path", "body"), ALLOWED, ids=[f"{r[0]}: {r[1]}" for r in ALLOWED]
)
def test_the_account_may_make_the_calls_its_code_makes(
    clients: dict[str, Client], account: str, can: str, method: str, path: str, body: Any
) -> None:
    call(clients[account], method, path, body)
