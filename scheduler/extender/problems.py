"""Telling the cluster about a node gpuslice will not serve, and about records it will not count.

The cache makes a node whose GPU inventory cannot be read unusable (``NodeView.problem``):
filter reports it unresolvable with the reason, ``/debug/nodes`` and ``gpuslice inspect``
show it, the metric ``gpuslice_node_inventory_invalid`` counts it, the log says it once.
What this adds is the one place operators look first: a Warning Event on the Node
(``kubectl describe node``), recorded when the problem appears or changes.

Likewise a pod's allocation record that the cache refuses (it does not decode, names a GPU the
node lacks, or conflicts with the records counted before it): the log says it, ``/debug/nodes``
and ``gpuslice_records_rejected{node}`` show it, and a Warning Event ``GpusliceRecordRejected``
on the Node names the pod and the reason when the refusal is new. A bound record gpuslice did not
bind (no entry in the node's ledger) is refused the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from scheduler.backend import Backend, Change, Kind
from scheduler.core.pods import node_of

INVALID_INVENTORY = "GpusliceInvalidInventory"
RECORD_REJECTED = "GpusliceRecordRejected"


def reporting_invalid_nodes(
    on_change: Callable[[Change], None],
    problem: Callable[[str], str],
    backend: Backend,
    rejected: Callable[[str], Mapping[str, str]] = lambda _: {},
) -> Callable[[Change], None]:
    """``on_change`` (the cache's), followed by a Node event whenever a node's problem is new, and
    one whenever a record on it is newly refused (``rejected``: pod -> reason, of one node)."""

    def changed(change: Change) -> None:
        if change.kind is Kind.POD:
            node = node_of(change.obj) if change.obj is not None else ""
            before_records = dict(rejected(node)) if node else {}
            on_change(change)
            if node:
                _report_records(backend, node, before_records, rejected(node))
            return
        if change.kind is Kind.LEDGER:  # what gpuslice bound on the node: records may count, or not, anew
            before_records = dict(rejected(change.key)) if change.key else {}
            on_change(change)
            if change.key:
                _report_records(backend, change.key, before_records, rejected(change.key))
            return
        if change.kind is not Kind.NODE:
            on_change(change)
            return
        before = problem(change.key)
        before_records = dict(rejected(change.key))
        on_change(change)
        after = problem(change.key)
        if after and after != before:
            backend.node_event(
                change.key,
                INVALID_INVENTORY,
                f"gpuslice places no pods on this node until its GPU inventory is fixed: {after}",
            )
        _report_records(backend, change.key, before_records, rejected(change.key))

    return changed


def _report_records(backend: Backend, node: str, before: Mapping[str, str], after: Mapping[str, str]) -> None:
    for pod, reason in sorted(after.items()):
        if before.get(pod) != reason:
            backend.node_event(node, RECORD_REJECTED, f"gpuslice does not count the allocation record of {reason}")
