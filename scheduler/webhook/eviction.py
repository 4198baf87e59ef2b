"""The node agent's evictions: allowed only for pods gpuslice placed on the agent's own node.

RBAC grants the agent ``create pods/eviction`` in every namespace, and a ValidatingAdmissionPolicy
cannot narrow it: the policy sees the ``policy/v1`` Eviction, which names the pod (``request.name``
and ``request.namespace``) but not its node. This webhook sees the same request and asks the
service's cluster state (the extender's cache, kept by list and watch) about the pod.

The API server calls it only for the node agent's service account (``matchConditions`` in
manifests/webhooks.yaml), so every request that reaches it is treated as the agent's. It allows
the eviction when all of these hold, and otherwise denies it with a message that names the pod,
the pod's node and the agent's node:

* the service has synced with the API server and its watch is healthy (before that it cannot
  tell where a pod runs, so it refuses; the agent's guard tries again later);
* the requester's token names its node (the user-info extra ``authentication.kubernetes.io/
  node-name``, present in a service account token bound to a pod);
* the pod is in the service's cache, bound to that node;
* the pod holds a bound allocation record that gpuslice counts on that node (not rejected).
"""

from __future__ import annotations

from typing import Final

from .review import (
    NODE_NAME_EXTRA,
    Reply,
    ReviewError,
    WebhookConfig,
    _Decision,
    _malformed,
    _parse,
    _reply,
    _Request,
)

_DENIED_FORBIDDEN: Final = 403
_UNAVAILABLE: Final = 503
_RULE: Final = "the gpuslice node agent may evict only pods gpuslice placed on its own node"


def _deny(message: str, code: int = _DENIED_FORBIDDEN) -> _Decision:
    return _Decision(allowed=False, code=code, message=message)


def _decide(req: _Request, config: WebhookConfig) -> _Decision:
    if req.operation != "CREATE" or req.sub_resource != "eviction" or not req.name or not req.namespace:
        return _deny(
            f"request: {req.operation} of subresource {req.sub_resource or '(none)'} "
            f"on {req.namespace or '(no namespace)'}/{req.name or '(no name)'} is not a pod's eviction; "
            "accepted here: CREATE of pods/eviction (register this path for that rule only)"
        )
    pod = f"{req.namespace}/{req.name}"
    if len(req.node_names) != 1:
        return _deny(
            f"{_RULE}: the token of {req.username or '(unknown user)'} names "
            f"{'no node' if not req.node_names else 'several nodes'} (user-info extra {NODE_NAME_EXTRA}: "
            "a service account token bound to the agent's pod carries exactly one); eviction of pod "
            f"{pod} refused"
        )
    own = req.node_names[0]
    if config.placement is None:
        return _deny(f"{_RULE}: this gpuslice service keeps no cluster state to check pod {pod} against; refused")
    placed = config.placement(req.namespace, req.name)
    if not placed.synced:
        return _deny(
            f"{_RULE}: gpuslice has not synced with the API server yet (or its watch is down), so it cannot "
            f"tell where pod {pod} runs; the eviction asked by node {own}'s agent is refused until it has",
            code=_UNAVAILABLE,
        )
    if not placed.known:
        return _deny(f"{_RULE}: pod {pod} is not known to gpuslice; node {own}'s agent may not evict it")
    if placed.node != own:
        return _deny(
            f"{_RULE}: pod {pod} runs on node {placed.node or '(none: pending)'}, not on node {own} "
            "whose agent asks to evict it"
        )
    if not placed.counted:
        return _deny(
            f"{_RULE}: pod {pod} on node {own} holds no allocation record gpuslice counts "
            f"({placed.why_not or 'none'}); node {own}'s agent may not evict it"
        )
    return _Decision()


def validate_eviction(body: object, config: WebhookConfig | None = None) -> Reply:
    """The node agent's eviction of a pod: AdmissionReview v1 (a parsed JSON body) in, reply out."""
    config = config or WebhookConfig()
    try:
        req = _parse(body)
    except ReviewError as exc:
        return _malformed(body, str(exc))
    return _reply(req.uid, _decide(req, config))
