"""A real Kubernetes v1.37 control plane on loopback for the tests: embedded etcd, kube-apiserver,
kube-controller-manager and kube-scheduler, each a process of the binary that
scripts/controlplane.sh builds from e2e/controlplane (Go). No kubelet runs: nodes are API
objects and `mark_running` plays the kubelet's part where a test needs it.

Every call goes to 127.0.0.1 over TLS checked against the control plane's own CA."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "controlplane.sh"
NO_GO = 3  # scripts/controlplane.sh's exit status where no Go toolchain is on PATH

ADMIN_TOKEN = "gpuslice-e2e-admin"
CONTROLLER_MANAGER_TOKEN = "gpuslice-e2e-controller-manager"

# Controllers of kube-controller-manager the tests rely on. Node lifecycle is left out on
# purpose: no kubelet posts node status, so it would taint every node unreachable.
CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "daemonset-controller",
    "job-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "root-ca-certificate-publisher-controller",
    "disruption-controller",
    "clusterrole-aggregation-controller",  # the built-in edit and view roles
)


class ControlPlaneUnavailable(Exception):
    """The control plane cannot be built here (no Go toolchain); the message says why."""


def build() -> Path:
    """The control plane's binary, built (or found up to date) by scripts/controlplane.sh."""
    done = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, check=False)
    if done.returncode == NO_GO:
        raise ControlPlaneUnavailable(done.stderr.strip())
    if done.returncode != 0:
        raise RuntimeError(f"scripts/controlplane.sh failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for(what: str, check: Any, timeout: float = 60.0, interval: float = 0.1) -> Any:
    """Call ``check`` until it returns something truthy; its value. AssertionError on timeout."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


class ApiError(Exception):
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"{status}: {body.get('message', body)}")
        self.status = status
        self.body = body


@dataclass
class Client:
    """A small REST client of the API server: one identity (a bearer token), JSON in and out."""

    url: str
    token: str
    ca: Path
    _http: httpx.Client = field(init=False, repr=False)
    _resources: dict[tuple[str, str], tuple[str, bool]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._http = httpx.Client(
            base_url=self.url,
            verify=ssl.create_default_context(cafile=str(self.ca)),
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=30.0,
        )

    def close(self) -> None:
        self._http.close()

    @property
    def http(self) -> httpx.Client:
        """The HTTP client itself (this identity, the CA checked), for calls whose raw answer matters."""
        return self._http

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json", **params: Any
    ) -> Any:
        content = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        headers = {"Content-Type": content_type} if body is not None else {}
        answer = self._http.request(method, path, content=content, headers=headers, params=params or None)
        data = (
            answer.json()
            if answer.content and answer.headers.get("content-type", "").startswith("application/json")
            else {}
        )
        if answer.status_code >= 400:
            raise ApiError(answer.status_code, data if isinstance(data, dict) else {"message": str(data)})
        return data

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, **params)

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def delete(self, path: str, **params: Any) -> Any:
        return self.request("DELETE", path, **params)

    def merge_patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, body, "application/merge-patch+json")

    def resource(self, api_version: str, kind: str) -> tuple[str, bool]:
        """The collection path prefix and namespacing of ``kind``, from the API's discovery."""
        key = (api_version, kind)
        if key not in self._resources:
            base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            for entry in self.get(base)["resources"]:
                if "/" not in entry["name"]:
                    self._resources[(api_version, entry["kind"])] = (f"{base}/{entry['name']}", entry["namespaced"])
        if key not in self._resources:
            raise ValueError(f"the API server serves no {kind} in {api_version}")
        return self._resources[key]

    def path_of(self, obj: dict[str, Any], name: bool = True) -> str:
        collection, namespaced = self.resource(obj["apiVersion"], obj["kind"])
        meta = obj["metadata"]
        if namespaced:
            base, plural = collection.rsplit("/", 1)
            collection = f"{base}/namespaces/{meta.get('namespace', 'default')}/{plural}"
        return f"{collection}/{meta['name']}" if name else collection

    def apply(self, obj: dict[str, Any], manager: str = "gpuslice-e2e") -> Any:
        """Server-side apply, as `kubectl apply --server-side` does."""
        return self.request(
            "PATCH",
            self.path_of(obj),
            yaml.safe_dump(obj).encode(),
            "application/apply-patch+yaml",
            fieldManager=manager,
            force="true",
        )

    def pods(self, namespace: str | None = None, **params: Any) -> list[dict[str, Any]]:
        path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
        items: list[dict[str, Any]] = self.get(path, **params)["items"]
        return items

    def account_token(self, namespace: str, account: str, seconds: int = 3600) -> str:
        """A token of a ServiceAccount through the TokenRequest API."""
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": seconds},
        }
        answer = self.post(f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", request)
        return str(answer["status"]["token"])

    def events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.get(
            f"/api/v1/namespaces/{namespace}/events", fieldSelector=f"involvedObject.name={name}"
        )["items"]
        return items


def mark_running(client: Client, pod: dict[str, Any]) -> None:
    """Play the kubelet for a bound pod: status Running, Ready, with a pod IP."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status = {
        "status": {
            "phase": "Running",
            "podIP": "10.244.0.10",
            "startTime": now,
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
        }
    }
    meta = pod["metadata"]
    client.merge_patch(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status", status)


def end_pod(client: Client, pod: dict[str, Any]) -> None:
    """Delete a pod at once, as its kubelet would once its containers stopped."""
    meta = pod["metadata"]
    with contextlib.suppress(ApiError):
        client.delete(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", gracePeriodSeconds=0)


def end_terminating(client: Client, namespace: str) -> list[str]:
    """Play the kubelets for pods being deleted (a preemption's victims, say): delete each at
    once, as its kubelet would once its containers stopped. The names of the pods ended."""
    ended = []
    for pod in client.pods(namespace):
        if pod["metadata"].get("deletionTimestamp"):
            end_pod(client, pod)
            ended.append(pod["metadata"]["name"])
    return ended


def kubeconfig(path: Path, url: str, ca: Path, token: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": url, "certificate-authority": str(ca)}}],
        "users": [{"name": "e2e", "user": {"token": token}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "e2e"}}],
        "current-context": "e2e",
    }
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


@dataclass
class ControlPlane:
    """The processes of one control plane, their ports and files, under ``workdir``."""

    binary: Path
    workdir: Path
    service_map: dict[str, str] = field(default_factory=dict)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    clients: dict[str, Client] = field(default_factory=dict)
    apiserver_port: int = field(default_factory=free_port)
    etcd_port: int = field(default_factory=free_port)
    etcd_peer_port: int = field(default_factory=free_port)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def certs(self) -> Path:
        return self.workdir / "certs"

    @property
    def ca(self) -> Path:
        return self.certs / "ca.crt"

    def client(self, token: str = ADMIN_TOKEN) -> Client:
        """A client as ``token``'s identity (one per token, closed with the control plane)."""
        if token not in self.clients:
            self.clients[token] = Client(self.url, token, self.ca)
        return self.clients[token]

    def spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        log = (self.workdir / f"{name}.log").open("ab")
        self.processes[name] = subprocess.Popen(
            [str(self.binary), *args], stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
        log.close()

    def log(self, name: str) -> str:
        return (self.workdir / f"{name}.log").read_text(encoding="utf-8", errors="replace")

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(self.binary), "certs", str(self.certs)], check=True)
        tokens = self.workdir / "tokens.csv"
        tokens.write_text(
            f'{ADMIN_TOKEN},gpuslice-e2e-admin,1,"system:masters"\n'
            f"{CONTROLLER_MANAGER_TOKEN},system:kube-controller-manager,2\n",
            encoding="utf-8",
        )
        self.start_etcd()
        self.start_apiserver()
        self.start_controller_manager()

    def start_etcd(self) -> None:
        self.spawn(
            "etcd",
            [
                "etcd",
                str(self.workdir / "etcd"),
                f"http://127.0.0.1:{self.etcd_port}",
                f"http://127.0.0.1:{self.etcd_peer_port}",
            ],
        )

    def start_apiserver(self, *extra_flags: str) -> None:
        """kube-apiserver with the tier's flags, then ``extra_flags`` (``--watch-cache=false``)."""
        certs = self.certs
        self.spawn(
            "kube-apiserver",
            [
                "kube-apiserver",
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.apiserver_port}",
                "--advertise-address=127.0.0.1",
                "--endpoint-reconciler-type=none",
                "--service-cluster-ip-range=10.96.0.0/16",
                f"--tls-cert-file={certs / 'serving.crt'}",
                f"--tls-private-key-file={certs / 'serving.key'}",
                f"--cert-dir={certs}",
                f"--token-auth-file={self.workdir / 'tokens.csv'}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction,PodSecurity,MutatingAdmissionWebhook,"
                "ValidatingAdmissionWebhook,ValidatingAdmissionPolicy",
                "--allow-privileged=true",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={certs / 'sa.key'}",
                f"--service-account-signing-key-file={certs / 'sa.key'}",
                "--max-requests-inflight=2000",
                "--max-mutating-requests-inflight=1000",
                "--profiling=false",
                *extra_flags,
            ],
            env={"GPUSLICE_SERVICE_MAP": ",".join(f"{k}={v}" for k, v in self.service_map.items())},
        )
        self.wait_ready()

    def etcd_revision(self) -> int:
        """etcd's current revision (the newest resourceVersion of any object), through its JSON gateway."""
        answer = httpx.post(f"http://127.0.0.1:{self.etcd_port}/v3/kv/range", json={"key": "AA=="}, timeout=10)
        answer.raise_for_status()
        return int(answer.json()["header"]["revision"])

    def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision, as the API server does every 5
        minutes: a watch from an older resourceVersion can no longer be served. The revision."""
        revision = self.etcd_revision()
        answer = httpx.post(
            f"http://127.0.0.1:{self.etcd_port}/v3/kv/compaction",
            json={"revision": str(revision), "physical": True},
            timeout=30,
        )
        answer.raise_for_status()
        return revision

    def wait_ready(self, timeout: float = 90.0) -> None:
        def ready() -> bool:
            process = self.processes["kube-apiserver"]
            if process.poll() is not None:
                raise RuntimeError(
                    f"kube-apiserver exited ({process.returncode}):\n{self.log('kube-apiserver')[-4000:]}"
                )
            try:
                answer = httpx.get(
                    f"{self.url}/readyz",
                    verify=ssl.create_default_context(cafile=str(self.ca)),
                    headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                    timeout=2,
                )
            except httpx.HTTPError:
                return False
            return answer.status_code == 200

        wait_for("kube-apiserver /readyz", ready, timeout=timeout, interval=0.2)

    def start_controller_manager(self) -> None:
        config = kubeconfig(self.workdir / "controller-manager.kubeconfig", self.url, self.ca, ADMIN_TOKEN)
        self.spawn(
            "kube-controller-manager",
            [
                "kube-controller-manager",
                f"--kubeconfig={config}",
                "--secure-port=0",
                "--leader-elect=false",
                f"--controllers={','.join(CONTROLLERS)}",
                f"--service-account-private-key-file={self.certs / 'sa.key'}",
                f"--root-ca-file={self.ca}",
                "--kube-api-qps=500",
                "--kube-api-burst=1000",
                "--concurrent-deployment-syncs=20",
                "--concurrent-replicaset-syncs=20",
                "--concurrent-gc-syncs=40",
            ],
        )

    def start_scheduler(self, config_text: str, token: str, name: str = "kube-scheduler") -> None:
        """The real kube-scheduler with ``config_text`` (a KubeSchedulerConfiguration), as the
        identity of ``token``."""
        access = kubeconfig(self.workdir / f"{name}.kubeconfig", self.url, self.ca, token)
        # With --config, v1.37 reads the kubeconfig from the configuration only (in a pod, the
        # in-cluster account stands in for it): its path is added here.
        config = yaml.safe_load(config_text)
        config.setdefault("clientConnection", {})["kubeconfig"] = str(access)
        config_file = self.workdir / f"{name}.yaml"
        config_file.write_text(yaml.safe_dump(config), encoding="utf-8")
        self.spawn(name, ["kube-scheduler", f"--config={config_file}", "--secure-port=0"])
        process = self.processes[name]
        try:
            process.wait(timeout=3)
        except subprocess.TimeoutExpired:
            return
        raise RuntimeError(f"{name} exited ({process.returncode}):\n{self.log(name)[-4000:]}")

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 20.0) -> None:
        process = self.processes.pop(name, None)
        if process is None or process.poll() is not None:
            return
        process.send_signal(sig)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def stop_all(self) -> None:
        for client in self.clients.values():
            client.close()
        self.clients.clear()
        for name in reversed(list(self.processes)):
            self.stop(name)


@contextlib.contextmanager
def running(binary: Path, workdir: Path, service_map: dict[str, str]) -> Iterator[ControlPlane]:
    plane = ControlPlane(binary, workdir, dict(service_map))
    try:
        plane.start()
        yield plane
    finally:
        plane.stop_all()
