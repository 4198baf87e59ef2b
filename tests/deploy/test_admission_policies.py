"""What RBAC cannot say, ValidatingAdmissionPolicies make the API server enforce: the node agent
changes only its own Node (named by its token), and only gpuslice.io/ annotations on it; the
extender changes only gpuslice.io/ annotations of pods, never their spec. (The real control plane
tier runs these policies; here their shape and their aim are checked.)"""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.manifests import documents, find
from tests.deploy.test_rbac import account

NODE_NAME_CLAIM = "authentication.kubernetes.io/node-name"


def policy(name: str) -> dict[str, Any]:
    found = find("ValidatingAdmissionPolicy", name)
    (binding,) = [
        d.obj
        for d in documents()
        if d.kind == "ValidatingAdmissionPolicyBinding" and d.obj["spec"]["policyName"] == name
    ]
    assert binding["spec"]["validationActions"] == ["Deny"], "a policy that only warns protects nothing"
    assert found["spec"]["failurePolicy"] == "Fail"
    return found


def matched(spec: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (op, r)
        for rule in spec["matchConstraints"]["resourceRules"]
        for op in rule["operations"]
        for r in rule["resources"]
    }


def text(spec: dict[str, Any]) -> str:
    parts = [c["expression"] for c in spec.get("matchConditions", [])]
    parts += [v["expression"] for v in spec.get("variables", [])]
    parts += [v["expression"] for v in spec["validations"]]
    return "\n".join(parts)


def test_the_agent_may_change_only_its_own_node_named_by_its_token() -> None:
    spec = policy("gpuslice-agent-own-node")["spec"]
    assert matched(spec) == {("UPDATE", "nodes")}  # PATCH reaches admission as UPDATE
    agent = account("gpuslice-agent")
    condition = spec["matchConditions"][0]["expression"]
    assert f":{agent['name']}'" in condition and "system:serviceaccount:" in condition
    rules = text(spec)
    assert NODE_NAME_CLAIM in rules and "object.metadata.name in variables.nodeNames" in rules
    assert "object.spec == oldObject.spec" in rules
    assert "startsWith('gpuslice.io/')" in rules


def test_the_extender_may_change_only_gpuslice_annotations_of_pods() -> None:
    spec = policy("gpuslice-extender-annotations-only")["spec"]
    assert matched(spec) == {("UPDATE", "pods")}  # not pods/binding nor pods/status
    extender = account("gpuslice")
    condition = spec["matchConditions"][0]["expression"]
    assert (
        condition == f"request.userInfo.username == 'system:serviceaccount:{extender['namespace']}:{extender['name']}'"
    )
    rules = text(spec)
    assert "object.spec == oldObject.spec" in rules and "startsWith('gpuslice.io/')" in rules


@pytest.mark.parametrize("name", ["gpuslice-agent-own-node", "gpuslice-extender-annotations-only"])
def test_the_policies_are_applied_with_the_manifests(name: str) -> None:
    import yaml

    from tests.deploy.manifests import MANIFESTS

    listed = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["resources"]
    files = {d.path.name for d in documents() if d.name == name}
    assert files and files <= set(listed)
