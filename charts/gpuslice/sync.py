"""Write the chart's templates from the kustomize base (manifests/), with the values put in.

    python charts/gpuslice/sync.py

The chart is the base, object for object (tests/deploy/test_chart.py renders both with real Helm
and kustomize and compares them): run this after a change of manifests/, then the test. What the
values change is applied here, in one place:

* every object gets the base's common label (app.kubernetes.io/part-of: gpuslice);
* ``image.repository``/``image.tag``: the gpuslice image of every container that runs it;
* ``policy``: ``policy.name`` in gpuslice.yaml;
* ``webhook.namespaces`` / ``webhook.namespaceLabel``: the webhooks' namespaceSelector;
* ``tls.secretName``, ``tls.caBundle``, ``tls.certManager``: the serving certificate's Secret, the
  webhooks' caBundle (a provided CA), cert-manager's Issuers and Certificates (manifests/cert-manager);
* ``agent.enabled``: the node agent's objects (manifests/agent.yaml).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
MANIFESTS = HERE.parents[1] / "manifests"
IMAGE = "registry.example.com/gpuslice:0.1.0"
PART_OF = {"app.kubernetes.io/part-of": "gpuslice"}
SELECTOR = "__NAMESPACE_SELECTOR__"
CA_BUNDLE = "__CA_BUNDLE__"
SECRET = "__TLS_SECRET__"
HEADER = "# Made from manifests/{name} by charts/gpuslice/sync.py: edit the manifest, then run it again.\n"


class Literal(str):
    """A string written as a YAML block (``|``), as the manifests write their embedded files."""


def _literal(dumper: yaml.SafeDumper, value: Literal) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")


yaml.SafeDumper.add_representer(Literal, _literal)


def blocks(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: blocks(v) for k, v in value.items()}
    if isinstance(value, list):
        return [blocks(v) for v in value]
    if isinstance(value, str) and "\n" in value:
        return Literal(value)
    return value


def with_values(obj: dict[str, Any], labelled: bool) -> dict[str, Any]:
    if labelled:
        meta = obj.setdefault("metadata", {})
        meta["labels"] = {**(meta.get("labels") or {}), **PART_OF}
    kind = obj.get("kind")
    if kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in obj["webhooks"]:
            if "namespaceSelector" in hook:  # the agent's evictions are checked in every namespace
                hook["namespaceSelector"] = SELECTOR
            hook["clientConfig"]["caBundle"] = CA_BUNDLE
    for volume in _volumes(obj):
        secret = volume.get("secret")
        if secret and secret.get("secretName") == "gpuslice-webhook-tls":
            secret["secretName"] = SECRET
    return obj


def _volumes(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj.get("spec") or {}
    template = (spec.get("jobTemplate") or {}).get("spec", {}).get("template") or spec.get("template") or {}
    volumes: list[dict[str, Any]] = (template.get("spec") or {}).get("volumes") or []
    return volumes


def text_of(path: Path, labelled: bool) -> str:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    body = "---\n".join(
        yaml.safe_dump(blocks(with_values(d, labelled)), sort_keys=False, width=1000) for d in docs
    )
    body = body.replace(IMAGE, "{{ .Values.image.repository }}:{{ .Values.image.tag }}")
    body = re.sub(
        rf"^( *)namespaceSelector: {SELECTOR}$",
        lambda m: f'{m[1]}namespaceSelector:{{{{- include "gpuslice.namespaceSelector" . | nindent {len(m[1]) + 2} }}}}',
        body,
        flags=re.M,
    )
    body = re.sub(
        rf"^( *)caBundle: {CA_BUNDLE}\n",
        lambda m: f"{m[1]}{{{{- with .Values.tls.caBundle }}}}\n{m[1]}caBundle: {{{{ . }}}}\n{m[1]}{{{{- end }}}}\n",
        body,
        flags=re.M,
    )
    body = body.replace(f"secretName: {SECRET}", "secretName: {{ .Values.tls.secretName }}")
    body = body.replace("\n    policy:\n      name: fgd-reserve\n", "\n    policy:\n      name: {{ .Values.policy }}\n")
    return HEADER.format(name=path.relative_to(MANIFESTS)) + body


def main() -> None:
    out = HERE / "templates"
    out.mkdir(exist_ok=True)
    resources = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["resources"]
    for name in resources:
        text = text_of(MANIFESTS / name, labelled=True)
        if name == "agent.yaml":
            text = "{{- if .Values.agent.enabled }}\n" + text + "{{- end }}\n"
        (out / name).write_text(text)
    certificate = text_of(MANIFESTS / "cert-manager" / "certificate.yaml", labelled=False)
    (out / "cert-manager.yaml").write_text("{{- if .Values.tls.certManager }}\n" + certificate + "{{- end }}\n")


if __name__ == "__main__":
    main()
