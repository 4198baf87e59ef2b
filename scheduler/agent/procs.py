"""Whose is a host PID: its pod and container, read from ``/proc/<pid>/cgroup``.

The kubelet puts every container in a cgroup under its pod's, and the pod's cgroup is named
after the pod's UID. The forms differ by cgroup version, cgroup driver and runtime, and all
are read here:

* cgroupfs driver (v1 or v2): ``/kubepods/burstable/pod<uid>/<container id>``, the QoS level
  left out for Guaranteed pods (``/kubepods/pod<uid>/...``), cri-o's container as
  ``crio-<id>``;
* systemd driver: ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/
  cri-containerd-<id>.scope`` (the UID's dashes as underscores; ``crio-<id>.scope``,
  ``docker-<id>.scope``), or, on cgroup v1 with containerd, ``kubepods-burstable-pod<uid>.slice:
  cri-containerd:<id>``.

A v2 file has the one line ``0::<path>``; a v1 file a line per hierarchy, read until one names a
pod. A process in no pod's cgroup is the host's (or a container not run by the kubelet).
The agent runs in the host PID namespace (its DaemonSet says ``hostPID: true``), so
``/proc`` is the host's; tests point :class:`ProcFs` at a directory of their own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
# "pod<uid>" as a path component of a kubepods tree, or at the end of a kubepods-*-pod<uid>.slice
_POD = re.compile(rf"kubepods.*?(?:/|-)pod({_UID})(?:\.slice)?(?=/|:|$)")
# the container: cri-containerd-<id>.scope, crio-<id>(.scope), docker-<id>.scope, :cri-containerd:<id>, or <id>
_CONTAINER = re.compile(r"(?:^|[/:-])([0-9a-f]{64})(?:\.scope)?$")
_CONMON = re.compile(r"crio-conmon-[0-9a-f]{64}")
MPS_COMMAND = "nvidia-cuda-mps"  # /proc/<pid>/comm of the MPS control daemon and server (15 characters)


@dataclass(frozen=True, slots=True)
class Owner:
    """What runs a process: its pod's UID and its container's ID ("" when not in a pod or not
    known), and its command name (``/proc/<pid>/comm``)."""

    pod_uid: str
    container_id: str
    command: str

    @property
    def in_pod(self) -> bool:
        return bool(self.pod_uid)

    def plumbing(self, own_pod_uid: str) -> bool:
        """An MPS control daemon or server the node runs: named so (``/proc/<pid>/comm``) **and**
        outside every pod (a daemon of the host's) or in the agent's own pod (the agent's child,
        which inherits its cgroup). A name is anyone's to take: a tenant's process called
        ``nvidia-cuda-mps-server`` in its own pod is measured as the pod's like any other."""
        if not self.command.startswith(MPS_COMMAND):
            return False
        return not self.pod_uid or (bool(own_pod_uid) and self.pod_uid == own_pod_uid)


class ProcReader(Protocol):
    def owner(self, pid: int) -> Owner | None:
        """Who runs ``pid``; None when the process is gone (or ``/proc`` shows no such PID)."""

    def own_pod_uid(self) -> str:
        """The UID of the pod the agent itself runs in ("" when not in a pod)."""


def owner_of(cgroup_text: str, command: str = "") -> Owner:
    """The pod and container named by the text of a ``/proc/<pid>/cgroup`` file."""
    for line in cgroup_text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        path = parts[2]
        found = _POD.search(path)
        if found is None:
            continue
        uid = found.group(1).replace("_", "-")
        container = ""
        if not _CONMON.search(path):
            tail = _CONTAINER.search(path)
            container = tail.group(1) if tail is not None else ""
        return Owner(uid, container, command)
    return Owner("", "", command)


class ProcFs:
    """:class:`ProcReader` over a ``/proc`` directory (the host's, or a test's)."""

    def __init__(self, root: str | Path = "/proc") -> None:
        self._root = Path(root)

    def own_pod_uid(self) -> str:
        owner = self._read(self._root / "self")
        return owner.pod_uid if owner is not None else ""

    def owner(self, pid: int) -> Owner | None:
        return self._read(self._root / str(pid))

    def _read(self, base: Path) -> Owner | None:
        try:
            text = (base / "cgroup").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None  # gone between NVML's listing and now, or never in this PID namespace
        try:
            command = (base / "comm").read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            command = ""
        return owner_of(text, command)
