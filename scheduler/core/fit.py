"""Does a pod fit on a node, and on which concrete shares?

``fit`` returns every candidate allocation (one per GPU for single-GPU requests, with
MIG starts already chosen by the slot rule), or a short stable reason why none exists.
A GPU's answer depends only on the request and what the capacity model reads of the GPU
(:func:`~scheduler.core.capacity.device_key`), so it is worked out once per such pair
and kept in a bounded table: many GPUs of a cluster are alike.

Reasons: a node's reason names what the pod asks and which rule refuses, never the numbers of
the node's own state (``needs 20480 MiB on one GPU, more than is free``, ``needs 4 GPUs for 4
whole GPUs, not that many available``, ``insufficient cpu: needs 2000m``). kube-scheduler
counts the nodes that failed by their reason's text in the pod's ``FailedScheduling`` event,
whose message ends at 1,024 bytes: with each node's largest free memory in its reason, every
node was a count of its own and the event named a few nodes and stopped; and a board that
keeps its reasons as texts met a new text on nearly every node of a busy cluster. What each
GPU has free is in ``gpuslice inspect``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations, islice
from math import comb
from typing import Any

import networkx as nx

from . import modes
from .allocation import Allocation, DeviceShare
from .capacity import (
    DeviceUsage,
    Refusal,
    compute_short_text,
    device_key,
    unhealthy,
)
from .inventory import Device, Node, SharingMode
from .modes.base import Offer
from .modes.shared import SHORT_COMPUTE, SHORT_MEMORY
from .request import Demand, GpuKind, GpuRequest
from .state import NodeState

_MAX_COMBINATIONS = 4096
_TABLE_LIMIT = 200_000


@dataclass(frozen=True, slots=True)
class Fit:
    allocations: tuple[Allocation, ...] = ()
    reason: str = ""

    def __bool__(self) -> bool:
        return bool(self.allocations)


# Per request, per device key: a request is looked up once per node, not once per GPU.
_SHARES: dict[GpuRequest, dict[tuple[Any, ...], Offer | Refusal]] = {}


def state_question(gpu: GpuRequest, device: Device) -> tuple[Any, ...] | None:
    """For a healthy GPU whose mode keeps answers by question (MIG, exclusive): what decides
    :func:`device_share`'s answer for one share of ``gpu`` beyond the GPU's state
    (:func:`~.capacity.device_key`): requests with equal questions take the same share of GPUs
    in equal states, or get the same refusal (read for the GPU at hand:
    :meth:`~.capacity.Refusal.on`). It depends on the request and the device's kind only.
    None for the other modes (the rules of arrays answer them) and for an unhealthy GPU."""
    if not device.healthy:
        return None
    return modes.of(device.mode).question(gpu, device)


def mig_question(gpu: GpuRequest, device: Device) -> str | None:
    """For a GPU in MIG mode: what decides whether it can take one share of ``gpu``, whatever it
    holds (requests with equal questions are hosted alike: :func:`hosts` of one answers for
    all; the covering profiles of :func:`state_question`), or None where it never can (its
    health, the request's selectors, no profile)."""
    if not gpu.allows_model(device.model.name) or not gpu.allows_mode(device.mode):
        return None
    question = state_question(gpu, device)
    return question[1] if question is not None and question[0] == "profiles" else None


_entries = [0]  # answers kept in _SHARES, over every request


def _table(gpu: GpuRequest) -> dict[tuple[Any, ...], Offer | Refusal]:
    table = _SHARES.get(gpu)
    if table is None:
        if _entries[0] > _TABLE_LIMIT or len(_SHARES) > _TABLE_LIMIT // 64:
            _SHARES.clear()
            _entries[0] = 0
        table = _SHARES[gpu] = {}
    return table


def device_share(
    gpu: GpuRequest,
    node: Node,
    device: Device,
    usage: DeviceUsage,
    table: dict[tuple[Any, ...], Offer | Refusal] | None = None,
) -> DeviceShare | Refusal:
    """The share ``gpu`` would get on one device, or why it cannot (``table``: ``gpu``'s, if at hand)."""
    bad = unhealthy(device)
    if bad is not None:
        return bad
    known = _table(gpu) if table is None else table
    key = device_key(node, device, usage)
    found = known.get(key)
    if found is None:
        found = known[key] = modes.of(device.mode).offer(gpu, node, device, usage, key)
        _entries[0] += 1
    if isinstance(found, Refusal):
        return found.on(device.index)  # kept from a GPU in the same state, maybe at another index
    uuid = device.uuid
    if found.instance_start is not None:
        uuid = next(i.uuid for i in device.mig_instances if i.start == found.instance_start) or device.uuid
    return DeviceShare(uuid, device.index, device.mode, found.memory_mib, found.compute_milli, found.mig)


def sharing_share(gpu: GpuRequest, device: Device) -> DeviceShare:
    """The share that ``gpu`` (a share or whole GPUs) takes of a healthy MPS or time-slicing GPU
    that can host it: exactly what the pod asks, as :func:`device_share` answers there (a
    caller that already knows the GPU hosts it skips the capacity question)."""
    memory, compute = gpu.share_on(device)
    return DeviceShare(device.uuid, device.index, device.mode, memory, compute)


def hosts(gpu: GpuRequest, node: Node, device: Device, usage: DeviceUsage) -> bool:
    """Whether ``device`` can take one share of ``gpu`` (the selectors and the capacity model)."""
    return (
        gpu.allows_model(device.model.name)
        and gpu.allows_mode(device.mode)
        and not isinstance(device_share(gpu, node, device, usage), Refusal)
    )


def _best_connected(node: Node, indices: list[int], count: int) -> list[int]:
    """The ``count`` GPUs with the most NVLink edges among them; lowest indices on ties."""
    if not node.nvlink or comb(len(indices), count) > _MAX_COMBINATIONS:
        return indices[:count]
    return list(_best_set(node.nvlink, tuple(indices), count))


@lru_cache(maxsize=4096)
def _best_set(links: frozenset[tuple[int, int]], indices: tuple[int, ...], count: int) -> tuple[int, ...]:
    # Many nodes share a topology and a set of free GPUs: the answer is cached by them.
    graph = nx.Graph()
    graph.add_nodes_from(indices)
    graph.add_edges_from(e for e in links if e[0] in graph and e[1] in graph)
    return max(
        islice(combinations(indices, count), _MAX_COMBINATIONS),
        key=lambda c: (graph.subgraph(c).number_of_edges(), [-i for i in c]),
    )


@lru_cache(maxsize=4096)
def linked_set(links: frozenset[tuple[int, int]], indices: tuple[int, ...], count: int) -> tuple[int, ...] | None:
    """The ``count`` GPUs of ``indices`` every pair of which is joined by NVLink (a clique of the
    NVLink graph), lowest indices first; None if there are none. Exact: a node has a few dozen
    GPUs at most, and networkx lists the cliques of such a graph at once."""
    if count <= 1:
        return indices[:count] if len(indices) >= count else None
    graph = nx.Graph()
    graph.add_nodes_from(indices)
    graph.add_edges_from(e for e in links if e[0] in graph and e[1] in graph)
    best: tuple[int, ...] | None = None
    for clique in nx.find_cliques(graph):  # the maximal cliques; every k-clique lies in one
        if len(clique) >= count:
            first = tuple(sorted(clique)[:count])
            best = first if best is None or first < best else best
    return best


def kind_reason(gpu: GpuRequest, node: Node) -> str | None:
    """Why no GPU of the node is of a model and mode ``gpu`` accepts (None when some is): the
    same for every node of the node's kind."""
    models = {d.model.name for d in node.devices}
    if not node.devices:
        return "node has no GPUs"
    if gpu.models and not any(gpu.allows_model(m) for m in models):
        return f"model {'|'.join(sorted(models))} not in {'|'.join(gpu.models)}"
    present = {d.mode for d in node.devices if gpu.allows_model(d.model.name)}
    if gpu.sharing and not any(gpu.allows_mode(m) for m in present):
        return f"no GPU in sharing mode {'|'.join(sorted(gpu.sharing))}"
    if gpu.kind is GpuKind.MIG and SharingMode.MIG not in present:
        return "no GPU in MIG mode"
    return None


def refused_reason(best: Refusal | None) -> str:
    """Why, when the GPUs the selectors allow refused: ``best`` is the refusal of the GPU
    closest to fitting (the most free memory; the first such), None when none refused."""
    if best is None:
        return "no GPU matches"
    if best.need_mib is not None:  # memory: what is asked (the GPU's own text names what it has)
        return _memory_reason(best.need_mib)
    return best.text


def _memory_reason(need_mib: int) -> str:
    return f"needs {need_mib} MiB on one GPU, more than is free"


def short_reason(what: int, need: int) -> str:
    """What :func:`refused_reason` says of the refusal :func:`~.capacity.rows_shortages`
    describes as (``what``, ``need``), ``what`` not 0."""
    if what == SHORT_MEMORY:
        return _memory_reason(need)
    assert what == SHORT_COMPUTE, what
    return compute_short_text(need)


def _gpu_reason(gpu: GpuRequest, node: Node, refusals: list[Refusal]) -> str:
    found = kind_reason(gpu, node)
    if found is not None:
        return found
    return refused_reason(max(refusals, key=lambda r: r.free_mib) if refusals else None)


def counted_reason(gpu: GpuRequest, why: str | None) -> str:
    """The reason of :func:`shortage` from ``why`` the GPUs refused (None: none refused, for a
    request of several GPUs)."""
    if gpu.count <= 1:
        assert why is not None
        return why
    text = f"needs {gpu.count} GPUs for {gpu.describe()}, not that many available"
    return text if why is None else f"{text} ({why})"


def shortage(gpu: GpuRequest, node: Node, refusals: list[Refusal]) -> str:
    """Why ``gpu`` does not fit a node where too few GPUs can host one of its shares and the
    node's other GPUs (those its selectors allow) gave ``refusals``, in device order."""
    why = _gpu_reason(gpu, node, refusals) if refusals or gpu.count <= 1 else None
    return counted_reason(gpu, why)


def gpu_options(gpu: GpuRequest, state: NodeState) -> tuple[list[DeviceShare], list[Refusal]]:
    """One candidate share per GPU that can host ``gpu``, and the other GPUs' refusals."""
    node = state.node
    options: list[DeviceShare] = []
    refusals: list[Refusal] = []
    table = _table(gpu)
    for device, used in zip(node.devices, state.usage, strict=True):
        if not gpu.allows_model(device.model.name) or not gpu.allows_mode(device.mode):
            continue
        result = device_share(gpu, node, device, used, table)
        if isinstance(result, Refusal):
            refusals.append(result)
        else:
            options.append(result)
    return options, refusals


def host_reason(demand: Demand, state: NodeState) -> str | None:
    """Why the node's pod room, CPU or memory cannot take ``demand`` (None if they can)."""
    node = state.node
    if len(state.pods) >= node.max_pods:
        return f"node already holds its maximum of {node.max_pods} pods"
    if demand.cpu_milli > state.cpu_free:
        return f"insufficient cpu: needs {demand.cpu_milli}m"
    if demand.memory_mib > state.memory_free:
        return f"insufficient memory: needs {demand.memory_mib} MiB"
    return None


def gpu_fit(demand: Demand, state: NodeState) -> Fit:
    """The GPU half of :func:`fit`: every allocation of ``demand``'s GPU request, host
    resources not checked (the allocations still carry the pod's CPU and memory)."""
    node = state.node
    gpu = demand.gpu
    if gpu.kind is GpuKind.NONE:
        return Fit((Allocation(node.name, (), demand.cpu_milli, demand.memory_mib),))
    options, refusals = gpu_options(gpu, state)
    if len(options) < max(1, gpu.count):
        return Fit(reason=shortage(gpu, node, refusals))
    return fit_options(demand, node, options)


def fit_options(demand: Demand, node: Node, options: list[DeviceShare]) -> Fit:
    """The allocations of ``demand``'s GPU request on ``node`` from ``options``, one share per
    GPU that can host it, in device order (:func:`gpu_options`' own; at least as many as the
    request's GPUs): one allocation per option for a single GPU, else the GPUs chosen."""
    gpu = demand.gpu
    if gpu.count <= 1:
        return Fit(tuple(Allocation(node.name, (s,), demand.cpu_milli, demand.memory_mib) for s in options))
    indices = [s.index for s in options]
    if gpu.nvlink:
        linked = linked_set(node.nvlink, tuple(indices), gpu.count)
        if linked is None:
            return Fit(reason=f"needs {gpu.count} GPUs joined by NVLink, not that many free and joined")
        chosen = list(linked)
    else:
        chosen = _best_connected(node, indices, gpu.count)
    by_index = {s.index: s for s in options}
    shares = tuple(by_index[i] for i in sorted(chosen))
    return Fit((Allocation(node.name, shares, demand.cpu_milli, demand.memory_mib),))


def fit(demand: Demand, state: NodeState) -> Fit:
    """Every allocation of ``demand`` on ``state``'s node, or the reason there is none."""
    reason = host_reason(demand, state)
    return Fit(reason=reason) if reason is not None else gpu_fit(demand, state)
