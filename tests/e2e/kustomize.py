"""Render a kustomization the way `kubectl apply -k` does, for the fields gpuslice's
kustomizations use (resources, labels, images, namespace; tests/deploy checks no other field
appears). Anything else is refused with the field's name rather than silently dropped."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

FIELDS = {"apiVersion", "kind", "namespace", "resources", "labels", "images"}
# Kinds of the manifests that have no namespace.
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
    "Node",
    "PriorityClass",
}

# kustomize's output order (its "legacy" sort, the default of `kubectl apply -k`): these kinds
# first, in this order, the webhook configurations last, every other kind in between; ties keep
# the order of the resources.
FIRST = (
    "Namespace",
    "ResourceQuota",
    "StorageClass",
    "CustomResourceDefinition",
    "ServiceAccount",
    "PodSecurityPolicy",
    "Role",
    "ClusterRole",
    "RoleBinding",
    "ClusterRoleBinding",
    "ConfigMap",
    "Secret",
    "Endpoints",
    "Service",
    "LimitRange",
    "PriorityClass",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "Deployment",
    "StatefulSet",
    "CronJob",
    "PodDisruptionBudget",
)
LAST = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


def rank(kind: str) -> int:
    if kind in FIRST:
        return FIRST.index(kind)
    if kind in LAST:
        return len(FIRST) + 1 + LAST.index(kind)
    return len(FIRST)


def render(root: Path) -> list[dict[str, Any]]:
    """The objects ``root/kustomization.yaml`` makes, in the order kustomize gives them."""
    kustomization = yaml.safe_load((root / "kustomization.yaml").read_text(encoding="utf-8"))
    unknown = set(kustomization) - FIELDS
    if unknown:
        raise ValueError(
            f"{root}/kustomization.yaml: fields {sorted(unknown)} are not rendered; known: {sorted(FIELDS)}"
        )
    objects: list[dict[str, Any]] = []
    for resource in kustomization.get("resources", []):
        with (root / resource).open(encoding="utf-8") as handle:
            objects.extend(copy.deepcopy(doc) for doc in yaml.safe_load_all(handle) if doc)
    namespace = kustomization.get("namespace")
    for obj in objects:
        meta = obj.setdefault("metadata", {})
        if namespace and obj["kind"] not in CLUSTER_SCOPED:
            meta["namespace"] = namespace
        for entry in kustomization.get("labels", []):
            if entry.get("includeSelectors") or entry.get("includeTemplates"):
                raise ValueError(
                    f"{root}/kustomization.yaml: labels with includeSelectors/includeTemplates are not rendered"
                )
            meta.setdefault("labels", {}).update(entry["pairs"])
        for container in containers(obj):
            for image in kustomization.get("images", []):
                set_image(container, image)
    return sorted(objects, key=lambda obj: rank(obj["kind"]))


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj.get("spec") or {}
    while "jobTemplate" in spec:  # CronJob
        spec = spec["jobTemplate"].get("spec") or {}
    pod = (spec.get("template") or {}).get("spec") or (spec if obj.get("kind") == "Pod" else {})
    return [*pod.get("initContainers", []), *pod.get("containers", [])]


def image_name(reference: str) -> str:
    """The repository part of an image reference: no tag, no digest."""
    reference = reference.partition("@")[0]
    slash = reference.rfind("/")
    colon = reference.rfind(":")
    return reference[:colon] if colon > slash else reference


def set_image(container: dict[str, Any], image: dict[str, str]) -> None:
    name = image_name(container["image"])
    if name != image["name"]:
        return
    new = image.get("newName", name)
    if "digest" in image:
        container["image"] = f"{new}@{image['digest']}"
    else:
        container["image"] = f"{new}:{image['newTag']}" if "newTag" in image else new
