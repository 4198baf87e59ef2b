"""Telling the cluster about a node gpuslice will not serve.

The cache makes a node whose GPU inventory cannot be read unusable (``NodeView.problem``):
filter reports it unresolvable with the reason, ``/debug/nodes`` and ``gpuslice inspect``
show it, the metric ``gpuslice_node_inventory_invalid`` counts it, the log says it once.
What this adds is the one place operators look first: a Warning Event on the Node
(``kubectl describe node``), recorded when the problem appears or changes.
"""

from __future__ import annotations

from collections.abc import Callable

from scheduler.backend import Backend, Change, Kind

INVALID_INVENTORY = "GpusliceInvalidInventory"


def reporting_invalid_nodes(
    on_change: Callable[[Change], None], problem: Callable[[str], str], backend: Backend
) -> Callable[[Change], None]:
    """``on_change`` (the cache's), followed by a Node event whenever a node's problem is new."""

    def changed(change: Change) -> None:
        if change.kind is not Kind.NODE:
            on_change(change)
            return
        before = problem(change.key)
        on_change(change)
        after = problem(change.key)
        if after and after != before:
            backend.node_event(
                change.key,
                INVALID_INVENTORY,
                f"gpuslice places no pods on this node until its GPU inventory is fixed: {after}",
            )

    return changed
