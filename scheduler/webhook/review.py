"""Pod admission decisions: an AdmissionReview ``admission.k8s.io/v1`` dict in, a reply out.

``mutate`` (CREATE), for a pod that requests a GPU (annotations under the prefix, or
``nvidia.com/gpu`` / ``nvidia.com/mig-<profile>`` resources):

* sets ``spec.schedulerName`` to gpuslice's unless the pod names another scheduler (the API
  server has already defaulted an absent name to ``default-scheduler``, so that one counts
  as "not named");
* gives each GPU container its environment through the downward API, read from the
  annotations the bind writes (kubelet resolves them at container start, after the bind):
  ``NVIDIA_VISIBLE_DEVICES`` and, where the pod may land on an MPS GPU,
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``. GPU
  containers are those with an ``nvidia.com/*`` GPU resource, or every container (init
  containers included) when the request is made by annotation, since that request is per pod;
* with the node agent (``share_resource`` set, ``GPUSLICE_SHARE_RESOURCE`` in ``gpuslice serve``),
  adds that resource (``gpuslice.io/share: "1"``) to the limits of each GPU container: the
  kubelet then asks the agent's device plugin for it before the container starts, and the
  agent's ``Allocate`` hands over exactly the devices of the pod's allocation record (CDI
  names, MPS pipe and caps). The resource is not a GPU request: the extender's parser reads
  ``nvidia.com/*`` only, and kube-scheduler only needs the node to advertise it (nodes
  without the agent do not, so such pods go only to nodes with the agent). Without the
  agent the downward-API environment below is all a container gets: the documented fallback;
* with GPU units (``units_resource`` set, ``GPUSLICE_UNITS_RESOURCE``), asks that node-level
  resource (``gpuslice.io/gpu-units``) once per pod, on its first GPU container, by
  :func:`scheduler.core.units.pod_units` (a lower bound of the pod's GPU footprint: nothing
  when none is safe), and removes it from any other container: kube-scheduler's
  NodeResourcesFit then sees a node short of GPU, and its preemption proposes it;
* removes the annotations only gpuslice writes (``allocation``, ``bind-phase``,
  ``visible-devices``, ``mps-*``...) from any new pod, so nobody claims a share the
  scheduler did not give.

A pod with neither a GPU request nor such annotations gets an empty reply: allowed, no patch.
A malformed request is denied with the core parser's message (key, value, accepted forms).

``validate`` (CREATE) denies the same malformed requests, output annotations or a
hand-written device environment that survived mutation, and the agent's share resource
(``share_resource``, else ``<prefix>share``) on a pod whose ``spec.schedulerName`` is not
gpuslice's: only a pod gpuslice places has the record the agent hands over, so on any other
pod the resource could only make the agent's ``Allocate`` wonder which pod it serves (and the
same for the GPU units, ``units_resource`` else ``<prefix>gpu-units``: another pod's units
would hold room gpuslice's pods need); (UPDATE) denies a change to the
output annotations by anyone but gpuslice itself (``trusted_users`` / ``trusted_groups``):
kubelet re-reads a downward-API annotation whenever a container restarts, so an edited
``visible-devices`` would otherwise hand the container another pod's GPU.

A body that is not an AdmissionReview v1 raises nothing: the reply carries HTTP 400 and a
denied response whose message says what was wrong and what is accepted.
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from scheduler.backend import Placement
from scheduler.core import modes
from scheduler.core.errors import ConfigError, GpusliceError, RequestError
from scheduler.core.policies import REGISTRY
from scheduler.core.request import DEFAULT_PREFIX, OUTPUT_KEYS, GpuKind, GpuRequest, parse_pod
from scheduler.core.units import pod_units

API_VERSION: Final = "admission.k8s.io/v1"
KIND: Final = "AdmissionReview"
DEFAULT_SCHEDULER_NAME: Final = "gpuslice"
# The name the API server writes into spec.schedulerName when a pod names none.
KUBE_DEFAULT_SCHEDULER: Final = "default-scheduler"
OPERATIONS: Final = ("CREATE", "UPDATE", "DELETE", "CONNECT")
# The user-info extra in which the API server names the node of the pod a service account token
# was bound to (Kubernetes 1.30+; a token not bound to a pod on a node has none).
NODE_NAME_EXTRA: Final = "authentication.kubernetes.io/node-name"

# Annotations gpuslice writes on pods (the node-only ``inventory`` excluded).
POD_OUTPUT_KEYS: Final = tuple(sorted(OUTPUT_KEYS - {"inventory"}))

# (environment variable, annotation it is read from (without prefix), only for MPS shares)
ENV_FROM_ANNOTATIONS: Final = (
    ("NVIDIA_VISIBLE_DEVICES", "visible-devices", False),
    ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "mps-thread-percentage", True),
    ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "mps-memory-limit", True),
)

_DENIED_INVALID = 422
_DENIED_FORBIDDEN = 403
_MALFORMED = 400


class ReviewError(GpusliceError, ValueError):
    """The body is not an AdmissionReview v1 the webhook can answer."""


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    """What the webhook needs to know; checked once, at construction.

    ``trusted_users`` / ``trusted_groups`` may change the output annotations of an existing
    pod: gpuslice's own service account (``system:serviceaccount:<namespace>:<name>``) and
    cluster administrators.
    """

    prefix: str = DEFAULT_PREFIX
    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    policies: frozenset[str] | None = None
    trusted_users: frozenset[str] = frozenset()
    trusted_groups: frozenset[str] = frozenset({"system:masters"})
    share_resource: str = ""  # the node agent's resource, such as gpuslice.io/share ("": no agent)
    # the node-level resource of GPU units the nodes advertise, such as gpuslice.io/gpu-units ("": none)
    units_resource: str = ""
    # (namespace, GPU request) -> a warning when the pod could never fit its namespace's GPU
    # quota (the service that serves the webhook knows the quotas); None: no such check
    quota_advice: Callable[[str, GpuRequest], str | None] | None = field(default=None, compare=False)
    # (namespace, pod name) -> what the service's cluster state says of the pod, for the node
    # agent's evictions; None: no cluster state here, and every such eviction is refused
    placement: Callable[[str, str], Placement] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        for name, value, example in (
            ("shareResource", self.share_resource, "gpuslice.io/share"),
            ("unitsResource", self.units_resource, "gpuslice.io/gpu-units"),
        ):
            if value and (value.count("/") != 1 or value.startswith("nvidia.com/")):
                raise ConfigError(
                    f"webhook.{name}: {value!r} must be an extended resource of the node agent, "
                    f"such as {example!r} (not an nvidia.com/ resource)"
                )
        if self.units_resource and self.units_resource == self.share_resource:
            raise ConfigError(f"webhook.unitsResource: {self.units_resource!r} must differ from webhook.shareResource")
        if not self.prefix.endswith("/") or len(self.prefix) < 2 or " " in self.prefix:
            raise ConfigError(
                f"webhook.prefix: {self.prefix!r} must be a DNS-style prefix ending in '/', such as {DEFAULT_PREFIX!r}"
            )
        if not self.scheduler_name or self.scheduler_name == KUBE_DEFAULT_SCHEDULER:
            raise ConfigError(
                f"webhook.schedulerName: {self.scheduler_name!r} must be the name of gpuslice's "
                f"own kube-scheduler profile, such as {DEFAULT_SCHEDULER_NAME!r}"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str], prefix: str | None = None) -> WebhookConfig:
        """The webhook's settings in ``gpuslice serve``: ``prefix`` (the service's; else
        ``GPUSLICE_PREFIX``, else the default), the registered policy names, and as trusted user
        the service account named by ``GPUSLICE_NAMESPACE`` and ``GPUSLICE_SERVICE_ACCOUNT``
        (the Deployment sets both through the downward API)."""
        namespace, account = environ.get("GPUSLICE_NAMESPACE", ""), environ.get("GPUSLICE_SERVICE_ACCOUNT", "")
        users = frozenset({f"system:serviceaccount:{namespace}:{account}"}) if namespace and account else frozenset()
        return cls(
            share_resource=environ.get("GPUSLICE_SHARE_RESOURCE", ""),
            units_resource=environ.get("GPUSLICE_UNITS_RESOURCE", ""),
            prefix=prefix or environ.get("GPUSLICE_PREFIX") or DEFAULT_PREFIX,
            policies=frozenset(REGISTRY),
            trusted_users=users,
        )


@dataclass(frozen=True, slots=True)
class Reply:
    """The HTTP status and the AdmissionReview to send back."""

    status: int
    body: dict[str, Any]

    @property
    def response(self) -> dict[str, Any]:
        response: dict[str, Any] = self.body["response"]
        return response


@dataclass(frozen=True, slots=True)
class _Request:
    uid: str
    operation: str
    namespace: str
    is_pod: bool
    obj: Mapping[str, Any] | None
    old: Mapping[str, Any] | None
    username: str
    groups: frozenset[str]
    name: str = ""  # request.name: the object's, or for a subresource its parent's (the pod an Eviction evicts)
    sub_resource: str = ""
    node_names: tuple[str, ...] = ()  # the requester's authentication.kubernetes.io/node-name extra


@dataclass(slots=True)
class _Decision:
    allowed: bool = True
    code: int = 200
    message: str = ""
    patch: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- envelope


def _parse(body: object) -> _Request:
    accepted = f"an AdmissionReview with apiVersion {API_VERSION} and a request object (admissionReviewVersions: [v1])"
    if not isinstance(body, Mapping):
        raise ReviewError(f"body: expected a JSON object, got {type(body).__name__}; accepted: {accepted}")
    if body.get("apiVersion") != API_VERSION or body.get("kind") != KIND:
        raise ReviewError(f"apiVersion/kind: got {body.get('apiVersion')!r}/{body.get('kind')!r}; accepted: {accepted}")
    request = body.get("request")
    if not isinstance(request, Mapping):
        raise ReviewError(f"request: expected an object, got {type(request).__name__}; accepted: {accepted}")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError(f"request.uid: expected a non-empty string, got {uid!r}")
    operation = request.get("operation")
    if operation not in OPERATIONS:
        raise ReviewError(f"request.operation: got {operation!r}; accepted: one of {', '.join(OPERATIONS)}")
    kind = request.get("kind")
    resource = request.get("resource")
    is_pod = (
        (isinstance(kind, Mapping) and kind.get("kind") == "Pod" and not kind.get("group"))
        or (isinstance(resource, Mapping) and resource.get("resource") == "pods" and not resource.get("group"))
    ) and not request.get("subResource")
    obj, old = request.get("object"), request.get("oldObject")
    if is_pod and operation in ("CREATE", "UPDATE") and not isinstance(obj, Mapping):
        raise ReviewError(
            f"request.object: expected the Pod as a JSON object for {operation}, got {type(obj).__name__}"
        )
    if is_pod and operation == "UPDATE" and not isinstance(old, Mapping):
        raise ReviewError(
            f"request.oldObject: expected the previous Pod as a JSON object for UPDATE, got {type(old).__name__}"
        )
    namespace = request.get("namespace")
    user = request.get("userInfo")
    user = user if isinstance(user, Mapping) else {}
    username = user.get("username")
    groups = user.get("groups")
    extra = user.get("extra")
    nodes = extra.get(NODE_NAME_EXTRA) if isinstance(extra, Mapping) else None
    name, sub_resource = request.get("name"), request.get("subResource")
    return _Request(
        uid=uid,
        operation=str(operation),
        namespace=namespace if isinstance(namespace, str) else "",
        is_pod=bool(is_pod),
        obj=obj if isinstance(obj, Mapping) else None,
        old=old if isinstance(old, Mapping) else None,
        username=username if isinstance(username, str) else "",
        groups=frozenset(g for g in groups if isinstance(g, str)) if isinstance(groups, list) else frozenset(),
        name=name if isinstance(name, str) else "",
        sub_resource=sub_resource if isinstance(sub_resource, str) else "",
        node_names=tuple(n for n in nodes if isinstance(n, str) and n) if isinstance(nodes, list) else (),
    )


def _reply(uid: str, decision: _Decision, status: int = 200) -> Reply:
    response: dict[str, Any] = {"uid": uid, "allowed": decision.allowed}
    if not decision.allowed:
        response["status"] = {"code": decision.code, "message": decision.message}
    if decision.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(decision.patch, separators=(",", ":")).encode()).decode()
    if decision.warnings:
        response["warnings"] = list(decision.warnings)
    return Reply(status, {"apiVersion": API_VERSION, "kind": KIND, "response": response})


def _malformed(body: object, problem: str) -> Reply:
    uid = ""
    if isinstance(body, Mapping) and isinstance(body.get("request"), Mapping):
        raw = body["request"].get("uid")
        uid = raw if isinstance(raw, str) else ""
    return _reply(uid, _Decision(allowed=False, code=_MALFORMED, message=problem), status=_MALFORMED)


def internal_error(body: object, exc: BaseException) -> Reply:
    """The reply when the webhook itself fails: the pod is denied (fail closed), saying why."""
    message = f"internal error in the gpuslice webhook: {type(exc).__name__}: {exc}"
    reply = _malformed(body, message)
    reply.response["status"]["code"] = 500
    return Reply(200, reply.body)


def malformed(problem: str) -> Reply:
    """The reply to a body that could not even be read as JSON."""
    return _malformed(None, problem)


# ---------------------------------------------------------------- JSON Patch (RFC 6902) helpers


def pointer(*parts: str | int) -> str:
    """A JSON Pointer (RFC 6901): ``~`` becomes ``~0`` and ``/`` becomes ``~1`` in each part."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def env_entry(name: str, annotation: str) -> dict[str, Any]:
    """An env entry that kubelet fills from one of the pod's annotations."""
    path = f"metadata.annotations['{annotation}']"
    return {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}


