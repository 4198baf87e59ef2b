"""A host PID to its pod and container, from /proc/<pid>/cgroup in every form the kubelet makes."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.agent.procs import Owner, ProcFs, owner_of

UID = "1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901"
SLICE = UID.replace("-", "_")
CID = "0123456789abcdef" * 4


@pytest.mark.parametrize(
    "cgroup",
    [
        # cgroup v2, systemd driver, containerd
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SLICE}.slice/cri-containerd-{CID}.scope",
        # cgroup v2, systemd driver, cri-o, a Guaranteed pod (no QoS level)
        f"0::/kubepods.slice/kubepods-pod{SLICE}.slice/crio-{CID}.scope",
        # cgroup v2, systemd driver, a BestEffort pod, docker (cri-dockerd)
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SLICE}.slice/docker-{CID}.scope",
        # cgroup v1, cgroupfs driver, containerd: a line per hierarchy
        f"12:memory:/kubepods/burstable/pod{UID}/{CID}\n11:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CID}",
        # cgroup v1, cgroupfs driver, cri-o, a Guaranteed pod
        f"4:pids:/kubepods/pod{UID}/crio-{CID}",
        # cgroup v1, systemd driver, containerd's own form
        f"1:name=systemd:/kubepods-burstable-pod{SLICE}.slice:cri-containerd:{CID}",
        # the kubelet inside a container (kind): the pod's tree under the runtime's
        f"0::/system.slice/containerd.service/kubepods-burstable-pod{SLICE}.slice:cri-containerd:{CID}",
        # a v1 file whose first lines name no pod
        f"13:rdma:/\n12:hugetlb:/\n3:devices:/kubepods/besteffort/pod{UID}/{CID}",
    ],
)
def test_every_form_names_the_pod_and_the_container(cgroup: str) -> None:
    assert owner_of(cgroup, "python3") == Owner(UID, CID, "python3")


def test_crio_conmon_is_the_pods_but_no_container() -> None:
    text = f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SLICE}.slice/crio-conmon-{CID}.scope"
    assert owner_of(text) == Owner(UID, "", "")


@pytest.mark.parametrize(
    "cgroup",
    [
        "0::/user.slice/user-1000.slice/session-3.scope",
        "0::/system.slice/nvidia-persistenced.service",
        "0::/",
        "12:memory:/docker/" + CID,  # a container the kubelet did not run
        f"0::/system.slice/pod{UID}.service",  # "pod<uid>" outside a kubepods tree
        "garbage without colons",
    ],
)
def test_a_process_in_no_pods_cgroup_is_the_hosts(cgroup: str) -> None:
    owner = owner_of(cgroup, "x")
    assert owner == Owner("", "", "x") and not owner.in_pod


def test_the_reader_reads_a_proc_directory_and_a_gone_pid_is_none(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(f"0::/kubepods/burstable/pod{UID}/{CID}\n")
    (tmp_path / "42" / "comm").write_text("nvidia-cuda-mps\n")
    owner = ProcFs(tmp_path).owner(42)
    assert owner == Owner(UID, CID, "nvidia-cuda-mps")
    # named like the MPS daemon, but in a pod's cgroup: not the node's plumbing, unless it is the agent's pod
    assert not owner.plumbing("") and not owner.plumbing("another-uid") and owner.plumbing(UID)
    assert Owner("", "", "nvidia-cuda-mps").plumbing("")  # the host's own daemon
    assert not Owner("", "", "python3").plumbing("")
    assert ProcFs(tmp_path).owner(43) is None
    assert ProcFs(tmp_path).own_pod_uid() == ""  # no "self": the agent is not in a pod
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "cgroup").write_text(f"0::/kubepods/burstable/pod{UID}/{CID}\n")
    assert ProcFs(tmp_path).own_pod_uid() == UID


def test_the_reader_reads_this_machines_proc() -> None:
    import os

    owner = ProcFs("/proc").owner(os.getpid())
    assert owner is not None and owner.command  # whatever this process is: readable, not a crash
