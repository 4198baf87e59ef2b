"""gpuslice as the manifests deploy it, but on the host: the shipped manifests applied to the
control plane, the caBundle set as manifests/tls/make-serving-cert.sh sets it, `gpuslice serve`
with the ConfigMap's settings and a TokenRequest token of ServiceAccount gpuslice/gpuslice, and
the real kube-scheduler with the ConfigMap's KubeSchedulerConfiguration, in which only the
extender's address (and the CA file's path on this host) change."""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import sys
from base64 import b64encode
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from scheduler.core.errors import GpusliceError
from scheduler.core.k8s import parse_node
from scheduler.core.units import node_units
from tests.deploy.manifests import MANIFESTS
from tests.e2e.controlplane import ApiError, Client, ControlPlane, kubeconfig, wait_for
from tests.e2e.kustomize import render

NAMESPACE = "gpuslice"
ACCOUNT = "gpuslice"
SHARE_RESOURCE = "gpuslice.io/share"
SHARE_SLOTS = "128"  # what the agent advertises by default (shareSlots)
UNITS_RESOURCE = "gpuslice.io/gpu-units"  # the GPU units (scheduler.core.units) the agent advertises


def shipped() -> list[dict[str, Any]]:
    return render(MANIFESTS)


def config_map(objects: list[dict[str, Any]]) -> dict[str, str]:
    (found,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "gpuslice-config"]
    data: dict[str, str] = found["data"]
    return data


def apply_all(client: Client, objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        client.apply(obj)


def set_ca_bundle(client: Client, ca: Path) -> None:
    """Both webhook configurations' caBundle, as make-serving-cert.sh patches it."""
    bundle = b64encode(ca.read_bytes()).decode()
    for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        path = f"/apis/admissionregistration.k8s.io/v1/{kind}/gpuslice"
        count = len(client.get(path)["webhooks"])
        patch = [{"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": bundle} for i in range(count)]
        client.request("PATCH", path, patch, "application/json-patch+json")


def put_node(client: Client, node: dict[str, Any]) -> None:
    """Create (or replace) a Node and its status, as its kubelet and the agent would publish them."""
    path = f"/api/v1/nodes/{node['metadata']['name']}"
    body = {k: v for k, v in node.items() if k != "status"}
    try:
        client.post("/api/v1/nodes", body)
    except ApiError as exc:
        if exc.status != 409:
            raise
        client.merge_patch(path, body)
    status = dict(node.get("status") or {})
    advertised = {SHARE_RESOURCE: SHARE_SLOTS, **gpu_units(node)}
    for key in ("allocatable", "capacity"):
        status[key] = {**status.get("allocatable", {}), **status.get(key, {}), **advertised}
    client.merge_patch(f"{path}/status", {"status": status})
    # The API server's TaintNodesByCondition admission gives a new Node the not-ready taint; the
    # node lifecycle controller lifts it once the kubelet reports Ready. No kubelet runs here.
    client.merge_patch(path, {"spec": {"taints": node.get("spec", {}).get("taints") or None}})


def gpu_units(node: dict[str, Any]) -> dict[str, str]:
    """The GPU units the node's agent would advertise (scheduler.core.units), from its inventory
    as gpuslice reads it; none for a node gpuslice cannot read (no GPUs it serves)."""
    try:
        parsed = parse_node(node, "gpuslice.io/")
    except GpusliceError:
        return {}
    return {UNITS_RESOURCE: str(node_units(parsed))} if parsed.devices else {}


def tls_context(ca: Path) -> ssl.SSLContext:
    """Checks the chain against ``ca``; the certificate names the Service, not 127.0.0.1."""
    context = ssl.create_default_context(cafile=str(ca))
    context.check_hostname = False
    return context


@dataclass
class Gpuslice:
    """`gpuslice serve` and the kube-scheduler beside it, as processes on the host."""

    plane: ControlPlane
    port: int
    tls: Path  # ca.crt, tls.crt, tls.key
    workdir: Path
    settings: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self, policy: str | None = None, kube: dict[str, Any] | None = None) -> None:
        """`gpuslice serve` with the ConfigMap's settings; ``policy`` and ``kube`` (settings of the
        Kubernetes backend, such as ``watch_timeout_s``) replace theirs where given."""
        settings = yaml.safe_load(self.settings["gpuslice.yaml"])
        settings.update(
            host="127.0.0.1", port=self.port, tls_cert=str(self.tls / "tls.crt"), tls_key=str(self.tls / "tls.key")
        )
        if policy is not None:
            settings["policy"] = {"name": policy}
        if kube:
            settings["kube"] = {**settings.get("kube", {}), **kube}
        config = self.workdir / "gpuslice.yaml"
        config.write_text(yaml.safe_dump(settings), encoding="utf-8")
        token = self.plane.client().account_token(NAMESPACE, ACCOUNT)
        access = kubeconfig(self.workdir / "gpuslice.kubeconfig", self.plane.url, self.plane.ca, token)
        gpuslice = Path(sys.executable).parent / "gpuslice"
        log = (self.workdir / "gpuslice.log").open("ab")
        self.process = subprocess.Popen(
            [str(gpuslice), "serve", "--config", str(config), "--kubeconfig", str(access)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                "GPUSLICE_NAMESPACE": NAMESPACE,
                "GPUSLICE_SERVICE_ACCOUNT": ACCOUNT,
                "GPUSLICE_SHARE_RESOURCE": SHARE_RESOURCE,
                "GPUSLICE_UNITS_RESOURCE": UNITS_RESOURCE,
                **self.env,
            },
        )
        log.close()
        self.wait_ready()

    def wait_ready(self, timeout: float = 60.0) -> None:
        context = tls_context(self.tls / "ca.crt")

        def ready() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"gpuslice serve exited ({self.process.returncode}):\n{self.log()[-4000:]}")
            try:
                return httpx.get(f"{self.url}/readyz", verify=context, timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for("gpuslice /readyz", ready, timeout=timeout, interval=0.2)

    def log(self) -> str:
        return (self.workdir / "gpuslice.log").read_text(encoding="utf-8", errors="replace")

    def debug(self, path: str) -> Any:
        """gpuslice's ``/debug`` view at ``path`` (served to loopback clients)."""
        answer = httpx.get(f"{self.url}{path}", verify=tls_context(self.tls / "ca.crt"), timeout=10)
        answer.raise_for_status()
        return answer.json()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(sig)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def scheduler_config(self) -> str:
        """The shipped KubeSchedulerConfiguration, the extender's urlPrefix pointed at this
        gpuslice and its CA file's path the one on this host: nothing else changes."""
        config = yaml.safe_load(self.settings["scheduler-config.yaml"])
        (extender,) = config["extenders"]
        extender["urlPrefix"] = self.url
        extender["tlsConfig"]["caFile"] = str(self.tls / "ca.crt")
        return str(yaml.safe_dump(config))

    def start_scheduler(self) -> None:
        token = self.plane.client().account_token(NAMESPACE, ACCOUNT)
        self.plane.start_scheduler(self.scheduler_config(), token)
