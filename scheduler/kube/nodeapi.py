"""The node agent's calls to the API server: its own Node, the pods bound to it, Events, evictions,
and gpuslice's ledger of the node (read only: what gpuslice itself bound there).

Implements ``scheduler.agent.cluster.NodeCluster`` (by shape: the agent never imports this
package; the composition root builds this and hands it in). Every call is in
:data:`~scheduler.kube.api.AGENT_API_CALLS`, which the agent's ClusterRole grants exactly.
Pods are followed with the same list + watch as the extender's, narrowed by the field
selector ``spec.nodeName=<node>``.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Callable, Mapping
from typing import Any

from scheduler.backend import Change, Kind

from .api import AGENT_API_CALLS, KubeApi
from .clock import SYSTEM_CLOCK, Clock
from .errors import KubeError
from .events import NODE_EVENTS_NAMESPACE, event
from .ledger import LedgerStore
from .options import KubeOptions
from .reflector import Reflector

COMPONENT = "gpuslice-agent"
Json = Mapping[str, Any]


class NodeApi:
    def __init__(
        self, api: KubeApi, node: str, clock: Clock = SYSTEM_CLOCK, options: KubeOptions | None = None
    ) -> None:
        api.calls, api.calls_name = AGENT_API_CALLS, "AGENT_API_CALLS"
        self._api = api
        self.node = node
        self._clock = clock
        self._options = options or KubeOptions()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._reflector: Reflector | None = None

    @classmethod
    def connect(cls, node: str, kubeconfig: str | None = None, url: str | None = None) -> NodeApi:
        """In the cluster (the DaemonSet's service account) unless a kubeconfig or URL is given."""
        if url:
            return cls(KubeApi.from_url(url), node)
        if kubeconfig:
            return cls(KubeApi.from_kubeconfig(kubeconfig), node)
        return cls(KubeApi.in_cluster(), node)

    @property
    def selector(self) -> str:
        return f"spec.nodeName={self.node}"

    def get_node(self) -> Json:
        return self._api.get_node(self.node)

    def set_node_annotations(self, annotations: Mapping[str, str | None]) -> None:
        self._api.patch_node(self.node, {"metadata": {"annotations": dict(annotations)}})

    def list_pods(self) -> list[Json]:
        items: list[Json] = []
        token: str | None = None
        while True:
            page = self._api.list("pods", field_selector=self.selector, limit=500, continue_token=token)
            items.extend(i for i in page.get("items") or [] if isinstance(i, Mapping))
            meta = page.get("metadata")
            token = meta.get("continue") if isinstance(meta, Mapping) else None
            if not token:
                return items

    def follow_pods(self, on_change: Callable[[str, Json | None], None]) -> None:
        def emit(change: Change) -> None:
            on_change(change.key, change.obj)

        reflector = Reflector(
            self._api, Kind.POD, emit, self._options, self._clock, self._stop, random.Random(), self.selector
        )
        self._reflector = reflector
        version = reflector.relist()
        thread = threading.Thread(target=reflector.run, args=(version,), name="agent-pods", daemon=True)
        thread.start()
        self._threads.append(thread)

    def event(self, about: Any, kind: str, reason: str, message: str) -> None:
        """``about`` has kind, name, namespace and uid (scheduler.agent.cluster.ObjectRef)."""
        namespace = about.namespace or NODE_EVENTS_NAMESPACE
        involved = {
            "apiVersion": "v1",
            "kind": about.kind,
            "name": about.name,
            **({"namespace": about.namespace} if about.namespace else {}),
            **({"uid": about.uid} if about.uid else {}),
        }
        body = event(involved, namespace, kind, reason, message, self._clock.now(), COMPONENT, self.node)
        with contextlib.suppress(KubeError):  # an Event is best effort: the agent's log says the same
            self._api.create_event(namespace, body)

    def bound_records(self) -> dict[str, tuple[str, str]]:
        """gpuslice's ledger of this node (``gpuslice-node-<node>`` in gpuslice's namespace): pod key ->
        (UID, record). An absent ledger is an empty one; a failed read is a KubeError."""
        ledger = LedgerStore(self._api, self._options.namespace, self._options.prefix).read(self.node)
        return {key: (entry.uid, entry.record) for key, entry in ledger.entries.items()}

    def evict(self, pod: Any) -> None:
        """``pod`` has name, namespace and uid (scheduler.agent.cluster.ObjectRef); the KubeError
        (429 while a PodDisruptionBudget refuses) says why not."""
        self._api.evict_pod(pod.namespace or "default", pod.name, pod.uid)

    def stop(self) -> None:
        self._stop.set()
        if self._reflector is not None:
            self._reflector.close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._api.close()
