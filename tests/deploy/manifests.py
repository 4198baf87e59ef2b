"""Loading manifests/ for the tests: every YAML document, by file, kind and name."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"


@dataclass(frozen=True)
class Doc:
    path: Path
    index: int
    obj: dict[str, Any]

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}#{self.index}"

    @property
    def kind(self) -> str:
        return str(self.obj.get("kind"))

    @property
    def name(self) -> str:
        return str((self.obj.get("metadata") or {}).get("name"))


def yaml_files(root: Path = MANIFESTS) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.suffix in (".yaml", ".yml"))


@cache
def _load(path: Path) -> tuple[Any, ...]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with path.open(encoding="utf-8") as handle:
        return tuple(yaml.load_all(handle, Loader=loader))


def documents(root: Path = MANIFESTS) -> Iterator[Doc]:
    """Every non-empty YAML document under ``root``, as a fresh copy (tests may change it)."""
    for path in yaml_files(root):
        for i, obj in enumerate(_load(path)):
            if obj is not None:
                yield Doc(path, i, copy.deepcopy(obj))


def find(kind: str, name: str, root: Path = MANIFESTS, namespace: str | None = None) -> dict[str, Any]:
    found = [
        d.obj
        for d in documents(root)
        if d.kind == kind and d.name == name and (namespace is None or d.obj["metadata"].get("namespace") == namespace)
    ]
    assert len(found) == 1, f"expected one {kind} {name} under {root}, found {len(found)}"
    return found[0]


def container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    matches = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    assert len(matches) == 1, name
    return matches[0]
