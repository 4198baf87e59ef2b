"""The example workloads do what their headers say on the nodes they name.

Each workload's pod goes through the webhook (as the API server would send it), the core
parses the mutated pod, and the packing core places it on the companion node from
manifests/examples/nodes/ (whose inventory the core's node parser reads).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler.cli.serving import pending_pods
from scheduler.core.allocation import Allocation
from scheduler.core.inventory import SharingMode
from scheduler.core.k8s import parse_node
from scheduler.core.policies import REGISTRY, make_policy
from scheduler.core.request import parse_pod
from scheduler.core.select import Placement, evaluate
from scheduler.core.state import NodeState
from scheduler.extender.client import ExtenderClient
from scheduler.extender.config import load_config
from scheduler.extender.demo import play
from scheduler.extender.server import Server
from scheduler.extender.service import Extender
from scheduler.filebackend import FileBackend
from scheduler.webhook import WebhookConfig, mutate
from tests.deploy.manifests import MANIFESTS, documents, find
from tests.deploy.reviews import patched, review

EXAMPLES = MANIFESTS / "examples"
WORKLOADS = sorted(
    p.name for p in EXAMPLES.glob("*.yaml") if p.name not in ("kustomization.yaml", "namespace.yaml", "gpuquota.yaml")
)
POLICY = make_policy("binpack")


def companion_node(workload: str) -> dict[str, Any]:
    """The node a workload's header names (``nodes/<file>.yaml``)."""
    header = (EXAMPLES / workload).read_text(encoding="utf-8").split("\napiVersion", 1)[0]
    names = set(re.findall(r"nodes/([a-z0-9-]+\.yaml)", header))
    assert len(names) == 1, f"{workload}: the header must name one node under nodes/, found {names}"
    name = names.pop()
    (node,) = [d.obj for d in documents(EXAMPLES / "nodes") if d.path.name == name]
    assert node["kind"] == "Node"
    return node


def pod_of(workload: str) -> tuple[dict[str, Any], int]:
    """The pod a workload makes, as its controller would create it, and how many of them."""
    (doc,) = [d.obj for d in documents(EXAMPLES) if d.path.name == workload and d.kind in ("Pod", "Deployment", "Job")]
    if doc["kind"] == "Pod":
        return doc, 1
    template = doc["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": dict(template["metadata"]), "spec": template["spec"]}
    pod["metadata"]["generateName"] = doc["metadata"]["name"] + "-"
    count = doc["spec"].get("replicas", doc["spec"].get("parallelism", 1))
    return pod, count


def admitted(pod: dict[str, Any]) -> dict[str, Any]:
    pod = {**pod, "spec": {"schedulerName": "default-scheduler", **pod["spec"]}}  # the API server's default
    reply = mutate(review(pod), WebhookConfig())
    assert reply.response["allowed"] is True, reply.response
    return patched(pod, reply)


def place(pod: dict[str, Any], node: dict[str, Any], count: int) -> list[Allocation]:
    """Place ``count`` copies one after the other on the node; every one must fit."""
    state = NodeState.empty(parse_node(node))
    demand = parse_pod(pod).demand
    out = []
    for i in range(count):
        placement = evaluate(POLICY, demand, state)
        assert isinstance(placement, Placement), f"copy {i + 1} of {count} does not fit: {placement}"
        state = state.apply(f"gpu-demo/pod-{i}", placement.allocation)
        out.append(placement.allocation)
    return out


@pytest.mark.parametrize("workload", WORKLOADS)
def test_each_workload_is_admitted_and_fits_its_node(workload: str) -> None:
    pod, count = pod_of(workload)
    out = admitted(pod)
    assert out["spec"]["schedulerName"] == "gpuslice"
    for c in out["spec"]["containers"]:
        names = {e["name"] for e in c["env"]}
        assert "NVIDIA_VISIBLE_DEVICES" in names
    allocations = place(out, companion_node(workload), count)
    assert len(allocations) == count


def test_the_examples_namespace_is_in_the_webhooks_scope() -> None:
    labels = find("Namespace", "gpu-demo", EXAMPLES)["metadata"]["labels"]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in find(kind, "gpuslice")["webhooks"]:
            if hook["rules"][0]["resources"] != ["pods"]:
                continue  # the node agent's evictions: every namespace
            for expression in hook["namespaceSelector"]["matchExpressions"]:
                if expression["key"] == "kubernetes.io/metadata.name":
                    assert "gpu-demo" not in expression["values"]
                else:
                    assert expression["operator"] == "In" and labels[expression["key"]] in expression["values"]


