"""Defragmentation plans from the service's view of the cluster (``/debug/defrag``, and
``gpuslice defrag`` on a cluster file or a snapshot fed into the same cache).

From the cache: the node states; the pending pods (no node yet, no bind in flight, with a GPU
request gpuslice can read); the movers, the only pods a plan may evict: bound pods holding a
share, owned by a controller that recreates them elsewhere (not a DaemonSet, not a static
pod) and in a namespace opted in (``defrag.namespaces``); and the typical workload of the
fragmentation measure, the demands of every GPU pod the cache holds. The planner is
:func:`scheduler.core.defrag.plan`; this module only gathers and reports. Nothing here evicts.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from scheduler.core.allocation import Allocation
from scheduler.core.defrag import Mover, Plan, PlanOptions, Waiting, plan
from scheduler.core.errors import RequestError
from scheduler.core.fragmentation import DEFAULT_WORKLOAD, Fragmentation, TypicalWorkload
from scheduler.core.pods import NODE_BOUND_OWNERS, controller_of, has_ended, priority_of
from scheduler.core.policies import Policy, tell
from scheduler.core.request import Demand, GpuKind, parse_pod
from scheduler.core.state import NodeState

from .cache import ClusterCache
from .config import ServeConfig
from .debug import share_json


@dataclass(frozen=True, slots=True)
class Inputs:
    states: list[NodeState]
    pending: list[Waiting]
    movers: list[Mover]
    workload: TypicalWorkload
    unreadable: list[str]  # pods skipped: their requests cannot be read
    seen: list[Demand]  # of every pod read, CPU-only ones too (told to the plan's policy)


def gather(cache: ClusterCache, prefix: str, namespaces: Collection[str]) -> Inputs:
    """What a plan needs of the cache (taken under its lock; planning runs outside it)."""
    opted = set(namespaces)
    with cache.lock:
        states = list(cache.board.states)
        held = {k: s.node.name for s in states for k, _ in s.pods}  # binds in flight included
        pods = [(key, view.node, view.obj) for key, view in cache.pods.items()]
    pending: list[Waiting] = []
    movers: list[Mover] = []
    demands: list[Demand] = []
    seen: list[Demand] = []
    unreadable: list[str] = []
    for key, node, obj in sorted(pods, key=lambda p: p[0]):
        if has_ended(obj):
            continue
        try:
            request = parse_pod(obj, prefix)
        except RequestError:
            unreadable.append(key)
            continue
        seen.append(request.demand)
        if request.demand.gpu.kind is GpuKind.NONE:
            continue
        demands.append(request.demand)
        if not node and key not in held:
            pending.append(Waiting(key, request.demand, priority_of(obj)))
        elif node and held.get(key) == node and request.namespace in opted and _recreated(obj):
            movers.append(Mover(key, request.demand, priority_of(obj)))
    workload = TypicalWorkload.from_demands(demands) if demands else DEFAULT_WORKLOAD
    return Inputs(states, pending, movers, workload, unreadable, seen)


def _recreated(obj: Any) -> bool:
    """Whether a controller recreates the pod elsewhere once it is evicted."""
    owner = controller_of(obj)
    return owner is not None and owner[0] not in NODE_BOUND_OWNERS


def plan_cluster(
    cache: ClusterCache,
    config: ServeConfig,
    namespaces: Collection[str],
    options: PlanOptions,
    serving: Policy | None = None,
) -> tuple[Plan, Inputs]:
    """The plan for the cache's cluster, asking ``serving``: the serving policy over a copy of
    what it learned (:func:`~scheduler.core.policies.base.over_a_copy`), so that the clusters
    planning asks about never reach the serving learned object. Without one (``gpuslice
    defrag``, which serves nothing), ``config``'s policy told of every pod the cache holds, as
    a serving policy is of the pods it sees."""
    inputs = gather(cache, config.prefix, namespaces)
    if serving is not None:
        policy = serving
    else:
        policy = config.make_policy()
        for demand in inputs.seen:
            tell(policy, demand)
    found = plan(inputs.states, inputs.pending, inputs.movers, policy, Fragmentation(inputs.workload), options)
    return found, inputs


def _allocation(alloc: Allocation | None) -> dict[str, Any] | None:
    if alloc is None:
        return None
    return {"node": alloc.node, "devices": [share_json(s) for s in alloc.shares]}


def plan_json(found: Plan, inputs: Inputs, namespaces: Collection[str], options: PlanOptions) -> dict[str, Any]:
    """The plan as ``/debug/defrag`` serves it and ``gpuslice defrag --json`` prints it."""
    return {
        "moves": [
            {
                "node": m.node,
                "evict": list(m.evict),
                "frees": m.frees,
                "admits": m.admits,
                "allocation": _allocation(m.allocation),
                "lands": [{"pod": landing.pod, "node": landing.node} for landing in m.lands],
                "fragFallMilli": round(m.frag_fall_milli, 1),
            }
            for m in found.moves
        ],
        "fitsNow": [{"pod": pod, "node": node} for pod, node in found.fits_now],
        "stranded": [{"pod": pod, "reason": why} for pod, why in found.stranded],
        "evictions": found.evictions,
        "pending": len(inputs.pending),
        "movable": len(inputs.movers),
        "namespaces": sorted(namespaces),
        "maxEvictions": options.max_evictions,
        "unreadable": inputs.unreadable,
    }


def plan_lines(found: Plan, inputs: Inputs, namespaces: Collection[str]) -> list[str]:
    """The plan in words, one line per move (what ``gpuslice defrag`` prints)."""
    lines = [
        f"{len(inputs.pending)} pending GPU pods, {len(inputs.movers)} pods that may move "
        f"(controller-owned, in {', '.join(sorted(namespaces)) or 'no namespace opted in'})"
    ]
    for i, m in enumerate(found.moves, start=1):
        lands = ", ".join(f"{landing.pod} -> {landing.node}" for landing in m.lands)
        goal = f"lets {m.admits} in" if m.admits else f"lowers fragmentation by {m.frag_fall_milli:.0f} milli-GPU"
        lines.append(
            f"move {i}: evict {', '.join(m.evict)} on {m.node} (frees {m.frees}): {goal}; expected to land: {lands}"
        )
    for pod, node in found.fits_now:
        lines.append(f"fits now: {pod} on {node} (no move needed)")
    for pod, why in found.stranded:
        lines.append(f"stays pending: {pod}: {why}")
    if not found.moves:
        lines.append("no move proposed")
    return lines
