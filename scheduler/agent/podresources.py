"""The kubelet's pod-resources API (v1 ``List``) over its unix socket: which pod holds which devices."""

from __future__ import annotations

from pathlib import Path

import grpc

from scheduler.core.errors import GpusliceError

from .proto import podresources_pb2 as pb
from .proto import podresources_pb2_grpc as pb_grpc


class PodResourcesError(GpusliceError):
    """The kubelet's pod-resources socket did not answer."""


class KubeletPodResources:
    def __init__(self, socket: str, timeout_s: float = 5.0) -> None:
        self.socket = Path(socket)
        self._timeout = timeout_s

    def list(self) -> dict[str, dict[str, dict[str, tuple[str, ...]]]]:
        try:
            with grpc.insecure_channel(f"unix://{self.socket.resolve()}") as channel:
                stub = pb_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
                reply = stub.List(pb.ListPodResourcesRequest(), timeout=self._timeout)
        except grpc.RpcError as exc:
            raise PodResourcesError(f"pod-resources List on {self.socket}: {exc.details() or exc}") from exc
        out: dict[str, dict[str, dict[str, tuple[str, ...]]]] = {}
        for pod in reply.pod_resources:
            containers = out.setdefault(f"{pod.namespace}/{pod.name}", {})
            for container in pod.containers:
                devices = containers.setdefault(container.name, {})
                for group in container.devices:
                    devices[group.resource_name] = (*devices.get(group.resource_name, ()), *group.device_ids)
        return out
