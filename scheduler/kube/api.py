"""The one module that calls the ``kubernetes`` client: every API call gpuslice makes, as plain JSON.

Objects never go through the client's generated models (they drop fields newer than the
client, and reading a Binding's answer into one raises): every call uses
``_preload_content=False`` and the body is parsed with ``json.loads``, so fields newer than
the client stay ordinary dict entries. Every client or transport
exception is wrapped into :mod:`scheduler.kube.errors`, raised ``from`` the cause.

:data:`API_CALLS` lists each call as ``(verb, apiGroup, resource)``, the rules the
ClusterRole must grant; every call site checks itself against it.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException, OpenApiException
from kubernetes.config.config_exception import ConfigException

from scheduler.core.quota import GROUP, VERSION

from .errors import ApiProtocolError, ApiUnavailableError, KubeConfigError, KubeError, status_error

API_CALLS: frozenset[tuple[str, str, str]] = frozenset(
    {
        ("list", "", "nodes"),
        ("watch", "", "nodes"),
        ("list", "", "pods"),
        ("watch", "", "pods"),
        ("get", "", "pods"),
        ("patch", "", "pods"),
        ("create", "", "pods/binding"),
        ("create", "", "events"),
        ("get", "", "configmaps"),
        ("list", "", "configmaps"),
        ("watch", "", "configmaps"),  # the node ledgers, followed: what gpuslice itself bound
        ("create", "", "configmaps"),
        ("update", "", "configmaps"),
        # GPU quotas (manifests/gpuquota-crd.yaml): followed, and their status kept current
        ("list", "gpuslice.io", "gpuquotas"),
        ("watch", "gpuslice.io", "gpuquotas"),
        ("patch", "gpuslice.io", "gpuquotas/status"),
    }
)

# Every call the node agent (scheduler.kube.nodeapi) makes, under its own service account.
AGENT_API_CALLS: frozenset[tuple[str, str, str]] = frozenset(
    {
        ("get", "", "nodes"),
        ("patch", "", "nodes"),
        ("list", "", "pods"),
        ("watch", "", "pods"),
        ("create", "", "events"),
        ("create", "", "pods/eviction"),  # the overrun guard, with overrun.action: evict only
        ("get", "", "configmaps"),  # gpuslice's ledger of its node, in gpuslice's namespace only (a Role)
    }
)

# Every call ``gpuslice defrag`` (scheduler.kube.evict) makes, under its own service account:
# the list it plans from, and the evictions of ``--apply``.
DEFRAG_API_CALLS: frozenset[tuple[str, str, str]] = frozenset(
    {
        ("list", "", "nodes"),
        ("list", "", "pods"),
        ("create", "", "pods/eviction"),
        ("list", "", "configmaps"),  # the node ledgers, in gpuslice's namespace only (a Role)
    }
)

MERGE_PATCH = "application/merge-patch+json"
WATCHED = ("nodes", "pods", "gpuquotas", "configmaps")  # configmaps: of one namespace
QUOTA_GROUP, QUOTA_VERSION = GROUP, VERSION  # the GPUQuota CRD's
GROUP_OF = {"gpuquotas": QUOTA_GROUP, "gpuquotas/status": QUOTA_GROUP}  # the rest: the core group

Json = dict[str, Any]


def _configuration(configuration: Any) -> Any:
    # gpuslice retries on its own terms (conflicts, relists); urllib3 retrying a read
    # that timed out would hide a stalled watch for three times as long.
    configuration.retries = False
    return configuration


def _wrap(call: str, exc: BaseException) -> KubeError:
    if isinstance(exc, ApiException):
        if not exc.status:  # the client's code for a TLS failure
            return ApiUnavailableError(call, str(exc.reason))
        return status_error(call, int(exc.status), exc.body, str(exc.reason or ""))
    if isinstance(exc, (urllib3.exceptions.HTTPError, OSError)):
        return ApiUnavailableError(call, f"{type(exc).__name__}: {exc}")
    return KubeError(call, f"the client refused the call: {type(exc).__name__}: {exc}")


# What the client and its transport raise; anything else is a bug and propagates.
_CLIENT_ERRORS = (OpenApiException, urllib3.exceptions.HTTPError, OSError, ValueError, TypeError)


class WatchStream:
    """The events of one watch request as dicts ``{"type", "object"}``; :meth:`close` ends it from any thread."""

    def __init__(self, call: str, response: Any) -> None:
        self._call = call
        self._response = response
        self._closed = False

    def __iter__(self) -> Iterator[Json]:
        buffer = b""
        try:
            for chunk in self._response.stream(amt=None, decode_content=True):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield self._event(line)
        except Exception as exc:
            if self._closed:
                return  # closed from another thread: the read fails in whatever way http.client fails
            if isinstance(exc, _CLIENT_ERRORS):
                raise _wrap(self._call, exc) from exc
            raise
        finally:
            self._response.close()
            self._response.release_conn()
        if buffer.strip():
            yield self._event(buffer)

    def _event(self, line: bytes) -> Json:
        try:
            event = json.loads(line)
        except ValueError as exc:
            raise ApiProtocolError(self._call, f"watch event is not JSON: {line[:120]!r}") from exc
        if (
            not isinstance(event, dict)
            or not isinstance(event.get("type"), str)
            or not isinstance(event.get("object"), dict)
        ):
            raise ApiProtocolError(self._call, f"watch event lacks 'type' or 'object': {line[:120]!r}")
        return event

    def close(self) -> None:
        self._closed = True
        # unblocks a read in progress in another thread; urllib3 raises ValueError or RuntimeError
        # when the connection is not in a state to shut down (not yet read from, already released)
        with contextlib.suppress(AttributeError, OSError, ValueError, RuntimeError):
            self._response.shutdown()
        self._response.close()


class KubeApi:
    """Every call gpuslice makes to the API server; each returns the object's JSON as a dict."""

    def __init__(self, api_client: Any, request_timeout_s: float = 5.0) -> None:
        self._client = api_client
        self._core: Any = k8s.CoreV1Api(api_client)
        self._custom: Any = k8s.CustomObjectsApi(api_client)
        self.request_timeout_s = request_timeout_s
        # what this client may call, and the name of that set (the node agent's: AGENT_API_CALLS)
        self.calls, self.calls_name = API_CALLS, "API_CALLS"

    # ------------------------------------------------------------ construction

    @classmethod
    def from_url(
        cls,
        url: str,
        token: str | None = None,
        ca_file: str | None = None,
        verify_tls: bool = True,
        request_timeout_s: float = 5.0,
    ) -> KubeApi:
        if not url.startswith(("http://", "https://")):
            raise KubeConfigError("", f"API server URL {url!r} must start with http:// or https://")
        configuration = k8s.Configuration(host=url.rstrip("/"))
        configuration.proxy = None  # an explicit URL is reached directly
        configuration.verify_ssl = verify_tls
        configuration.ssl_ca_cert = ca_file
        if token:
            configuration.api_key = {"BearerToken": token}
            configuration.api_key_prefix = {"BearerToken": "Bearer"}
        return cls(k8s.ApiClient(_configuration(configuration)), request_timeout_s)

    @classmethod
    def from_kubeconfig(
        cls, path: str | None = None, context: str | None = None, request_timeout_s: float = 5.0
    ) -> KubeApi:
        configuration = k8s.Configuration()
        try:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, context=context, client_configuration=configuration
            )
        except (ConfigException, OSError, ValueError, TypeError) as exc:
            where = path or "the default kubeconfig"
            raise KubeConfigError(
                "", f"cannot load {where}" + (f" (context {context})" if context else "") + f": {exc}"
            ) from exc
        return cls(k8s.ApiClient(_configuration(configuration)), request_timeout_s)

    @classmethod
    def in_cluster(cls, request_timeout_s: float = 5.0) -> KubeApi:
        configuration = k8s.Configuration()
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except (ConfigException, OSError, ValueError) as exc:
            raise KubeConfigError("", f"no in-cluster service account configuration: {exc}") from exc
        return cls(k8s.ApiClient(_configuration(configuration)), request_timeout_s)

    def close(self) -> None:
        with contextlib.suppress(*_CLIENT_ERRORS):
            self._client.close()

    # ------------------------------------------------------------ the calls

    def _raw(
        self, verb: str, resource: str, method: Callable[..., Any], *args: Any, timeout: Any = None, **kwargs: Any
    ) -> Any:
        """One call, with the response unread; its (verb, resource) must be in :data:`API_CALLS`."""
        if (verb, GROUP_OF.get(resource, ""), resource) not in self.calls:
            raise AssertionError(f"API call {verb} {resource} is missing from {self.calls_name}")
        call = f"{verb} {resource}"
        try:
            return method(
                *args,
                _preload_content=False,
                _request_timeout=timeout if timeout is not None else self.request_timeout_s,
                **kwargs,
            )
        except _CLIENT_ERRORS as exc:
            raise _wrap(call, exc) from exc

    def _json(self, verb: str, resource: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Json:
        call = f"{verb} {resource}"
        response = self._raw(verb, resource, method, *args, **kwargs)
        try:
            data = response.read()
        except _CLIENT_ERRORS as exc:
            raise _wrap(call, exc) from exc
        finally:
            response.release_conn()
        try:
            body = json.loads(data) if data else {}
        except ValueError as exc:
            raise ApiProtocolError(call, f"response is not JSON: {data[:120]!r}") from exc
        if not isinstance(body, dict):
            raise ApiProtocolError(call, f"response is not a JSON object: {data[:120]!r}")
        return body

    def _lister(self, resource: str, namespace: str | None = None) -> Callable[..., Any]:
        if resource == "configmaps" and namespace:
            return functools.partial(self._core.list_namespaced_config_map, namespace)
        if resource == "nodes":
            return self._core.list_node  # type: ignore[no-any-return]
        if resource == "pods":
            return self._core.list_pod_for_all_namespaces  # type: ignore[no-any-return]
        if resource == "gpuquotas":
            return functools.partial(self._custom.list_cluster_custom_object, QUOTA_GROUP, QUOTA_VERSION, resource)
        raise ValueError(f"resource {resource!r}: accepted: {', '.join(WATCHED)} (configmaps with a namespace)")

    def list(
        self,
        resource: str,
        *,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
        namespace: str | None = None,
        label_selector: str | None = None,
    ) -> Json:
        """A ``List`` of nodes, of pods in all namespaces, or of one namespace's configmaps (one page
        when ``limit`` is set)."""
        options: dict[str, Any] = {}
        if field_selector:
            options["field_selector"] = field_selector
        if label_selector:
            options["label_selector"] = label_selector
        if limit:
            options["limit"] = limit
        if continue_token:
            options["_continue"] = continue_token
        return self._json("list", resource, self._lister(resource, namespace), **options)

    def watch(
        self,
        resource: str,
        resource_version: str,
        timeout_s: int,
        read_slack_s: float = 5.0,
        field_selector: str | None = None,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
    ) -> WatchStream:
        """Changes to nodes, pods or one namespace's configmaps after ``resource_version``; the server
        ends the stream after ``timeout_s``, and a stream silent for ``read_slack_s`` longer than that
        is treated as broken."""
        extra = {"field_selector": field_selector} if field_selector else {}
        if label_selector:
            extra["label_selector"] = label_selector
        response = self._raw(
            "watch",
            resource,
            self._lister(resource, namespace),
            timeout=(self.request_timeout_s, timeout_s + read_slack_s),
            watch=True,
            resource_version=resource_version,
            timeout_seconds=timeout_s,
            allow_watch_bookmarks=True,
            **extra,
        )
        return WatchStream(f"watch {resource}", response)

    def get_pod(self, namespace: str, name: str) -> Json:
        return self._json("get", "pods", self._core.read_namespaced_pod, name, namespace)

    def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> Json:
        """A JSON merge patch (RFC 7386): ``None`` values delete keys."""
        return self._json(
            "patch", "pods", self._core.patch_namespaced_pod, name, namespace, dict(patch), _content_type=MERGE_PATCH
        )

    def bind_pod(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        # _preload_content=False (in _raw): reading the answer into the client's model raises on a
        # successful bind (its V1Binding requires a target the answer does not carry).
        self._json("create", "pods/binding", self._core.create_namespaced_pod_binding, name, namespace, dict(body))

    def evict_pod(self, namespace: str, name: str, uid: str = "", dry_run: bool = False) -> None:
        """An Eviction (policy/v1) of the pod: the API server deletes it unless a
        PodDisruptionBudget forbids it now (HTTP 429). With ``uid``, only that very pod (a pod
        recreated under the same name is left alone: HTTP 409); with ``dry_run``, every check
        and no change."""
        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        if uid:
            body["deleteOptions"] = {"preconditions": {"uid": uid}}
        extra = {"dry_run": "All"} if dry_run else {}
        self._json("create", "pods/eviction", self._core.create_namespaced_pod_eviction, name, namespace, body, **extra)

    def patch_quota_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> Json:
        """Merge-patch a GPUQuota's ``status`` (its status subresource: the spec is never touched)."""
        return self._json(
            "patch",
            "gpuquotas/status",
            self._custom.patch_namespaced_custom_object_status,
            QUOTA_GROUP,
            QUOTA_VERSION,
            namespace,
            "gpuquotas",
            name,
            {"status": dict(status)},
            _content_type=MERGE_PATCH,
        )

    def get_node(self, name: str) -> Json:
        return self._json("get", "nodes", self._core.read_node, name)

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> Json:
        """A JSON merge patch (RFC 7386) of a Node: ``None`` values delete keys."""
        return self._json("patch", "nodes", self._core.patch_node, name, dict(patch), _content_type=MERGE_PATCH)

    def create_event(self, namespace: str, body: Mapping[str, Any]) -> Json:
        return self._json("create", "events", self._core.create_namespaced_event, namespace, dict(body))

    def get_configmap(self, namespace: str, name: str) -> Json:
        return self._json("get", "configmaps", self._core.read_namespaced_config_map, name, namespace)

    def list_configmaps(self, namespace: str, label_selector: str) -> Json:
        """The ConfigMaps of one namespace that carry the labels (the node ledgers, for the sweep)."""
        return self._json(
            "list", "configmaps", self._core.list_namespaced_config_map, namespace, label_selector=label_selector
        )

    def create_configmap(self, namespace: str, body: Mapping[str, Any]) -> Json:
        return self._json("create", "configmaps", self._core.create_namespaced_config_map, namespace, dict(body))

    def replace_configmap(self, namespace: str, name: str, body: Mapping[str, Any]) -> Json:
        """A PUT; with ``metadata.resourceVersion`` set, the API server refuses it (409) if the object changed."""
        return self._json("update", "configmaps", self._core.replace_namespaced_config_map, name, namespace, dict(body))
