"""Crash-consistent node state: the agent killed at each step of making a MIG instance for a pod,
then started again, leaves no orphan instance and counts no slot twice; an operator-facing failure
is one clear line and the agent keeps its state."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from scheduler.agent.fake import FakeGpus
from scheduler.agent.gpus import MigInfo
from scheduler.agent.plugin import DevicePlugin, PluginError
from tests.agent.kit import PREFIX, Cluster, make_agent
from tests.agent.test_stories import CONFIG, HAND_MADE, mig_pod, node_gpus

GPUS = ("GPU-a100-0", "GPU-a100-1")


class Killed(BaseException):
    """The agent's process ends here (SIGKILL): nothing after this line runs."""


def ours(gpus: FakeGpus) -> set[str]:
    return {i.uuid for g in GPUS for i in gpus.mig_instances(g) if i.uuid != HAND_MADE}


def kill_in_create(gpus: FakeGpus, after: bool) -> None:
    """The next create_mig is the agent's last act: killed before it (nothing made) or after."""
    real: Callable[..., MigInfo] = gpus.create_mig

    def create(*args: Any) -> MigInfo:
        if after:
            real(*args)
        raise Killed

    gpus.create_mig = create  # type: ignore[method-assign]


def restart(tmp_path: Path, gpus: FakeGpus, cluster: Cluster) -> Any:
    cluster.stop()
    gpus.create_mig = FakeGpus.create_mig.__get__(gpus)  # type: ignore[method-assign]
    return make_agent(tmp_path, gpus, cluster, **CONFIG)


@pytest.mark.parametrize("after", [False, True], ids=["before-create", "after-create-before-publish"])
def test_killed_while_making_an_instance_for_a_pod_deleted_meanwhile_leaves_no_orphan(
    tmp_path: Path, after: bool
) -> None:
    cluster, gpus = Cluster(tmp_path), node_gpus()
    agent = make_agent(tmp_path, gpus, cluster, **CONFIG)
    key = mig_pod(cluster, "job", "3g.40gb")
    cluster.schedule(key)
    kill_in_create(gpus, after)
    with pytest.raises(Killed):
        agent.allocate(("share-000",))
    assert len(ours(gpus)) == (1 if after else 0)
    cluster.stop()  # the killed agent sees nothing more
    cluster.delete(key)  # the pod goes while the agent is down
    restarted = restart(tmp_path, gpus, cluster)
    assert ours(gpus) == set()  # found again as the agent's own and destroyed: no orphan
    assert HAND_MADE in {i.uuid for i in gpus.mig_instances("GPU-a100-1")}  # someone else's: untouched
    devices = cluster.inventory()["devices"]
    assert [i["profile"] for d in devices for i in d.get("migTaken", [])] == ["3g.40gb"]  # only the hand-made
    assert PREFIX + "mig-intent" not in cluster.get_node()["metadata"]["annotations"]
    assert restarted.managed() == set()


def test_killed_after_making_the_instance_the_pod_gets_that_one_not_a_second(tmp_path: Path) -> None:
    cluster, gpus = Cluster(tmp_path), node_gpus()
    agent = make_agent(tmp_path, gpus, cluster, **CONFIG)
    key = mig_pod(cluster, "job", "3g.40gb")
    cluster.schedule(key)
    kill_in_create(gpus, after=True)
    with pytest.raises(Killed):
        agent.allocate(("share-000",))
    (made,) = ours(gpus)
    restarted = restart(tmp_path, gpus, cluster)
    assert restarted.managed() == {made}
    answer = restarted.allocate(("share-000",))  # the kubelet asks again
    assert answer.cdi_devices == (f"nvidia.com/gpu={made}",)
    assert ours(gpus) == {made}  # one instance, one slot: not made twice
    assert key in cluster.counted()


def test_an_instance_is_not_made_when_it_cannot_be_announced(tmp_path: Path) -> None:
    cluster, gpus = Cluster(tmp_path), node_gpus()
    agent = make_agent(tmp_path, gpus, cluster, **CONFIG)
    key = mig_pod(cluster, "job", "1g.10gb")
    cluster.schedule(key)
    real = cluster.set_node_annotations

    def refuse(annotations: Any) -> None:
        if PREFIX + "mig-intent" in annotations:
            from scheduler.core.errors import GpusliceError

            raise GpusliceError("patch nodes: HTTP 503")
        real(annotations)

    cluster.set_node_annotations = refuse  # type: ignore[method-assign]
    from scheduler.agent.migs import AdmitError

    with pytest.raises(AdmitError, match="cannot announce the MIG instance on the Node before making it"):
        agent.allocate(("share-000",))
    assert ours(gpus) == set()


def test_an_unusable_device_plugin_folder_is_one_clear_line_and_the_agent_keeps_its_state(tmp_path: Path) -> None:
    cluster, gpus = Cluster(tmp_path), node_gpus()
    folder = tmp_path / "not-a-folder"
    folder.write_text("")  # a file where the kubelet's folder should be: nothing can be made in it (even as root)
    agent = make_agent(tmp_path, gpus, cluster, **CONFIG, devicePluginDir=str(folder))
    key = mig_pod(cluster, "job", "1g.10gb")
    cluster.schedule(key)
    plugin = DevicePlugin(agent)
    with pytest.raises(PluginError) as caught:
        plugin.start()
    message = str(caught.value)
    assert "\n" not in message and f"cannot serve the device plugin at {folder}/gpuslice.sock" in message
    assert "mounted writable?" in message
    assert agent.allocate(("share-000",)).pod == key  # the agent itself goes on
    plugin.stop()