def test_the_mps_replicas_share_one_gpu_with_a_quarter_each() -> None:
    pod, count = pod_of("mps-inference.yaml")
    allocations = place(admitted(pod), companion_node("mps-inference.yaml"), count)
    assert count == 4
    shares = [a.shares for a in allocations]
    assert all(len(s) == 1 for s in shares)
    assert {s[0].uuid for s in shares} == {"GPU-5a1c0f6e-0b9a-4d2e-9a53-0c6f1d2b7e41"}
    assert all(s[0].mode is SharingMode.MPS for s in shares)
    # 0.25 of an L4: 250 milli-GPU -> 25 % of the SMs, and 23034 x 250 // 1000 = 5758 MiB
    assert {a.mps_thread_percentage() for a in allocations} == {25}
    assert {a.mps_memory_limit() for a in allocations} == {"0=5758M"}


def test_the_mig_job_gets_a_3g_40gb_instance() -> None:
    pod, _ = pod_of("mig-3g40gb-job.yaml")
    (alloc,) = place(admitted(pod), companion_node("mig-3g40gb-job.yaml"), 1)
    (share,) = alloc.shares
    assert share.mode is SharingMode.MIG and share.mig is not None and share.mig.profile == "3g.40gb"


def test_the_training_pod_gets_four_nvlinked_gpus() -> None:
    node = companion_node("nvlink-training.yaml")
    pod, _ = pod_of("nvlink-training.yaml")
    (alloc,) = place(admitted(pod), node, 1)
    indices = sorted(s.index for s in alloc.shares)
    assert len(indices) == 4
    links = parse_node(node).nvlink
    assert all((a, b) in links for i, a in enumerate(indices) for b in indices[i + 1 :])


def test_the_timesliced_batch_runs_four_at_a_time_on_declared_memory() -> None:
    pod, count = pod_of("timesliced-batch.yaml")
    allocations = place(admitted(pod), companion_node("timesliced-batch.yaml"), count)
    assert all(s.mode is SharingMode.TIME_SLICING and s.memory_mib == 6 * 1024 for a in allocations for s in a.shares)


def test_every_companion_node_is_used() -> None:
    used = {companion_node(w)["metadata"]["name"] for w in WORKLOADS}
    assert len(used) == len(list((EXAMPLES / "nodes").glob("*.yaml")))


def example_cluster(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """Every companion node and every example's pods (admitted, one per replica), pending, as a
    cluster file; and which node each pod's header expects."""
    nodes = [d.obj for d in documents(EXAMPLES / "nodes")]
    pods: list[dict[str, Any]] = []
    expected: dict[str, str] = {}
    for workload in WORKLOADS:
        pod, count = pod_of(workload)
        out = admitted(pod)
        base = pod["metadata"].get("name") or pod["metadata"]["generateName"].rstrip("-")
        for i in range(count):
            name = base if count == 1 else f"{base}-{i}"
            meta = {**out["metadata"], "name": name, "namespace": "gpu-demo", "uid": f"uid-{name}"}
            meta.pop("generateName", None)
            pods.append({**out, "metadata": meta, "status": {"phase": "Pending"}})
            expected[f"gpu-demo/{name}"] = companion_node(workload)["metadata"]["name"]
    path = tmp_path / "examples.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [*nodes, *pods]}))
    return path, expected


@pytest.mark.parametrize("policy", sorted(REGISTRY))
def test_served_together_every_example_lands_where_its_header_says(tmp_path: Path, policy: str) -> None:
    # All the nodes and all the pods in one cluster, scheduled through the service over HTTP
    # as kube-scheduler would, in the order kustomization.yaml lists the workloads.
    path, expected = example_cluster(tmp_path)
    config = load_config(env={}, flags={"port": 0, "policy": policy})
    backend = FileBackend(path, config.prefix)
    extender = Extender(config, backend)
    extender.start()
    server = Server(extender).start_in_thread()
    client = ExtenderClient(server.url)
    try:
        order = {w: i for i, w in enumerate(yaml.safe_load((EXAMPLES / "kustomization.yaml").read_text())["resources"])}
        pods = sorted(pending_pods(backend), key=lambda p: order[_workload_of(p)])
        landed = {o.pod: o.node or o.detail for o in play(client, pods, sorted(backend.nodes()))}
    finally:
        client.close()
        server.stop()
        extender.stop()
    assert landed == expected


def _workload_of(pod: dict[str, Any]) -> str:
    name = pod["metadata"]["name"]
    (found,) = [w for w in WORKLOADS if name.startswith(_base(w))]
    return found


def _base(workload: str) -> str:
    pod, _ = pod_of(workload)
    return str(pod["metadata"].get("name") or pod["metadata"]["generateName"].rstrip("-"))
