"""The node agent's stories, against fake GPUs and the real extender on an in-memory cluster.

The node: GPU 0 an A100-80GB in MIG mode (dynamic, empty); GPU 1 an A100-80GB in MIG mode
with a 3g.40gb at slot 4 made by hand; GPU 2 an L4 shared by MPS; GPU 3 an H100 given whole.
GPUs 0 and 1 are NVLink peers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from scheduler.agent.fake import FakeGpus
from scheduler.agent.migs import AdmitError
from scheduler.core.k8s import parse_node
from scheduler.extender.inspection import render
from tests.agent.kit import NODE, PREFIX, Cluster, FakeClock, FakeRunner, fake_gpus, make_agent

HAND_MADE = "MIG-hand-3g-at-4"
CONFIG: dict[str, Any] = {"gpus": {"2": {"mode": "mps", "mpsClientLimit": 8}}}


def node_gpus() -> FakeGpus:
    return fake_gpus(
        {"model": "A100-80GB", "uuid": "GPU-a100-0", "mig": True, "nvlink": [1]},
        {
            "model": "A100-80GB",
            "uuid": "GPU-a100-1",
            "mig": True,
            "nvlink": [0],
            "instances": [{"profile": "3g.40gb", "start": 4, "uuid": HAND_MADE}],
        },
        {"model": "L4", "uuid": "GPU-l4-2"},
        {"model": "H100-80GB", "uuid": "GPU-h100-3", "memoryMiB": 81559},
    )


@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    return Cluster(tmp_path)


@pytest.fixture
def gpus() -> FakeGpus:
    return node_gpus()


def mig_pod(cluster: Cluster, name: str, profile: str, gpu_model: str = "A100-80GB") -> str:
    return cluster.create_pod(name, mig_profile=profile, gpu_model=gpu_model)


def test_the_inventory_is_the_fake_hardware(tmp_path: Path, cluster: Cluster, gpus: FakeGpus) -> None:
    make_agent(tmp_path, gpus, cluster, **CONFIG)
    node = parse_node(cluster.get_node())
    by_index = {d.index: d for d in node.devices}
    assert [d.uuid for d in node.devices] == ["GPU-a100-0", "GPU-a100-1", "GPU-l4-2", "GPU-h100-3"]
    assert [d.model.name for d in node.devices] == ["A100-80GB", "A100-80GB", "L4", "H100-80GB"]
    assert [d.mode.value for d in node.devices] == ["mig", "mig", "mps", "exclusive"]
    assert by_index[3].memory_mib == 81559 and by_index[3].model.sm_count == 132
    assert by_index[2].mps_client_limit == 8
    assert [(i.profile.name, i.start, i.uuid) for i in by_index[1].mig_taken] == [("3g.40gb", 4, HAND_MADE)]
    assert by_index[0].mig_taken == () and by_index[0].mig_instances == ()
    assert node.nvlink == frozenset({(0, 1)})
    assert all(d.healthy for d in node.devices)


def test_the_inventory_is_written_only_when_it_changes(tmp_path: Path, cluster: Cluster, gpus: FakeGpus) -> None:
    agent = make_agent(tmp_path, gpus, cluster, **CONFIG)
    assert cluster.patches["inventory"] == 1
    agent.tick()
    agent.tick()
    assert cluster.patches["inventory"] == 1
    gpus.make_by_hand(0, "1g.10gb", 0)  # the hardware changed under the agent
    agent.tick()
    assert cluster.patches["inventory"] == 2


def test_a_fatal_xid_marks_the_gpu_unhealthy_and_the_extender_refuses_it(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus
) -> None:
    agent = make_agent(tmp_path, gpus, cluster, **CONFIG)
    whole = cluster.create_pod("whole", gpu_count="1", sharing="exclusive")
    assert cluster.filter(whole)["NodeNames"] == [NODE]
    gpus.xid(3, 43)  # an application's fault: nothing happens
    agent.tick()
    assert cluster.inventory()["devices"][3]["healthy"] is True
    assert "unhealthy" not in render(cluster.extender.describe(NODE)[0])
    gpus.xid(3, 79)
    agent.tick()
    device = cluster.inventory()["devices"][3]
    assert device["healthy"] is False and device["unhealthyReason"] == "XID 79: GPU has fallen off the bus"
    result = cluster.filter(whole)
    assert result["NodeNames"] == []
    failed = {**(result["FailedNodes"] or {}), **(result["FailedAndUnresolvableNodes"] or {})}
    assert failed[NODE] == "GPU 3 is unhealthy: XID 79: GPU has fallen off the bus"
    (about, kind, reason, message) = cluster.events[-1]
    assert (about.kind, about.name, kind, reason) == ("Node", NODE, "Warning", "GpusliceGpuUnhealthy")
    assert "GPU 3 (GPU-h100-3, H100-80GB) is unhealthy: XID 79" in message
    rows = {r["index"]: r for r in cluster.extender.describe(NODE)[0]["devices"]}
    assert rows[3]["healthy"] is False and rows[3]["detail"] == "unhealthy: XID 79: GPU has fallen off the bus"
    # gpuslice inspect's short table (no detail column) says it under the table
    assert f"{NODE}: GPU 3 unhealthy: XID 79: GPU has fallen off the bus" in render(cluster.extender.describe(NODE)[0])
    metrics = generate_latest(cluster.extender.metrics.registry).decode()
    assert 'gpuslice_gpu_unhealthy{gpu="3",node="gpu-1",reason="XID 79: GPU has fallen off the bus"' in metrics


def test_a_dynamic_mig_record_gets_its_instance_at_the_recorded_start_and_loses_it_with_the_pod(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus
) -> None:
    agent = make_agent(tmp_path, gpus, cluster, **CONFIG)
    key = mig_pod(cluster, "train", "4g.40gb")
    record = cluster.schedule(key)
    (share,) = record.shares
    assert share.mig is not None and (share.mig.profile, share.mig.start) == ("4g.40gb", 0)
    before = gpus.instance_names(share.index)
    answer = agent.allocate(("share-000",))
    assert gpus.instance_names(share.index) == sorted([*before, "4g.40gb@0"], key=lambda n: int(n.split("@")[1]))
    (made,) = [i for i in gpus.mig_instances(share.uuid) if i.start == 0]
    assert (made.compute_slices, made.memory_slots) == (4, 4)
    assert answer.cdi_devices == (f"nvidia.com/gpu={made.uuid}",) and answer.pod == key
    assert [i["uuid"] for i in cluster.inventory()["devices"][share.index]["migManaged"]] == [made.uuid]
    cluster.delete(key)
    assert gpus.instance_names(share.index) == before
    assert cluster.inventory()["devices"][share.index]["migManaged"] == []


def test_an_instance_made_by_hand_is_never_destroyed(tmp_path: Path, cluster: Cluster, gpus: FakeGpus) -> None:
    agent = make_agent(tmp_path, gpus, cluster, **CONFIG)
    late = gpus.make_by_hand(0, "1g.10gb", 6)  # made while the agent runs
    key = mig_pod(cluster, "small", "3g.40gb")
    record = cluster.schedule(key)
    assert record.shares[0].mig is not None
    agent.allocate(("share-000",))
    cluster.delete(key)
    for _ in range(3):
        agent.tick()
    restarted = make_agent(tmp_path, gpus, cluster, **CONFIG)  # an agent restart, too
    restarted.tick()
    assert HAND_MADE in {i.uuid for i in gpus.mig_instances("GPU-a100-1")}
    assert late.uuid in {i.uuid for i in gpus.mig_instances("GPU-a100-0")}
    assert not any(HAND_MADE in c or late.uuid in c for c in gpus.calls if c.startswith("destroy"))
    taken = {i["uuid"] for d in cluster.inventory()["devices"] for i in d.get("migTaken", [])}
    assert taken == {HAND_MADE, late.uuid}


def test_an_mps_share_carries_its_caps_and_the_pipe_of_its_gpus_daemon(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus
) -> None:
    runner = FakeRunner()
    agent = make_agent(tmp_path, gpus, cluster, runner=runner, **CONFIG, mps={"defaultThreadPercentage": 60})
    agent.tick()
    ((argv, env),) = [(p.argv, p.env) for p in runner.started]
    assert argv == ("nvidia-cuda-mps-control", "-f") and env["CUDA_VISIBLE_DEVICES"] == "GPU-l4-2"
    pipe = env["CUDA_MPS_PIPE_DIRECTORY"]
    assert Path(pipe).is_dir()
    assert runner.ran == [(("nvidia-cuda-mps-control",), "set_default_active_thread_percentage 60\n")]
    key = cluster.create_pod("infer", gpu_memory="6Gi", gpu_compute="25", sharing="mps")
    record = cluster.schedule(key)
    assert record.shares[0].index == 2
    answer = agent.allocate(("share-007",))
    assert answer.cdi_devices == ("nvidia.com/gpu=GPU-l4-2",)
    assert answer.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert answer.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=6144M"
    assert answer.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/run/gpuslice/mps-pipe"
    assert [(m.container_path, m.host_path) for m in answer.mounts] == [("/run/gpuslice/mps-pipe", pipe)]


def test_the_nvidia_device_plugins_daemon_is_used_where_it_runs(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus
) -> None:
    external = tmp_path / "nvidia-mps"
    external.mkdir()
    (external / "control").touch()
    runner = FakeRunner()
    agent = make_agent(tmp_path, gpus, cluster, runner=runner, **CONFIG, mps={"daemon": "auto"})
    agent.tick()
    assert runner.started == []
    cluster.schedule(cluster.create_pod("infer", gpu_fraction="0.5", sharing="mps"))
    assert agent.allocate(("share-001",)).mounts[0].host_path == str(external)


def test_a_daemon_that_exits_is_started_again(tmp_path: Path, cluster: Cluster, gpus: FakeGpus) -> None:
    runner = FakeRunner()
    agent = make_agent(tmp_path, gpus, cluster, runner=runner, **CONFIG)
    agent.tick()
    runner.started[0].exit = 1
    agent.tick()
    assert len(runner.started) == 2


def test_two_pods_admitted_back_to_back_each_get_their_own_share(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus
) -> None:
    agent = make_agent(tmp_path, gpus, cluster, **CONFIG)
    first = cluster.schedule(mig_pod(cluster, "a", "2g.20gb"))
    second = cluster.schedule(mig_pod(cluster, "b", "2g.20gb"))
    assert first.shares[0].mig != second.shares[0].mig or first.shares[0].index != second.shares[0].index
    one = agent.allocate(("share-010",))
    two = agent.allocate(("share-011",))
    assert (one.pod, two.pod) == ("default/a", "default/b")
    assert one.cdi_devices != two.cdi_devices
    names = {f"{i.gpu_uuid}:{i.start}": i.uuid for g in ("GPU-a100-0", "GPU-a100-1") for i in gpus.mig_instances(g)}
    for answer, record in ((one, first), (two, second)):
        share = record.shares[0]
        assert share.mig is not None
        assert answer.cdi_devices == (f"nvidia.com/gpu={names[f'{share.uuid}:{share.mig.start}']}",)
    assert agent.allocate(("share-010",)) == one  # asked again for the same ID: the same answer


def test_a_pod_with_several_gpu_containers_is_answered_for_each_before_the_next_pod(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus
) -> None:
    agent = make_agent(tmp_path, gpus, cluster, **CONFIG)
    cluster.schedule(cluster.create_pod("multi", containers=2, init_containers=1, gpu_count="1", sharing="exclusive"))
    cluster.schedule(cluster.create_pod("next", gpu_fraction="0.25", sharing="mps"))
    # the kubelet gives the first app container its init container's ID again, the second a new one
    asked = ["share-000", "share-000", "share-001", "share-002"]
    pods = [agent.allocate((share,)).pod for share in asked]
    assert pods == ["default/multi"] * 3 + ["default/next"]


def test_a_failed_creation_leaves_the_pod_unstarted_and_its_record_released(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus
) -> None:
    agent = make_agent(tmp_path, gpus, cluster, **CONFIG)
    key = mig_pod(cluster, "big", "4g.40gb")
    record = cluster.schedule(key)
    (share,) = record.shares
    assert share.mig is not None and share.mig.start == 0
    before = gpus.instance_names(share.index)
    gpus.make_by_hand(share.index, "1g.10gb", 0)  # someone takes the slot between the bind and the pod's start
    # the record is checked against the hardware first: the slot is no longer free
    with pytest.raises(AdmitError, match=r"record refused: .* slot 0 of 4g\.40gb overlaps 1g\.10gb at 0"):
        agent.allocate(("share-000",))
    (about, kind, reason, message) = cluster.events[-1]
    assert (about.name, kind, reason) == ("big", "Warning", "GpusliceAllocateFailed")
    assert gpus.instance_names(share.index) == ["1g.10gb@0", *before]  # nothing created beside it
    taken = [(i["profile"], i["start"]) for i in cluster.inventory()["devices"][share.index]["migTaken"]]
    assert ("1g.10gb", 0) in taken
    cluster.fail_pod(key, "UnexpectedAdmissionError", message)  # what the kubelet then does
    assert key not in cluster.counted()
    again = cluster.schedule(mig_pod(cluster, "big-2", "4g.40gb"))  # its controller's next pod
    assert (again.shares[0].index, again.shares[0].mig) != (share.index, share.mig)
    assert agent.allocate(("share-001",)).pod == "default/big-2"


def test_a_record_on_a_gpu_with_mig_off_is_refused(tmp_path: Path, cluster: Cluster) -> None:
    gpus = fake_gpus({"model": "A100-80GB", "uuid": "GPU-x", "mig": False})
    agent = make_agent(tmp_path, gpus, cluster, sharing={"mode": "mig"})
    assert cluster.inventory()["devices"][0]["healthy"] is False  # configured for MIG, MIG off: kept off
    key = cluster.create_pod("p", mig_profile="1g.10gb")
    assert cluster.filter(key)["NodeNames"] == []
    assert gpus.calls == []
    with pytest.raises(AdmitError, match="no pod bound"):
        agent.allocate(("share-000",))


def test_allocate_waits_for_a_pod_the_agents_watch_has_not_shown_yet(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus
) -> None:
    clock = FakeClock()
    agent = make_agent(tmp_path, gpus, cluster, clock=clock, **CONFIG)
    cluster.lagging = True  # the kubelet sees the binding before the agent's watch does
    cluster.schedule(mig_pod(cluster, "early", "1g.10gb"))
    assert agent.allocate(("share-000",)).pod == "default/early"  # found by listing the node's pods again


def test_allocate_with_no_pod_waiting_fails_after_the_wait(tmp_path: Path, cluster: Cluster, gpus: FakeGpus) -> None:
    clock = FakeClock()
    agent = make_agent(tmp_path, gpus, cluster, clock=clock, **CONFIG)
    with pytest.raises(AdmitError, match="no pod bound to gpu-1 by gpuslice is waiting for a share"):
        agent.allocate(("share-000",))
    assert 2.0 <= clock.slept <= 2.5


def test_a_pod_without_a_record_counted_here_is_never_answered(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus
) -> None:
    agent = make_agent(tmp_path, gpus, cluster, **CONFIG)
    key = cluster.create_pod("forged", gpu_count="1")
    pod = cluster.backend.pods()[key]
    forged = {**pod, "spec": {**pod["spec"], "nodeName": NODE}}
    forged["metadata"] = {**pod["metadata"], "annotations": {PREFIX + "allocation": '{"node":"gpu-1"}'}}
    cluster.backend.put_pod(forged)
    with pytest.raises(AdmitError):
        agent.allocate(("share-000",))


def test_after_an_agent_restart_its_instance_is_found_again_and_destroyed_when_the_pod_went_meanwhile(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus
) -> None:
    agent = make_agent(tmp_path, gpus, cluster, **CONFIG)
    key = mig_pod(cluster, "job", "3g.40gb")
    cluster.schedule(key)
    agent.allocate(("share-000",))
    made = agent.managed()
    assert len(made) == 1
    cluster.stop()  # the agent goes away ...
    cluster.delete(key)  # ... and the pod is deleted while it is down
    on_hardware = {i.uuid for g in ("GPU-a100-0", "GPU-a100-1") for i in gpus.mig_instances(g)}
    assert made <= on_hardware  # orphaned for now: nobody holds it
    make_agent(tmp_path, gpus, cluster, **CONFIG)
    assert not made & {i.uuid for g in ("GPU-a100-0", "GPU-a100-1") for i in gpus.mig_instances(g)}
    assert HAND_MADE in {i.uuid for i in gpus.mig_instances("GPU-a100-1")}


def test_after_a_node_reboot_nothing_is_orphaned_and_the_instance_is_made_again_at_admission(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus
) -> None:
    agent = make_agent(tmp_path, gpus, cluster, **CONFIG)
    key = mig_pod(cluster, "job", "2g.20gb")
    record = cluster.schedule(key)
    agent.allocate(("share-000",))
    cluster.stop()
    gpus.reboot()
    again = make_agent(tmp_path, gpus, cluster, **CONFIG)
    assert again.managed() == set()
    assert all(d.get("migManaged", []) == [] for d in cluster.inventory()["devices"])
    answer = again.allocate(("share-000",))  # the kubelet admits the pod again after the reboot
    share = record.shares[0]
    assert share.mig is not None
    (made,) = [i for i in gpus.mig_instances(share.uuid) if i.start == share.mig.start]
    assert answer.cdi_devices == (f"nvidia.com/gpu={made.uuid}",)


def test_a_busy_instance_is_kept_until_its_processes_are_gone(tmp_path: Path, cluster: Cluster, gpus: FakeGpus) -> None:
    agent = make_agent(tmp_path, gpus, cluster, **CONFIG)
    key = mig_pod(cluster, "job", "7g.80gb")
    cluster.schedule(key)
    answer = agent.allocate(("share-000",))
    uuid = answer.cdi_devices[0].split("=")[1]
    gpus.add_process(0, 777, 1024, uuid)
    cluster.delete(key)
    assert [i.uuid for i in gpus.mig_instances("GPU-a100-0")] == [uuid]
    gpus.remove_processes(0)
    agent.tick()
    assert gpus.mig_instances("GPU-a100-0") == ()


def test_static_mig_hands_over_the_precreated_instance_and_never_changes_it(tmp_path: Path, cluster: Cluster) -> None:
    gpus = fake_gpus(
        {
            "model": "A100-80GB",
            "uuid": "GPU-s",
            "mig": True,
            "instances": [{"profile": "3g.40gb", "start": 0, "uuid": "MIG-s0"}, {"profile": "3g.40gb", "start": 4}],
        }
    )
    agent = make_agent(tmp_path, gpus, cluster, sharing={"migStrategy": "static"})
    assert [i["uuid"] for i in cluster.inventory()["devices"][0]["migInstances"]] == ["MIG-s0", "MIG-GPU-s-1"]
    key = mig_pod(cluster, "p", "3g.40gb")
    record = cluster.schedule(key)
    answer = agent.allocate(("share-000",))
    assert answer.cdi_devices == (f"nvidia.com/gpu={record.shares[0].uuid}",)
    cluster.delete(key)
    agent.tick()
    assert gpus.calls == []


def test_an_instance_made_by_hand_at_exactly_the_recorded_placement_is_not_handed_over(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus
) -> None:
    agent = make_agent(tmp_path, gpus, cluster, **CONFIG)
    record = cluster.schedule(mig_pod(cluster, "p", "2g.20gb"))
    (share,) = record.shares
    assert share.mig is not None
    hand = gpus.make_by_hand(share.index, "2g.20gb", share.mig.start)  # the very same shape and slot
    # the record is checked against the hardware first: the placement is someone else's now
    with pytest.raises(AdmitError, match=r"record refused: .* slot \d of 2g\.20gb overlaps 2g\.20gb at \d"):
        agent.allocate(("share-000",))
    assert hand.uuid in {i.uuid for i in gpus.mig_instances(share.uuid)}
