"""The Helm chart (charts/gpuslice) against the kustomize base (manifests/): rendered with the real
Helm engine and the real kustomize (tools/render-manifests, a small Go program built here), the
chart's defaults make the base's objects exactly, object by object; each value changes what it
says and nothing else.

The renderer: $GPUSLICE_RENDER_MANIFESTS if set, else built with Go into
.cache/render-manifests/ (again whenever its sources are newer). Marked ``go``: scripts/test.sh
deselects it, saying so in one line, only where no Go toolchain is on PATH (and CI, with
GPUSLICE_E2E_REQUIRED=1, fails there instead); run without Go otherwise, it fails with one line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "gpuslice"
TOOL = REPO / "tools" / "render-manifests"
BUILT = REPO / ".cache" / "render-manifests" / "render-manifests"
pytestmark = pytest.mark.go

BUILD_SECONDS = 1800  # the first build downloads Helm's and kustomize's modules

Key = tuple[str, str, str, str]  # apiVersion, kind, namespace, name


@cache
def renderer() -> Path:
    given = os.environ.get("GPUSLICE_RENDER_MANIFESTS")
    if given:
        return Path(given)
    sources = [*TOOL.glob("*.go"), TOOL / "go.mod", TOOL / "go.sum"]
    if BUILT.exists() and all(BUILT.stat().st_mtime >= s.stat().st_mtime for s in sources if s.exists()):
        return BUILT
    go = shutil.which("go")
    if go is None:
        pytest.fail("Go is needed to build tools/render-manifests (or set GPUSLICE_RENDER_MANIFESTS to a build of it)")
    BUILT.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [go, "build", "-trimpath", "-o", str(BUILT), "."],
        cwd=TOOL,
        capture_output=True,
        text=True,
        timeout=BUILD_SECONDS,
    )
    assert done.returncode == 0, done.stderr
    return BUILT


def render(*args: str) -> dict[Key, dict[str, Any]]:
    done = subprocess.run([str(renderer()), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    objects: dict[Key, dict[str, Any]] = {}
    for obj in yaml.safe_load_all(done.stdout):
        if not obj:
            continue
        meta = obj.get("metadata") or {}
        key = (obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])
        assert key not in objects, f"rendered twice: {key}"
        objects[key] = obj
    return objects


def chart(*values: str) -> dict[Key, dict[str, Any]]:
    return render("helm", str(CHART), *(a for v in values for a in ("--set", v)))


@cache
def base() -> dict[Key, dict[str, Any]]:
    return render("kustomize", str(REPO / "manifests"))


def differences(a: Any, b: Any, path: str = "") -> Iterator[str]:
    """Where ``a`` (the chart's) and ``b`` (the base's) differ, one line per path."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in b:
                yield f"{path}.{k}: only in the chart"
            elif k not in a:
                yield f"{path}.{k}: only in the base"
            else:
                yield from differences(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from differences(x, y, f"{path}[{i}]")
    elif a != b:
        yield f"{path}: chart {a!r} != base {b!r}"


def drift(chart_objects: dict[Key, dict[str, Any]], base_objects: dict[Key, dict[str, Any]]) -> list[str]:
    lines = [
        f"{'/'.join(k)}: only in the base (sync the chart: python charts/gpuslice/sync.py)"
        for k in base_objects.keys() - chart_objects.keys()
    ]
    lines += [f"{'/'.join(k)}: only in the chart" for k in chart_objects.keys() - base_objects.keys()]
    for key in sorted(chart_objects.keys() & base_objects.keys()):
        lines += [f"{'/'.join(key)} {line}" for line in differences(chart_objects[key], base_objects[key])]
    return sorted(lines)


def test_the_charts_defaults_make_the_kustomize_base_object_by_object() -> None:
    made = chart()
    assert len(base()) >= 20  # the base as a whole, not an empty render
    lines = drift(made, base())
    assert not lines, "the chart drifted from manifests/ (python charts/gpuslice/sync.py):\n" + "\n".join(lines)


def find(objects: dict[Key, dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for (_, k, _, n), o in objects.items() if (k, n) == (kind, name))


def test_the_policy_value_sets_the_services_policy() -> None:
    config = find(chart("policy=binpack"), "ConfigMap", "gpuslice-config")
    assert yaml.safe_load(config["data"]["gpuslice.yaml"])["policy"] == {"name": "binpack"}
    assert drift(chart("policy=binpack"), base()) == [
        "v1/ConfigMap/gpuslice/gpuslice-config .data.gpuslice.yaml: chart "
        + repr(config["data"]["gpuslice.yaml"])
        + " != base "
        + repr(find(base(), "ConfigMap", "gpuslice-config")["data"]["gpuslice.yaml"])
    ]


def test_the_webhooks_cover_the_namespaces_listed_and_never_their_own() -> None:
    made = chart("webhook.namespaces={team-a,team-b}")
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in find(made, kind, "gpuslice")["webhooks"]:
            if hook["name"] == "validate-agent-evictions.gpuslice.io":  # the agent's evictions, everywhere
                assert "namespaceSelector" not in hook
                continue
            assert hook["namespaceSelector"]["matchExpressions"] == [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]},
                {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["gpuslice", "kube-system"]},
            ]


