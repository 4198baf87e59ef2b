"""FileBackend: reading a v1 List, errors that name the place, binds under the Decide contract."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from scheduler.backend import Change, Kind, PodRef
from scheduler.core.allocation import Allocation, DeviceShare, decode_record
from scheduler.core.inventory import SharingMode
from scheduler.filebackend import ClusterFileError, FileBackend, example_path

from .kit import PREFIX, cluster_file, k8s_node, k8s_pod


def alloc(node: str, index: int = 0, memory: int = 1024) -> Allocation:
    return Allocation(node, (DeviceShare(f"{node}-gpu{index}", index, SharingMode.MPS, memory, 100),), 1000, 1024)


@pytest.fixture
def backend(tmp_path: Path) -> FileBackend:
    path = cluster_file(tmp_path / "c.json", k8s_node("n1", gpus=2), k8s_pod("p1"), k8s_pod("p2"))
    fb = FileBackend(path, clock=lambda: "2025-01-01T00:00:00Z")
    fb.start(lambda change: None)
    return fb


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[1, 2]", "must be a Kubernetes v1 List"),
        ('{"kind": "Deployment", "items": []}', "kind must be one of List, NodeList, PodList, got 'Deployment'"),
        ('{"kind": "List", "items": {}}', "'items' must be a list"),
        ('{"kind": "List", "items": [3]}', "items[0]: must be an object"),
        ('{"kind": "List", "items": [{"kind": "Node", "metadata": {}}]}', "items[0]: metadata.name"),
        (
            '{"kind": "List", "items": [{"kind": "Pod", "metadata": {"name": "p", "annotations": {"a": 1}}}]}',
            "items[0] (Pod p): metadata.annotations must map names to strings",
        ),
        (
            '{"kind": "List", "items": [{"kind": "Pod", "metadata": {"name": "p"}, "spec": {"nodeName": 3}}]}',
            "items[0] (Pod p): spec.nodeName must be a string",
        ),
        (
            '{"kind": "List", "items": [{"kind": "Node", "metadata": {"name": "a"}}, '
            '{"kind": "Node", "metadata": {"name": "a"}}]}',
            "items[1] (Node a): a second Node named 'a'",
        ),
        ("kind: List\nitems: [\n", "neither JSON nor YAML"),
    ],
)
def test_file_errors_name_file_item_and_field(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ClusterFileError) as info:
        FileBackend(path)
    assert str(info.value).startswith(str(path)) and expected in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ClusterFileError, match="cannot read"):
        FileBackend(tmp_path / "nope.yaml")


def test_example_file_loads_and_reports_everything() -> None:
    seen: list[Change] = []
    fb = FileBackend(example_path())
    fb.start(seen.append)
    assert fb.ready()
    kinds = [c.kind for c in seen]
    assert kinds.count(Kind.NODE) == 6 and kinds.count(Kind.POD) == 13 and kinds.count(Kind.QUOTA) == 1
    last_node = max(i for i, k in enumerate(kinds) if k is Kind.NODE)
    assert last_node < kinds.index(Kind.POD)  # nodes first


def test_yaml_and_other_kinds(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "apiVersion: v1\nkind: List\nitems:\n- kind: Service\n  metadata: {name: s}\n"
        "- kind: Node\n  metadata: {name: n}\n"
    )
    fb = FileBackend(path)
    assert list(fb.nodes()) == ["n"] and fb.pods() == {}


def test_bind_decides_on_the_node_records_and_writes_annotations(backend: FileBackend) -> None:
    seen: list[Any] = []

    def decide(records: Any) -> Allocation | str:
        seen.append(list(records))
        return alloc("n1")

    result = backend.bind(PodRef("default", "p1", "uid-default-p1"), "n1", decide)
    assert result.allocation == alloc("n1") and seen == [[]]
    pod = backend.pods()["default/p1"]
    annotations = pod["metadata"]["annotations"]
    assert pod["spec"]["nodeName"] == "n1"
    assert annotations[PREFIX + "bind-phase"] == "bound"
    assert annotations[PREFIX + "visible-devices"] == "n1-gpu0"
    assert decode_record(annotations[PREFIX + "allocation"], "p1") == alloc("n1")

    # the next bind on n1 sees p1's record; a repeated bind returns p1's allocation without deciding
    backend.bind(PodRef("default", "p2", ""), "n1", decide)
    assert [k for k, _ in seen[1]] == ["default/p1"]
    again = backend.bind(PodRef("default", "p1", "uid-default-p1"), "n1", decide)
    assert again.allocation == alloc("n1") and len(seen) == 2


def test_bind_failures(backend: FileBackend) -> None:
    def never(records: Any) -> str:
        return "no room"

    assert backend.bind(PodRef("default", "p1", ""), "n1", never).error == "no room"
    assert "nodeName" not in backend.pods()["default/p1"]["spec"]
    assert "not found" in backend.bind(PodRef("default", "ghost", ""), "n1", never).error
    assert "not found" in backend.bind(PodRef("default", "p1", ""), "n9", never).error
    assert "has uid" in backend.bind(PodRef("default", "p1", "other"), "n1", never).error
    wrong = backend.bind(PodRef("default", "p1", ""), "n1", lambda r: alloc("n2"))
    assert "not n1" in wrong.error
    backend.bind(PodRef("default", "p1", ""), "n1", lambda r: alloc("n1"))
    elsewhere = backend.bind(PodRef("default", "p1", ""), "n2", lambda r: alloc("n2"))
    assert "already bound to node n1" in elsewhere.error


def test_terminal_pods_are_not_handed_to_decide(tmp_path: Path) -> None:
    done = k8s_pod("done", node="n1", phase="Succeeded")
    done["metadata"]["annotations"][PREFIX + "allocation"] = json.dumps({"node": "n1", "devices": []})
    fb = FileBackend(cluster_file(tmp_path / "c.json", k8s_node("n1"), done, k8s_pod("p")))
    seen: list[Any] = []
    fb.bind(PodRef("default", "p", ""), "n1", lambda r: seen.append(list(r)) or alloc("n1"))
    assert seen == [[]]


def test_as_list_round_trips(backend: FileBackend, tmp_path: Path) -> None:
    backend.bind(PodRef("default", "p1", ""), "n1", lambda r: alloc("n1"))
    path = tmp_path / "again.json"
    path.write_text(json.dumps(backend.as_list()))
    again = FileBackend(path)
    assert again.pods() == backend.pods() and again.nodes() == backend.nodes()
