"""A fake kubelet that speaks the real device plugin API (v1beta1) and pod-resources API (v1) over
unix sockets it creates, as the kubelet does.

It serves ``Registration`` on ``<dir>/kubelet.sock``; on ``Register`` it dials the plugin's
socket, reads its options and follows ``ListAndWatch``. ``admit(pod)`` plays the kubelet's
admission of one pod: one ``Allocate`` per container that requests the resource (init
containers first), each with a free device ID; an error fails the pod (phase Failed,
``UnexpectedAdmissionError``), as the kubelet's ``rejectPod`` does. ``restart()`` removes
every socket in the directory and serves a new ``kubelet.sock``. The pod-resources socket
answers ``List`` from what was allocated.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from scheduler.agent.proto import deviceplugin_pb2 as pb
from scheduler.agent.proto import deviceplugin_pb2_grpc as pb_grpc
from scheduler.agent.proto import podresources_pb2 as pr
from scheduler.agent.proto import podresources_pb2_grpc as pr_grpc


@dataclass
class Plugin:
    resource: str
    endpoint: str
    options: Any
    devices: list[str] = field(default_factory=list)
    health: dict[str, str] = field(default_factory=dict)
    updates: int = 0


class _Registration(pb_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, kubelet: FakeKubelet) -> None:
        self._kubelet = kubelet

    def Register(self, request: Any, context: Any) -> Any:
        if request.version != "v1beta1":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version}")
        self._kubelet.registered(request)
        return pb.Empty()


class _PodResources(pr_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, kubelet: FakeKubelet) -> None:
        self._kubelet = kubelet

    def List(self, request: Any, context: Any) -> Any:
        out = []
        for key, containers in sorted(self._kubelet.assigned.items()):
            namespace, name = key.split("/", 1)
            out.append(
                pr.PodResources(
                    name=name,
                    namespace=namespace,
                    containers=[
                        pr.ContainerResources(
                            name=c,
                            devices=[pr.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in d.items()],
                        )
                        for c, d in containers.items()
                    ],
                )
            )
        return pr.ListPodResourcesResponse(pod_resources=out)


class FakeKubelet:
    def __init__(self, directory: Path, pod_resources: Path, on_reject: Callable[[str, str], None]) -> None:
        self.directory = directory
        self.pod_resources_socket = pod_resources
        self._on_reject = on_reject
        self.registrations: list[Any] = []
        self.plugin: Plugin | None = None
        self.assigned: dict[str, dict[str, dict[str, list[str]]]] = {}  # pod -> container -> resource -> ids
        self.answers: dict[tuple[str, str], Any] = {}  # (pod, container) -> ContainerAllocateResponse
        self.rejected: dict[str, str] = {}
        self._server: Any = None
        self._pr_server: Any = None
        self._channel: Any = None
        self._changed = threading.Condition()
        directory.mkdir(parents=True, exist_ok=True)
        self.start()

    # ------------------------------------------------------------ serving

    def start(self) -> None:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix://{self.directory / 'kubelet.sock'}")
        server.start()
        self._server = server
        pr_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pr_grpc.add_PodResourcesListerServicer_to_server(_PodResources(self), pr_server)
        pr_server.add_insecure_port(f"unix://{self.pod_resources_socket}")
        pr_server.start()
        self._pr_server = pr_server

    def stop(self) -> None:
        for server in (self._server, self._pr_server):
            if server is not None:
                server.stop(grace=0).wait()
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        self._server = self._pr_server = None

    def restart(self) -> None:
        """A kubelet restart: it goes, every socket in the device-plugins directory is removed,
        and a new kubelet.sock appears; plugins must register again."""
        self.stop()
        self.plugin = None
        for sock in self.directory.glob("*.sock"):
            sock.unlink()
        time.sleep(0.01)  # a new inode and modification time for kubelet.sock
        self.start()

    # ------------------------------------------------------------ the plugin side

    def registered(self, request: Any) -> None:
        self.registrations.append(request)
        channel = grpc.insecure_channel(f"unix://{self.directory / request.endpoint}")
        stub = pb_grpc.DevicePluginStub(channel)
        options = stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
        plugin = Plugin(request.resource_name, request.endpoint, options)
        if self._channel is not None:
            self._channel.close()
        self._channel = channel
        self.stub = stub
        with self._changed:
            self.plugin = plugin
        threading.Thread(target=self._follow, args=(stub, plugin), daemon=True).start()

    def _follow(self, stub: Any, plugin: Plugin) -> None:
        try:
            for reply in stub.ListAndWatch(pb.Empty()):
                with self._changed:
                    plugin.devices = [d.ID for d in reply.devices]
                    plugin.health = {d.ID: d.health for d in reply.devices}
                    plugin.updates += 1
                    self._changed.notify_all()
        except grpc.RpcError:
            return  # the plugin went (or this kubelet stopped)

    def wait_for_devices(self, timeout: float = 5.0) -> Plugin:
        deadline = time.monotonic() + timeout
        with self._changed:
            while self.plugin is None or not self.plugin.devices:
                left = deadline - time.monotonic()
                assert left > 0, "the plugin did not register and list its devices in time"
                self._changed.wait(left)
            return self.plugin

    # ------------------------------------------------------------ admission

    def _free(self) -> list[str]:
        plugin = self.wait_for_devices()
        taken = {i for c in self.assigned.values() for d in c.values() for ids in d.values() for i in ids}
        return [d for d in plugin.devices if d not in taken and plugin.health.get(d) == "Healthy"]

    def admit(self, key: str, containers: list[str], ids: dict[str, str] | None = None) -> bool:
        """Admit one pod: Allocate for each of its share containers, in order. True if admitted."""
        plugin = self.wait_for_devices()
        for container in containers:
            device = (ids or {}).get(container) or self._free()[0]
            try:
                reply = self.stub.Allocate(
                    pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=[device])]),
                    timeout=10,
                )
            except grpc.RpcError as exc:
                message = f"Allocate failed due to {exc.details()}, which is unexpected"
                self.rejected[key] = message
                self.assigned.pop(key, None)
                self._on_reject(key, message)
                return False
            self.assigned.setdefault(key, {}).setdefault(container, {})[plugin.resource] = [device]
            (self.answers[(key, container)],) = reply.container_responses
        return True

    def forget(self, key: str) -> None:
        """The pod is gone: its devices are free again."""
        self.assigned.pop(key, None)