# ---------------------------------------------------------------- pod inspection


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = pod.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    return annotations if isinstance(annotations, Mapping) else {}


def _spec(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = pod.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _output_annotations(pod: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    wanted = {prefix + k for k in POD_OUTPUT_KEYS}
    return {k: v for k, v in _annotations(pod).items() if k in wanted}


def _has_gpu_resource(container: Mapping[str, Any]) -> bool:
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        return False
    for section in ("limits", "requests"):
        values = resources.get(section)
        if not isinstance(values, Mapping):
            continue
        for name, value in values.items():
            gpu = name == "nvidia.com/gpu" or (isinstance(name, str) and name.startswith("nvidia.com/mig-"))
            if gpu and str(value).strip() not in ("0", ""):
                return True
    return False


def _containers(spec: Mapping[str, Any]) -> list[tuple[str, int, Mapping[str, Any]]]:
    out: list[tuple[str, int, Mapping[str, Any]]] = []
    for section in ("initContainers", "containers"):
        items = spec.get(section)
        if isinstance(items, list):
            out.extend((section, i, c) for i, c in enumerate(items) if isinstance(c, Mapping))
    return out


def gpu_containers(pod: Mapping[str, Any]) -> list[tuple[str, int, Mapping[str, Any]]]:
    """The containers that receive the GPU environment, as (section, index, container).

    With ``nvidia.com/*`` GPU resources: exactly the containers that request one. With an
    annotation request (per pod): every container and init container.
    """
    everything = _containers(_spec(pod))
    with_resource = [c for c in everything if _has_gpu_resource(c[2])]
    return with_resource or everything


def _wants_mps_env(gpu: GpuRequest) -> bool:
    shared = (GpuKind.SHARE, GpuKind.WHOLE)
    return gpu.kind in shared and any(m.control_daemon and gpu.allows_mode(m.name) for m in modes.registered())


def wanted_env(gpu: GpuRequest, prefix: str) -> list[dict[str, Any]]:
    """The env entries every GPU container of a pod with this request gets."""
    mps = _wants_mps_env(gpu)
    return [env_entry(name, prefix + key) for name, key, mps_only in ENV_FROM_ANNOTATIONS if mps or not mps_only]


def _env_ops(
    section: str, index: int, container: Mapping[str, Any], wanted: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    env = container.get("env")
    if not isinstance(env, list) or not env:
        return [{"op": "add", "path": pointer("spec", section, index, "env"), "value": list(wanted)}]
    ops: list[dict[str, Any]] = []
    for entry in wanted:
        matches = [j for j, e in enumerate(env) if isinstance(e, Mapping) and e.get("name") == entry["name"]]
        for j in matches:
            if env[j] != entry:
                ops.append({"op": "replace", "path": pointer("spec", section, index, "env", j), "value": entry})
        if not matches:
            ops.append({"op": "add", "path": pointer("spec", section, index, "env", "-"), "value": entry})
    return ops


def _share_ops(
    section: str, index: int, container: Mapping[str, Any], amounts: Mapping[str, str]
) -> list[dict[str, Any]]:
    """JSON Patch ops that set each ``resource: amount`` in the container's limits (and requests,
    if it has that resource there: an extended resource's request must equal its limit)."""
    if not amounts:
        return []
    resources = container.get("resources")
    base = ("spec", section, index, "resources")
    if not isinstance(resources, Mapping):
        return [{"op": "add", "path": pointer(*base), "value": {"limits": dict(amounts)}}]
    ops: list[dict[str, Any]] = []
    for part in ("limits", "requests"):
        values = resources.get(part)
        wanted = {r: a for r, a in amounts.items() if part == "limits" or (isinstance(values, Mapping) and r in values)}
        if not wanted:
            continue
        if not isinstance(values, Mapping):
            ops.append({"op": "add", "path": pointer(*base, part), "value": wanted})
            continue
        for resource, amount in wanted.items():
            if values.get(resource) != amount:
                ops.append({"op": "add", "path": pointer(*base, part, resource), "value": amount})
    return ops


def _resource_ops(pod: Mapping[str, Any], gpu: GpuRequest, config: WebhookConfig) -> list[dict[str, Any]]:
    """The node agent's share (one per GPU container) and the pod's GPU units
    (:func:`~scheduler.core.units.pod_units`, asked once: on the first GPU container, and
    removed from any other container, since kube-scheduler sums the containers' requests)."""
    units = pod_units(gpu) if config.units_resource else 0
    targets = [(section, index) for section, index, _ in gpu_containers(pod)]
    first = targets[0] if targets else None
    ops: list[dict[str, Any]] = []
    for section, index, container in _containers(_spec(pod)):
        amounts: dict[str, str] = {}
        if config.share_resource and (section, index) in targets:
            amounts[config.share_resource] = "1"
        if units and (section, index) == first:
            amounts[config.units_resource] = str(units)
        ops.extend(_share_ops(section, index, container, amounts))
        if config.units_resource and config.units_resource not in amounts:
            resources = container.get("resources")
            for part in ("limits", "requests"):
                values = resources.get(part) if isinstance(resources, Mapping) else None
                if isinstance(values, Mapping) and config.units_resource in values:
                    path = pointer("spec", section, index, "resources", part, config.units_resource)
                    ops.append({"op": "remove", "path": path})
    return ops


def _parse_pod(pod: Mapping[str, Any], config: WebhookConfig) -> GpuRequest:
    """The pod's GPU request (the core's one parser); raises RequestError."""
    return parse_pod(pod, config.prefix, config.policies).demand.gpu


def concerns_gpuslice(pod: Mapping[str, Any], prefix: str) -> bool:
    """Whether the pod has an annotation under the prefix or an ``nvidia.com/*`` GPU resource;
    the webhook leaves every other pod alone without parsing it."""
    if any(isinstance(k, str) and k.startswith(prefix) for k in _annotations(pod)):
        return True
    return any(_has_gpu_resource(c) for _, _, c in _containers(_spec(pod)))


# ---------------------------------------------------------------- decisions


def _mutate_pod(req: _Request, config: WebhookConfig) -> _Decision:
    assert req.obj is not None
    pod = req.obj
    decision = _Decision()
    for key in sorted(_output_annotations(pod, config.prefix)):
        decision.patch.append({"op": "remove", "path": pointer("metadata", "annotations", key)})
        decision.warnings.append(f"removed annotation {key}: only the gpuslice scheduler writes it")
    try:
        gpu = _parse_pod(pod, config)
    except RequestError as exc:
        return _Decision(allowed=False, code=_DENIED_INVALID, message=str(exc))
    if gpu.kind is GpuKind.NONE:
        return decision

    current = _spec(pod).get("schedulerName")
    if current in (None, "", KUBE_DEFAULT_SCHEDULER):
        decision.patch.append({"op": "add", "path": "/spec/schedulerName", "value": config.scheduler_name})
    elif current != config.scheduler_name:
        decision.warnings.append(
            f"spec.schedulerName is {current!r}: gpuslice will not place this pod, so its "
            f"GPU request ({gpu.describe()}) is not enforced"
        )
    wanted = wanted_env(gpu, config.prefix)
    for section, index, container in gpu_containers(pod):
        decision.patch.extend(_env_ops(section, index, container, wanted))
    decision.patch.extend(_resource_ops(pod, gpu, config))
    return decision


def _validate_create(req: _Request, config: WebhookConfig) -> _Decision:
    assert req.obj is not None
    pod = req.obj
    try:
        gpu = _parse_pod(pod, config)
    except RequestError as exc:
        return _Decision(allowed=False, code=_DENIED_INVALID, message=str(exc))
    forged = sorted(_output_annotations(pod, config.prefix))
    if forged:
        return _Decision(
            allowed=False,
            code=_DENIED_FORBIDDEN,
            message=f"annotations {', '.join(forged)} are written by the gpuslice scheduler only; "
            "remove them from the pod",
        )
    if gpu.kind is GpuKind.NONE:
        return _Decision()
    wanted = {e["name"]: e for e in wanted_env(gpu, config.prefix)}
    for section, index, container in gpu_containers(pod):
        env = container.get("env")
        for entry in env if isinstance(env, list) else []:
            if isinstance(entry, Mapping) and entry.get("name") in wanted and entry != wanted[entry["name"]]:
                return _Decision(
                    allowed=False,
                    code=_DENIED_FORBIDDEN,
                    message=f"spec.{section}[{index}].env {entry['name']}: set by gpuslice from the pod's "
                    f"allocation ({wanted[entry['name']]['valueFrom']['fieldRef']['fieldPath']}); "
                    "remove it from the container",
                )
    current = _spec(pod).get("schedulerName")
    if current != config.scheduler_name:
        return _Decision(
            warnings=[
                f"spec.schedulerName is {current!r}: gpuslice will not place this pod, so its "
                f"GPU request ({gpu.describe()}) is not enforced"
            ]
        )
    return _Decision()


def _validate_update(req: _Request, config: WebhookConfig) -> _Decision:
    assert req.obj is not None and req.old is not None
    before = _output_annotations(req.old, config.prefix)
    after = _output_annotations(req.obj, config.prefix)
    if before == after:
        return _Decision()
    if req.username in config.trusted_users or req.groups & config.trusted_groups:
        return _Decision()
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    return _Decision(
        allowed=False,
        code=_DENIED_FORBIDDEN,
        message=f"annotations {', '.join(changed)} are written by the gpuslice scheduler only; "
        f"user {req.username or '(unknown)'} may not change them",
    )


def mutate(body: object, config: WebhookConfig | None = None) -> Reply:
    """The mutating webhook: AdmissionReview v1 (a parsed JSON body) in, reply out."""
    config = config or WebhookConfig()
    try:
        req = _parse(body)
    except ReviewError as exc:
        return _malformed(body, str(exc))
    if not req.is_pod or req.operation != "CREATE" or req.obj is None:
        return _reply(req.uid, _Decision())
    if not concerns_gpuslice(req.obj, config.prefix):
        return _reply(req.uid, _Decision())
    return _reply(req.uid, _mutate_pod(req, config))


def share_resource_of(config: WebhookConfig) -> str:
    """The node agent's resource: the configured one, else ``<prefix>share`` (the agent's default),
    so a pod that asks for it is caught even where the webhook runs without the agent's setting."""
    return config.share_resource or config.prefix + "share"


def units_resource_of(config: WebhookConfig) -> str:
    """The GPU units' resource: the configured one, else ``<prefix>gpu-units`` (the agent's default)."""
    return config.units_resource or config.prefix + "gpu-units"


def _share_elsewhere(pod: Mapping[str, Any], config: WebhookConfig) -> _Decision | None:
    """A denial when a container asks for the agent's share resource or GPU units but gpuslice
    does not place the pod (units asked by such a pod would hold room gpuslice's pods need)."""
    current = _spec(pod).get("schedulerName")
    if current == config.scheduler_name:
        return None
    asked = ((share_resource_of(config), "share"), (units_resource_of(config), "GPU units"))
    for section, index, container in _containers(_spec(pod)):
        resources = container.get("resources")
        for part in ("limits", "requests"):
            values = resources.get(part) if isinstance(resources, Mapping) else None
            for resource, what in asked:
                if isinstance(values, Mapping) and str(values.get(resource, "0")).strip() not in ("0", ""):
                    return _Decision(
                        allowed=False,
                        code=_DENIED_FORBIDDEN,
                        message=f"spec.{section}[{index}].resources.{part} {resource}: only pods placed by "
                        f"spec.schedulerName {config.scheduler_name!r} may ask for the node agent's {what} "
                        f"(this pod names {current!r}); remove the resource or let gpuslice place the pod",
                    )
    return None


def validate(body: object, config: WebhookConfig | None = None) -> Reply:
    """The validating webhook: AdmissionReview v1 (a parsed JSON body) in, reply out."""
    config = config or WebhookConfig()
    try:
        req = _parse(body)
    except ReviewError as exc:
        return _malformed(body, str(exc))
    if not req.is_pod or req.obj is None:
        return _reply(req.uid, _Decision())
    if req.operation == "UPDATE":
        return _reply(req.uid, _validate_update(req, config))
    if req.operation != "CREATE":
        return _reply(req.uid, _Decision())
    denied = _share_elsewhere(req.obj, config)
    if denied is not None:
        return _reply(req.uid, denied)
    if not concerns_gpuslice(req.obj, config.prefix):
        return _reply(req.uid, _Decision())
    decision = _validate_create(req, config)
    if decision.allowed and config.quota_advice is not None:
        with contextlib.suppress(RequestError):  # a malformed request was denied above
            advice = config.quota_advice(req.namespace or "default", _parse_pod(req.obj, config))
            if advice is not None:
                decision.warnings.append(advice)
    return _reply(req.uid, decision)
