"""The RBAC rules grant exactly what gpuslice's code calls, plus what the bundled kube-scheduler needs.

gpuslice's calls come from ``scheduler.kube.API_CALLS`` (each call site in scheduler/kube checks
itself against it), so a new API call without its rule, or a rule no call needs, fails here.
"""

from __future__ import annotations

from typing import Any

from tests.deploy.manifests import documents, find

Triple = tuple[str, str, str]


def expand(rules: list[dict[str, Any]]) -> list[Triple]:
    """Every (verb, apiGroup, resource) a list of rules grants; wildcards are not allowed."""
    out = []
    for rule in rules:
        for part in ("verbs", "apiGroups", "resources"):
            assert "*" not in rule[part], f"wildcard in {part}: {rule}"
        out.extend((v, g, r) for v in rule["verbs"] for g in rule["apiGroups"] for r in rule["resources"])
    return out


ACCOUNTS = ("gpuslice", "gpuslice-agent", "gpuslice-defrag")  # the service's, the node agent's, the defrag job's


def account(name: str = "gpuslice") -> dict[str, str]:
    sa = find("ServiceAccount", name)
    return {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": sa["metadata"]["namespace"]}


def bound_roles(name: str = "gpuslice") -> dict[tuple[str, str, str], dict[str, Any]]:
    """(binding kind, binding namespace, role name) -> roleRef, for every binding of one account;
    every binding has exactly one subject, one of the two accounts."""
    out = {}
    for doc in documents():
        if doc.kind in ("ClusterRoleBinding", "RoleBinding"):
            assert doc.obj["subjects"] in [[account(a)] for a in ACCOUNTS], doc.where
            if doc.obj["subjects"] != [account(name)]:
                continue
            namespace = doc.obj["metadata"].get("namespace", "")
            out[(doc.kind, namespace, doc.obj["roleRef"]["name"])] = doc.obj["roleRef"]
    return out


def test_gpuslice_roles_grant_exactly_its_api_calls() -> None:
    from scheduler.kube import API_CALLS

    namespace = account()["namespace"]
    cluster = expand(find("ClusterRole", "gpuslice")["rules"])
    local = expand(find("Role", "gpuslice", namespace=namespace)["rules"])
    granted = cluster + local
    assert len(granted) == len(set(granted)), "a permission is granted twice"
    assert set(granted) == set(API_CALLS)
    # the ledger ConfigMaps are written only in gpuslice's namespace
    assert {r for _, _, r in local} == {"configmaps"}
    assert all(rule.get("resourceNames") is None for rule in find("ClusterRole", "gpuslice")["rules"])
    roles = bound_roles()
    assert roles[("ClusterRoleBinding", "", "gpuslice")]["kind"] == "ClusterRole"
    assert roles[("RoleBinding", namespace, "gpuslice")]["kind"] == "Role"


def test_the_kube_scheduler_gets_its_builtin_roles() -> None:
    roles = bound_roles()
    for builtin in ("system:kube-scheduler", "system:volume-scheduler"):
        assert roles[("ClusterRoleBinding", "", builtin)]["kind"] == "ClusterRole"
    ref = roles[("RoleBinding", "kube-system", "extension-apiserver-authentication-reader")]
    assert ref["kind"] == "Role"


def test_the_leader_election_lease_and_nothing_more() -> None:
    import yaml

    config = yaml.safe_load(find("ConfigMap", "gpuslice-config")["data"]["scheduler-config.yaml"])
    election = config["leaderElection"]
    role = find("Role", "gpuslice-scheduler-leader-election", namespace=election["resourceNamespace"])
    by_name = {tuple(r.get("resourceNames") or ()): sorted(expand([r])) for r in role["rules"]}
    assert by_name == {
        (): [("create", "coordination.k8s.io", "leases")],
        (election["resourceName"],): [
            ("get", "coordination.k8s.io", "leases"),
            ("update", "coordination.k8s.io", "leases"),
        ],
    }
    assert ("RoleBinding", election["resourceNamespace"], role["metadata"]["name"]) in bound_roles()


def test_no_other_roles() -> None:
    defined = {(d.kind, d.name) for d in documents() if d.kind in ("ClusterRole", "Role")}
    assert defined == {
        ("ClusterRole", "gpuslice"),
        ("Role", "gpuslice"),
        ("Role", "gpuslice-scheduler-leader-election"),
        ("ClusterRole", "gpuslice-agent"),
        ("Role", "gpuslice-agent-ledgers"),
        ("ClusterRole", "gpuslice-defrag"),
        ("Role", "gpuslice-defrag-ledgers"),
    }
    assert set(bound_roles()) == {
        ("ClusterRoleBinding", "", "gpuslice"),
        ("RoleBinding", "gpuslice", "gpuslice"),
        ("ClusterRoleBinding", "", "system:kube-scheduler"),
        ("ClusterRoleBinding", "", "system:volume-scheduler"),
        ("RoleBinding", "gpuslice", "gpuslice-scheduler-leader-election"),
        ("RoleBinding", "kube-system", "extension-apiserver-authentication-reader"),
    }


def test_the_ledgers_live_where_the_role_lets_gpuslice_write_them() -> None:
    from scheduler.kube.options import KubeOptions

    role = find("Role", "gpuslice", namespace=KubeOptions().namespace)
    assert {r for _, _, r in expand(role["rules"])} == {"configmaps"}


def test_the_agent_role_grants_exactly_the_calls_of_the_node_api() -> None:
    from scheduler.kube.api import AGENT_API_CALLS
    from scheduler.kube.options import KubeOptions

    cluster = expand(find("ClusterRole", "gpuslice-agent")["rules"])
    # the ledgers: read only, and only in gpuslice's namespace
    ledgers = expand(find("Role", "gpuslice-agent-ledgers", namespace=KubeOptions().namespace)["rules"])
    assert ledgers == [("get", "", "configmaps")]
    granted = cluster + ledgers
    assert len(granted) == len(set(granted))
    assert set(granted) == set(AGENT_API_CALLS)
    assert bound_roles("gpuslice-agent") == {
        ("ClusterRoleBinding", "", "gpuslice-agent"): {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "gpuslice-agent",
        },
        ("RoleBinding", KubeOptions().namespace, "gpuslice-agent-ledgers"): {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "gpuslice-agent-ledgers",
        },
    }
    daemonset = find("DaemonSet", "gpuslice-agent")
    assert daemonset["spec"]["template"]["spec"]["serviceAccountName"] == "gpuslice-agent"


def test_the_defrag_account_may_evict_and_exactly_as_its_code_does() -> None:
    from scheduler.kube import API_CALLS, DEFRAG_API_CALLS
    from scheduler.kube.options import KubeOptions

    # the ledgers: listed, and only in gpuslice's namespace
    ledgers = expand(find("Role", "gpuslice-defrag-ledgers", namespace=KubeOptions().namespace)["rules"])
    assert ledgers == [("list", "", "configmaps")]
    granted = expand(find("ClusterRole", "gpuslice-defrag")["rules"]) + ledgers
    assert len(granted) == len(set(granted))
    assert set(granted) == set(DEFRAG_API_CALLS)
    assert ("create", "", "pods/eviction") in DEFRAG_API_CALLS
    assert ("create", "", "pods/eviction") not in API_CALLS  # the always-on service cannot evict
    assert bound_roles("gpuslice-defrag") == {
        ("ClusterRoleBinding", "", "gpuslice-defrag"): {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "gpuslice-defrag",
        },
        ("RoleBinding", KubeOptions().namespace, "gpuslice-defrag-ledgers"): {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "gpuslice-defrag-ledgers",
        },
    }
    job = find("CronJob", "gpuslice-defrag")["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert job["serviceAccountName"] == "gpuslice-defrag"
