"""A small keep-alive HTTP client for the service: the demo, ``gpuslice inspect``, the
benchmark driver and the tests play kube-scheduler's part with it."""

from __future__ import annotations

import http.client
import ssl
import threading
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import orjson

from scheduler.core.errors import GpusliceError


class ServiceError(GpusliceError):
    """The service could not be reached or answered something unexpected."""

    exit_code = 1


class ExtenderClient:
    def __init__(self, url: str, url_prefix: str = "", timeout: float = 10.0) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ServiceError(f"URL must look like http://127.0.0.1:8686, got {url!r}")
        self.url = url.rstrip("/")
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._https = parts.scheme == "https"
        self._prefix = url_prefix.rstrip("/")
        self._timeout = timeout
        self._local = threading.local()  # one connection per thread
        self._all: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _connection(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            if self._https:
                # The demo talks to itself, often with a self-signed certificate.
                context = ssl.create_default_context()
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
                conn = http.client.HTTPSConnection(self._host, self._port, timeout=self._timeout, context=context)
            else:
                conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        for attempt in (0, 1):
            conn = self._connection()
            try:
                conn.request(method, path, body=body, headers=headers)
                response = conn.getresponse()
                return response.status, response.read()
            except (ConnectionError, http.client.HTTPException, OSError) as exc:
                conn.close()
                self._local.conn = None
                if attempt:
                    raise ServiceError(f"cannot reach gpuslice at {self.url}: {exc}") from exc
        raise AssertionError("unreachable")

    def post(self, verb: str, payload: Any) -> Any:
        body = payload if isinstance(payload, bytes) else orjson.dumps(payload)
        status, data = self.request("POST", f"{self._prefix}/{verb}", body)
        if status != 200:
            raise ServiceError(f"{verb}: HTTP {status}: {data[:200]!r}")
        return orjson.loads(data)

    def get(self, path: str) -> Any:
        status, data = self.request("GET", path)
        if status == 404:
            raise ServiceError(orjson.loads(data).get("error", f"{path}: not found"))
        if status != 200:
            raise ServiceError(f"GET {path}: HTTP {status}")
        return orjson.loads(data)

    # ------------------------------------------------------------ kube-scheduler's calls

    def filter(
        self,
        pod: Mapping[str, Any],
        names: Sequence[str] | None = None,
        nodes: Sequence[Mapping[str, Any]] | None = None,
    ) -> Any:
        return self.post("filter", extender_args(pod, names, nodes))

    def prioritize(
        self,
        pod: Mapping[str, Any],
        names: Sequence[str] | None = None,
        nodes: Sequence[Mapping[str, Any]] | None = None,
    ) -> Any:
        return self.post("prioritize", extender_args(pod, names, nodes))

    def bind(self, pod: Mapping[str, Any], node: str) -> str:
        meta = pod.get("metadata") or {}
        result = self.post(
            "bind",
            {
                "PodName": meta.get("name"),
                "PodNamespace": meta.get("namespace") or "default",
                "PodUID": meta.get("uid") or "",
                "Node": node,
            },
        )
        return str(result.get("Error") or "")

    def close(self) -> None:
        """Close every thread's connection."""
        with self._lock:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()
        self._local = threading.local()


def extender_args(
    pod: Mapping[str, Any], names: Sequence[str] | None = None, nodes: Sequence[Mapping[str, Any]] | None = None
) -> dict[str, Any]:
    """ExtenderArgs as kube-scheduler sends it: NodeNames, or full Nodes when given."""
    if nodes is not None:
        return {"Pod": pod, "Nodes": {"metadata": {}, "items": list(nodes)}, "NodeNames": None}
    return {"Pod": pod, "Nodes": None, "NodeNames": list(names or [])}
