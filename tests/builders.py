"""Builders with keyword defaults for core objects, shared by the test suites."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from scheduler.core.allocation import Allocation, DeviceShare
from scheduler.core.capacity import device_key
from scheduler.core.catalog import CATALOG, GpuModel
from scheduler.core.fragmentation import ShareCandidates
from scheduler.core.inventory import Device, MigInstance, Node, SharingMode
from scheduler.core.policies.base import CAPABILITIES, Policy, capabilities
from scheduler.core.request import DEFAULT_PREFIX
from scheduler.core.state import NodeState


def make_device(
    index: int = 0, model: str | GpuModel = "H100-80GB", mode: SharingMode | str = "exclusive", **options: Any
) -> Device:
    gpu = CATALOG[model] if isinstance(model, str) else model
    return Device(options.pop("uuid", f"GPU-{index}"), index, gpu, SharingMode(mode), **options)


def make_node(
    name: str = "n1",
    gpus: int = 1,
    model: str | GpuModel = "H100-80GB",
    mode: SharingMode | str = "exclusive",
    cpu_milli: int = 64_000,
    memory_mib: int = 512_000,
    max_pods: int = 110,
    nvlink: frozenset[tuple[int, int]] = frozenset(),
    device_options: Any = None,
    **node_options: Any,
) -> Node:
    devices = tuple(make_device(i, model, mode, uuid=f"{name}-gpu{i}", **(device_options or {})) for i in range(gpus))
    return Node(name, cpu_milli, memory_mib, devices, max_pods, nvlink, **node_options)


def make_state(**kwargs: Any) -> NodeState:
    return NodeState.empty(make_node(**kwargs))


def static_mig(model: str, *placements: tuple[str, int]) -> tuple[MigInstance, ...]:
    layout = CATALOG[model].mig
    assert layout is not None
    out = []
    for k, (name, start) in enumerate(placements):
        profile = layout.profile(name)
        assert profile is not None, name
        out.append(MigInstance(profile, start, f"MIG-{name}-{start}-{k}"))
    return tuple(out)


def pod(
    name: str = "p",
    namespace: str = "default",
    annotations: dict[str, Any] | None = None,
    cpu: str | None = None,
    memory: str | None = None,
    gpus: int | None = None,
    extra_resources: dict[str, Any] | None = None,
    prefix: str = DEFAULT_PREFIX,
) -> dict[str, Any]:
    """A Pod as the API server serves it (camelCase JSON as a dict)."""
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    if cpu is not None:
        requests["cpu"] = cpu
    if memory is not None:
        requests["memory"] = memory
    if gpus is not None:
        limits["nvidia.com/gpu"] = gpus
    limits.update(extra_resources or {})
    annotations = {(k if "/" in k else prefix + k): v for k, v in (annotations or {}).items()}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "annotations": annotations},
        "spec": {"containers": [{"name": "main", "image": "x", "resources": {"requests": requests, "limits": limits}}]},
    }


def make_policy_for(name: str, workload: Any = None, seed: int = 0, **options: Any) -> Any:
    """Policy ``name`` as a run builds it: ``options`` for its options dataclass, ``workload``
    (a TypicalWorkload) and ``seed`` as the run's context."""
    from scheduler.core.policies import Context, make_policy

    return make_policy(name, options or None, Context(seed, workload))


def share_candidates(nodes: Sequence[tuple[NodeState, Sequence[Allocation]]]) -> ShareCandidates:
    """Candidates given per node as (state, allocations of one share each) as the board hands
    them to ``score_nodes``: every GPU labelled by its device key."""
    numbers: dict[tuple[Any, ...], int] = {}
    width = max((len(state.node.devices) for state, _ in nodes), default=0)
    labels = np.zeros((len(nodes), width), dtype=np.int64)
    node: list[int] = []
    gpu: list[int] = []
    shares: dict[int, DeviceShare] = {}
    for i, (state, allocs) in enumerate(nodes):
        for g, (device, usage) in enumerate(zip(state.node.devices, state.usage, strict=True)):
            labels[i, g] = numbers.setdefault(device_key(state.node, device, usage), len(numbers))
        for alloc in allocs:
            (share,) = alloc.shares
            node.append(i)
            gpu.append(share.index)
            shares.setdefault(int(labels[i, share.index]), share)
    states = [state for state, _ in nodes]
    return ShareCandidates(states, labels, np.array(node, dtype=np.int64), np.array(gpu, dtype=np.int64), shares)


def without(policy: Policy, *dropped: type[Any]) -> Policy:
    """``policy`` without the capabilities ``dropped`` (protocols of
    :mod:`scheduler.core.policies.base`): a policy that answers as it does, through the code
    paths left (``score_nodes`` dropped: the board scores its candidates one by one)."""
    bases = type(policy).__mro__
    keep = tuple(p for p in CAPABILITIES.values() if p in bases and p not in dropped)
    parts: dict[str, Any] = {"name": f"{policy.name}-without", "score": lambda self, *a: policy.score(*a)}
    learning = capabilities(policy).learning
    for attribute, protocol in CAPABILITIES.items():
        if protocol not in keep:
            continue
        if attribute == "reads":
            parts["reads"] = capabilities(policy).reads
        elif attribute == "learned" and learning is not None:  # what it learned; the same policy over another
            parts["learned"] = property(lambda self: learning.learned)
            parts["memos"] = learning.memos
            parts["over"] = lambda self, learned: without(learning.over(learned), *dropped)
        else:
            parts[attribute] = (lambda name: lambda self, *a: getattr(policy, name)(*a))(attribute)
    made: Policy = type("Without", keep, parts)()
    return made