def test_tls_from_a_provided_secret_or_from_cert_manager() -> None:
    made = chart("tls.secretName=my-tls", "tls.caBundle=Q0E=")
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        assert {h["clientConfig"].get("caBundle") for h in find(made, kind, "gpuslice")["webhooks"]} == {"Q0E="}
    volumes = find(made, "Deployment", "gpuslice")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "tls", "secret": {"secretName": "my-tls"}} in [
        {"name": v["name"], "secret": {"secretName": v["secret"]["secretName"]}} for v in volumes if "secret" in v
    ]
    assert not any(k[1] == "Certificate" for k in chart())
    managed = chart("tls.certManager=true")
    certificates = {k[3] for k in managed if k[1] == "Certificate"}
    assert certificates == {"gpuslice-ca", "gpuslice-serving-cert"}


def test_the_agent_can_be_left_out() -> None:
    without = chart("agent.enabled=false")
    left_out = {k for k in base() if k not in without}
    assert {(k[1], k[3]) for k in left_out} >= {("DaemonSet", "gpuslice-agent"), ("ServiceAccount", "gpuslice-agent")}
    assert all("agent" in k[3] for k in left_out), left_out


def test_the_documented_helm_install_renders_as_it_says() -> None:
    # docs/deploying.md's `helm install gpuslice charts/gpuslice --set ...`, its values as quoted,
    # rendered by Helm's engine: every --set takes effect
    import shlex

    from tests.docs.reading import blocks, shell_lines

    doc = REPO / "docs" / "deploying.md"
    quoted = [
        shlex.split(line)
        for b in blocks(doc)
        if b.language in ("", "bash", "sh")
        for line in shell_lines(b.text)
        if line.startswith("helm ")
    ]
    assert len(quoted) == 1, quoted
    words = quoted[0]
    assert words[:4] == ["helm", "install", "gpuslice", "charts/gpuslice"], words
    sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
    assert len(sets) == (len(words) - 4) // 2 >= 1, words  # nothing but --set pairs after the chart
    made = chart(*sets)
    values = dict(s.split("=", 1) for s in sets)
    config = find(made, "ConfigMap", "gpuslice-config")
    assert yaml.safe_load(config["data"]["gpuslice.yaml"])["policy"] == {"name": values["policy"]}
    listed = values["webhook.namespaces"].strip("{}").split(",")
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in find(made, kind, "gpuslice")["webhooks"]:
            if "namespaceSelector" in hook:
                first = hook["namespaceSelector"]["matchExpressions"][0]
                assert first == {"key": "kubernetes.io/metadata.name", "operator": "In", "values": listed}
    if values.get("tls.certManager") == "true":
        assert {k[3] for k in made if k[1] == "Certificate"} == {"gpuslice-ca", "gpuslice-serving-cert"}
