"""The device plugin: the agent's share resource served to the kubelet over the v1beta1 gRPC API.

The plugin serves ``DevicePlugin`` on ``<devicePluginDir>/<socketName>`` and registers it
with the kubelet's ``Registration`` service on ``<devicePluginDir>/kubelet.sock``. It
advertises ``shareSlots`` interchangeable devices (``share-000``...); each container that
requests the resource gets one, and ``Allocate`` answers it from the record of the pod being
admitted (:meth:`Agent.allocate`). A kubelet that restarts removes every plugin socket and
opens a new ``kubelet.sock``: :meth:`DevicePlugin.check`, called every tick, sees either
and serves and registers again.

A second plugin (``units=True``) advertises the node's GPU units (``unitsResource``, on
``unitsSocketName``): :func:`scheduler.core.units.node_units` interchangeable devices
(``unit-0000``...), listed again whenever the inventory changes their number. They are no
devices: the kubelet only counts them into the node's capacity, where kube-scheduler's
NodeResourcesFit reads them, and their ``Allocate`` hands a container nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from scheduler.core.errors import GpusliceError

from .agent import Agent, share_ids
from .handover import Answer
from .migs import AdmitError
from .proto import deviceplugin_pb2 as pb
from .proto import deviceplugin_pb2_grpc as pb_grpc

log = logging.getLogger("gpuslice.agent.plugin")

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
HEALTHY = "Healthy"


class PluginError(GpusliceError):
    """The plugin could not serve or register."""


def response(result: Answer) -> pb.ContainerAllocateResponse:
    return pb.ContainerAllocateResponse(
        envs=dict(result.envs),
        mounts=[
            pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in result.mounts
        ],
        annotations=dict(result.annotations),
        cdi_devices=[pb.CDIDevice(name=n) for n in result.cdi_devices],
    )


class _Servicer(pb_grpc.DevicePluginServicer):
    def __init__(self, agent: Agent, stop: threading.Event) -> None:
        self._agent = agent
        self._stop = stop

    def GetDevicePluginOptions(self, request: pb.Empty, context: Any) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def ListAndWatch(self, request: pb.Empty, context: Any) -> Iterator[pb.ListAndWatchResponse]:
        ids = share_ids(self._agent.config.share_slots)
        yield pb.ListAndWatchResponse(devices=[pb.Device(ID=i, health=HEALTHY) for i in ids])
        # The shares never change health (a GPU's health is in the inventory): keep the stream open.
        while context.is_active() and not self._stop.wait(0.5):
            pass

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: Any
    ) -> pb.PreferredAllocationResponse:
        out = []
        for req in request.container_requests:
            chosen = list(req.must_include_deviceIDs)
            for device in sorted(req.available_deviceIDs):
                if len(chosen) >= req.allocation_size:
                    break
                if device not in chosen:
                    chosen.append(device)
            out.append(pb.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        return pb.PreferredAllocationResponse(container_responses=out)

    def Allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:
        answers = []
        for req in request.container_requests:
            try:
                answers.append(response(self._agent.allocate(tuple(req.devices_ids))))
            except AdmitError as exc:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"gpuslice: {exc}")
        return pb.AllocateResponse(container_responses=answers)

    def PreStartContainer(self, request: pb.PreStartContainerRequest, context: Any) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


def unit_ids(count: int) -> tuple[str, ...]:
    return tuple(f"unit-{i:04d}" for i in range(count))


class _UnitsServicer(_Servicer):
    """The GPU units: as many devices as the inventory's units, listed again when that changes."""

    def ListAndWatch(self, request: pb.Empty, context: Any) -> Iterator[pb.ListAndWatchResponse]:
        listed = -1
        while context.is_active():
            count = self._agent.gpu_units()
            if count != listed:
                listed = count
                yield pb.ListAndWatchResponse(devices=[pb.Device(ID=i, health=HEALTHY) for i in unit_ids(count)])
            if self._stop.wait(0.5):
                return

    def Allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:
        # a unit hands the container nothing: the share's own plugin does (the record's devices)
        return pb.AllocateResponse(
            container_responses=[pb.ContainerAllocateResponse() for _ in request.container_requests]
        )


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


class DevicePlugin:
    def __init__(self, agent: Agent, units: bool = False) -> None:
        """The share's plugin, or with ``units`` the GPU units' (see the module)."""
        self._agent = agent
        config = agent.config
        self.directory = Path(config.device_plugin_dir)
        self.units = units
        self.resource = config.units_resource if units else config.resource
        self.endpoint = config.units_socket_name if units else config.socket_name
        self.socket = self.directory / self.endpoint
        self._server: Any = None
        self._stop = threading.Event()
        self._kubelet: tuple[int, int] | None = None
        self.registrations = 0

    def _serve(self) -> None:
        self._shutdown()
        self._stop = threading.Event()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="device-plugin"))
        servicer = (_UnitsServicer if self.units else _Servicer)(self._agent, self._stop)
        pb_grpc.add_DevicePluginServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
        try:
            if self.socket.exists():
                self.socket.unlink()
            bound = server.add_insecure_port(f"unix://{self.socket.resolve()}")
        except (OSError, RuntimeError) as exc:  # grpc raises RuntimeError when it cannot bind
            server.stop(grace=0)
            raise PluginError(
                f"cannot serve the device plugin at {self.socket} ({exc}); is {self.directory} the kubelet's "
                "device-plugins folder, mounted writable?"
            ) from exc
        if not bound:
            server.stop(grace=0)
            raise PluginError(f"cannot listen on {self.socket}; is {self.directory} mounted writable?")
        server.start()
        self._server = server

    def _register(self) -> None:
        kubelet = self.directory / KUBELET_SOCKET
        request = pb.RegisterRequest(
            version=API_VERSION,
            endpoint=self.endpoint,
            resource_name=self.resource,
            options=pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True),
        )
        try:
            with grpc.insecure_channel(f"unix://{kubelet.resolve()}") as channel:
                pb_grpc.RegistrationStub(channel).Register(request, timeout=10)  # type: ignore[no-untyped-call]
        except grpc.RpcError as exc:
            raise PluginError(f"registration with the kubelet ({kubelet}) failed: {exc.details() or exc}") from exc
        self._kubelet = _stat(kubelet)
        self.registrations += 1
        log.info("registered %s with the kubelet (socket %s)", self.resource, self.socket)

    def start(self) -> None:
        """Serve and register (PluginError if either fails)."""
        self._serve()
        self._register()

    def check(self) -> bool:
        """Serve and register again if the kubelet restarted; True if it did. A kubelet that is
        not there yet is a PluginError (the caller tries again next tick)."""
        kubelet = _stat(self.directory / KUBELET_SOCKET)
        if self._server is not None and self.socket.exists() and kubelet == self._kubelet:
            return False
        if kubelet is None:
            raise PluginError(f"no kubelet socket at {self.directory / KUBELET_SOCKET}")
        log.info("the kubelet restarted (or the plugin socket went): serving and registering again")
        self.start()
        return True

    def _shutdown(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.stop(grace=1).wait()
            self._server = None

    def stop(self) -> None:
        self._shutdown()
        with contextlib.suppress(OSError):
            os.unlink(self.socket)
