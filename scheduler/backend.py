"""The seam between the extender and where the cluster lives.

Two implementations: ``scheduler.kube.KubeBackend`` (list + watch against the API
server, binds serialised per node by a compare-and-set) and
``scheduler.filebackend.FileBackend`` (a ``v1 List`` file, binds kept in memory).
The extender depends only on this protocol; it never imports ``kubernetes``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from scheduler.core.allocation import Allocation
from scheduler.core.pods import pod_key


class Kind(StrEnum):
    NODE = "node"
    POD = "pod"
    QUOTA = "gpuquota"  # a gpuslice.io GPUQuota; key ``namespace/name``
    LEDGER = "ledger"  # what gpuslice itself bound on a node (its per-node ledger); key: the node


@dataclass(frozen=True, slots=True)
class Change:
    """One object added, modified (``obj`` set) or deleted (``obj`` None).

    ``key`` is the node name, or ``namespace/name`` for a pod or a quota. ``obj`` is the object's
    ordinary camelCase JSON as a dict, as the API server serves it. For a ledger (``key``: its
    node), ``obj`` maps each pod key the ledger holds to ``{"uid": ..., "record": ...}``: the pod
    gpuslice bound (or is binding) there and the record it bound it with.
    """

    kind: Kind
    key: str
    obj: Mapping[str, Any] | None


@dataclass(frozen=True, slots=True)
class PodRef:
    namespace: str
    name: str
    uid: str

    @property
    def key(self) -> str:
        return pod_key(self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class Placement:
    """What the service's cluster state says of one pod, for the admission of a node agent's
    eviction of it (the webhook asks; the extender, which keeps the state, answers).

    ``synced`` False: the first full sync is not in, or the watch is down; nothing else is known.
    ``known``: the pod is in the cache. ``node``: its ``spec.nodeName`` ("" while pending).
    ``counted``: gpuslice counts a bound allocation record of the pod on ``node``; else
    ``why_not`` says why it counts none.
    """

    synced: bool
    known: bool = False
    node: str = ""
    counted: bool = False
    why_not: str = ""


@dataclass(frozen=True, slots=True)
class BindResult:
    """``allocation`` on success; otherwise ``error`` says why (the pod is then requeued)."""

    allocation: Allocation | None = None
    error: str = ""


# Given the (pod key, allocation record JSON) of every pod that holds or is acquiring a
# share on the node, as seen under the node's serialisation, return the allocation for
# the pod being bound, or a reason why it no longer fits.
Decide = Callable[[Sequence[tuple[str, str]]], Allocation | str]

# Given the (pod key, allocation record JSON) of every other pod of the pod's namespace that
# holds or is acquiring a share, as seen under the namespace's serialisation, and the
# allocation ``Decide`` gave the pod, return why it would take the namespace over a GPU quota
# (None: it may have it). Asked only for a namespace with a quota.
Admit = Callable[[Sequence[tuple[str, str]], Allocation], str | None]


class Backend(Protocol):
    # True when bind waits on the network (the API server): the HTTP layer then runs it in
    # a worker thread. An in-memory bind runs on the event loop: the hop to a thread and
    # back cost more than the bind.
    bind_waits: bool
    # True when the backend reports what gpuslice itself bound (``Kind.LEDGER``, from the per-node
    # ledgers only gpuslice writes): a pod's bound record then counts only where its node's ledger
    # holds that pod (its uid); a record anyone wrote by hand claims nothing. False (a cluster
    # file, which keeps no ledger): every bound record in it counts.
    keeps_ledgers: bool

    def start(self, on_change: Callable[[Change], None]) -> None:
        """List every node and pod (and, where it keeps them, every ledger, before the pods),
        report each through ``on_change``, then follow changes.

        Returns once the first full list has been reported (``ready()`` is then true).
        ``on_change`` is called from the backend's own thread(s) afterwards.
        """

    def ready(self) -> bool:
        """True once the first full sync is done and the watch is healthy."""

    def stop(self) -> None: ...

    def node_event(self, node: str, reason: str, message: str) -> None:
        """Tell ``node``'s operators something is wrong with it, where they look: a Warning
        Event on the Node (``kubectl describe node``) from the Kubernetes backend. Best
        effort: it never raises, and never makes the caller (the watch) wait."""

    def quota_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """Write a GPUQuota's ``status`` (what its namespace holds, whether over): the status
        subresource through the Kubernetes backend. Best effort: it never raises."""

    def bind(self, pod: PodRef, node: str, decide: Decide, admit: Admit | None = None) -> BindResult:
        """Give ``pod`` a share on ``node`` and bind it there, or fail cleanly.

        With ``admit`` (the pod's namespace has a GPU quota), the allocation is also asked of
        ``admit`` under a serialisation of the namespace that holds across replicas, before the
        pod is bound: of two binds in one namespace at once, the second sees the first.

        Under a per-node serialisation that holds across replicas: call ``decide`` with
        the node's current records, persist its allocation, write the pod's annotations
        (``record_annotations``), then create the Binding. On any failure undo what was
        written and return an error. A repeated bind of a pod already bound to ``node``
        returns its existing allocation without allocating twice.
        """
