"""What the agent needs of the cluster and of its kubelet, as protocols.

The composition root (``scheduler/cli.py``) builds the Kubernetes implementation
(``scheduler.kube.nodeapi``) and hands it in; the agent never imports ``scheduler.kube``.
Tests hand in memory fakes. Every call is about this node: its own Node object, the pods
bound to it (``fieldSelector spec.nodeName=<node>``), Events about them, evictions of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

Json = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """What an Event is about."""

    kind: str  # "Pod" or "Node"
    name: str
    namespace: str = ""
    uid: str = ""


class NodeCluster(Protocol):
    def get_node(self) -> Json:
        """This node's Node object."""

    def set_node_annotations(self, annotations: Mapping[str, str | None]) -> None:
        """Merge-patch annotations of this node (None deletes one)."""

    def list_pods(self) -> list[Json]:
        """Every pod bound to this node, read from the API server now (not from a cache)."""

    def follow_pods(self, on_change: Callable[[str, Json | None], None]) -> None:
        """List the node's pods, report each, then report changes (``namespace/name``, object or
        None when deleted) from a thread of its own, until :meth:`stop`."""

    def event(self, about: ObjectRef, kind: str, reason: str, message: str) -> None:
        """Record an Event (``kind`` Normal or Warning); best effort."""

    def evict(self, pod: ObjectRef) -> None:
        """Ask the Eviction API (``policy/v1``) to evict the pod, only if its UID is still
        ``pod.uid``; a GpusliceError says why not (HTTP 429: a PodDisruptionBudget refuses now)."""

    def bound_records(self) -> Mapping[str, tuple[str, str]] | None:
        """What gpuslice itself bound on this node, from its per-node ledger: pod key -> (pod UID,
        record text); None where the cluster keeps no ledger (a cluster file). A GpusliceError
        when the ledger cannot be read now."""

    def stop(self) -> None: ...


class PodResources(Protocol):
    def list(self) -> dict[str, dict[str, dict[str, tuple[str, ...]]]]:
        """What kubelet handed out: pod key -> container -> resource name -> device IDs."""
