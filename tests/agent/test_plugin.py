"""The device plugin against a fake kubelet speaking the real v1beta1 protocol over unix sockets:
registration, ListAndWatch, Allocate (the stories again, end to end through gRPC), a kubelet
restart, and the pod-resources check of what the kubelet handed out."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.agent.agent import Agent
from scheduler.agent.plugin import DevicePlugin, PluginError
from scheduler.agent.podresources import KubeletPodResources, PodResourcesError
from scheduler.agent.proto import deviceplugin_pb2 as pb
from tests.agent.kit import SHARE, Cluster, make_agent
from tests.agent.kubelet import FakeKubelet
from tests.agent.test_stories import CONFIG, node_gpus


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    # unix socket paths are limited to ~107 bytes: pytest's tmp_path can be longer
    with tempfile.TemporaryDirectory(prefix="gs-") as name:
        yield Path(name)


class Bench:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.cluster = Cluster(tmp)
        self.gpus = node_gpus()
        self.kubelet = FakeKubelet(tmp / "dp", tmp / "pr.sock", self._reject)
        self.agent: Agent = make_agent(
            tmp, self.gpus, self.cluster, KubeletPodResources(str(tmp / "pr.sock")), **CONFIG, shareSlots=16
        )
        self.plugin = DevicePlugin(self.agent)
        self.plugin.start()

    def _reject(self, key: str, message: str) -> None:
        self.cluster.fail_pod(key, "UnexpectedAdmissionError", message)

    def admit(self, key: str) -> bool:
        pod = self.cluster.backend.pods()[key]
        names = [c["name"] for c in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]]
        return self.kubelet.admit(key, names)

    def close(self) -> None:
        self.plugin.stop()
        self.kubelet.stop()


@pytest.fixture
def bench(short_tmp: Path) -> Iterator[Bench]:
    made = Bench(short_tmp)
    yield made
    made.close()


def test_the_plugin_registers_its_resource_and_lists_its_shares(bench: Bench) -> None:
    plugin = bench.kubelet.wait_for_devices()
    (request,) = bench.kubelet.registrations
    assert (request.version, request.resource_name, request.endpoint) == ("v1beta1", SHARE, "gpuslice.sock")
    assert plugin.options.get_preferred_allocation_available is True
    assert plugin.devices == [f"share-{i:03d}" for i in range(16)]
    assert set(plugin.health.values()) == {"Healthy"}


def test_allocate_answers_the_mig_instance_it_made_as_a_cdi_device(bench: Bench) -> None:
    key = bench.cluster.create_pod("train", mig_profile="3g.40gb")
    record = bench.cluster.schedule(key)
    assert bench.admit(key)
    share = record.shares[0]
    assert share.mig is not None
    (made,) = [
        i for i in bench.gpus.mig_instances(share.uuid) if i.start == share.mig.start and i.uuid.startswith("MIG-fake")
    ]
    answer = bench.kubelet.answers[(key, "main0")]
    assert [d.name for d in answer.cdi_devices] == [f"nvidia.com/gpu={made.uuid}"]
    assert answer.annotations == {"cdi.k8s.io/gpuslice_share-000": f"nvidia.com/gpu={made.uuid}"}
    assert answer.envs["GPUSLICE_POD"] == key


def test_allocate_gives_an_mps_share_its_caps_and_pipe(bench: Bench) -> None:
    key = bench.cluster.create_pod("infer", gpu_fraction="0.25", sharing="mps")
    bench.cluster.schedule(key)
    assert bench.admit(key)
    answer = bench.kubelet.answers[(key, "main0")]
    assert answer.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert answer.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={23034 // 4}M"
    (mount,) = answer.mounts
    assert mount.container_path == answer.envs["CUDA_MPS_PIPE_DIRECTORY"]
    assert mount.host_path.endswith("/GPU-l4-2/pipe")


def test_two_pods_back_to_back_through_the_kubelet(bench: Bench) -> None:
    a = bench.cluster.create_pod("a", gpu_count="1", sharing="exclusive")
    b = bench.cluster.create_pod("b", mig_profile="1g.10gb")
    ra, rb = bench.cluster.schedule(a), bench.cluster.schedule(b)
    assert bench.admit(a) and bench.admit(b)
    got_a = [d.name for d in bench.kubelet.answers[(a, "main0")].cdi_devices]
    got_b = [d.name for d in bench.kubelet.answers[(b, "main0")].cdi_devices]
    assert got_a == [f"nvidia.com/gpu={ra.shares[0].uuid}"] == ["nvidia.com/gpu=GPU-h100-3"]
    assert got_b != got_a and got_b[0].startswith("nvidia.com/gpu=MIG-fake")
    assert rb.shares[0].mig is not None
    bench.agent.tick()
    assert bench.agent.mismatches == []


def test_a_failed_creation_fails_the_pods_admission_with_the_reason(bench: Bench) -> None:
    key = bench.cluster.create_pod("big", mig_profile="7g.80gb")
    record = bench.cluster.schedule(key)
    bench.gpus.fail_next_create("Insufficient Resources")
    assert not bench.admit(key)
    assert "cannot create MIG 7g.80gb at slot 0: Insufficient Resources" in bench.kubelet.rejected[key]
    status = bench.cluster.backend.pods()[key]["status"]
    assert status["phase"] == "Failed" and status["reason"] == "UnexpectedAdmissionError"
    assert key not in bench.cluster.counted()
    assert bench.gpus.mig_instances(record.shares[0].uuid) == () or all(
        not i.uuid.startswith("MIG-fake") for i in bench.gpus.mig_instances(record.shares[0].uuid)
    )


def test_a_kubelet_restart_makes_the_plugin_register_again(bench: Bench) -> None:
    bench.kubelet.wait_for_devices()
    assert bench.plugin.check() is False
    bench.kubelet.restart()
    assert bench.plugin.check() is True
    assert len(bench.kubelet.registrations) == 2
    assert bench.kubelet.wait_for_devices().devices[0] == "share-000"
    key = bench.cluster.create_pod("after", gpu_fraction="0.5", sharing="mps")
    bench.cluster.schedule(key)
    assert bench.admit(key)


def test_without_a_kubelet_the_check_says_so(bench: Bench) -> None:
    bench.kubelet.stop()  # gRPC removes its socket as it stops
    assert not (bench.kubelet.directory / "kubelet.sock").exists()
    with pytest.raises(PluginError, match="no kubelet socket"):
        bench.plugin.check()


def test_the_kubelets_view_is_compared_with_the_answers(bench: Bench) -> None:
    a = bench.cluster.create_pod("a", gpu_fraction="0.5", sharing="mps")
    b = bench.cluster.create_pod("b", gpu_fraction="0.5", sharing="mps")
    bench.cluster.schedule(a)
    bench.cluster.schedule(b)
    assert bench.admit(a) and bench.admit(b)
    # the kubelet's checkpoint says the two shares went the other way round: the race case
    sa = bench.kubelet.assigned[a]["main0"][SHARE]
    sb = bench.kubelet.assigned[b]["main0"][SHARE]
    bench.kubelet.assigned[a]["main0"][SHARE], bench.kubelet.assigned[b]["main0"][SHARE] = sb, sa
    bench.agent.tick()
    assert any(
        f"kubelet gave share {sb[0]} to pod {a}, but the agent answered it with pod {b}'s record" in m
        for m in bench.agent.mismatches
    )
    assert any(e[2] == "GpusliceShareMismatch" for e in bench.cluster.events)


def test_another_device_plugins_gpu_beside_the_record_is_reported(bench: Bench) -> None:
    a = bench.cluster.create_pod("a", gpu_count="1", sharing="exclusive")
    bench.cluster.schedule(a)
    assert bench.admit(a)
    bench.kubelet.assigned[a]["main0"]["nvidia.com/gpu"] = ["GPU-l4-2"]
    bench.agent.tick()
    assert any("was given GPU-l4-2 by another device plugin" in m for m in bench.agent.mismatches)


def test_after_an_agent_restart_the_kubelets_view_says_who_holds_which_share(bench: Bench) -> None:
    a = bench.cluster.create_pod("a", gpu_fraction="0.5", sharing="mps")
    bench.cluster.schedule(a)
    assert bench.admit(a)
    bench.cluster.stop()
    again = make_agent(bench.tmp, bench.gpus, bench.cluster, KubeletPodResources(str(bench.tmp / "pr.sock")), **CONFIG)
    assert again.owners() == {"share-000": a}
    b = bench.cluster.create_pod("b", gpu_fraction="0.25", sharing="mps")
    bench.cluster.schedule(b)
    assert again.allocate(("share-001",)).pod == b  # a is not taken for a pod still waiting


def test_pod_resources_that_do_not_answer_are_a_clear_error(short_tmp: Path) -> None:
    with pytest.raises(PodResourcesError, match="pod-resources List on"):
        KubeletPodResources(str(short_tmp / "none.sock"), timeout_s=0.5).list()


def test_a_pod_gone_but_still_listed_by_the_kubelet_is_no_mismatch(bench: Bench) -> None:
    a = bench.cluster.create_pod("a", gpu_fraction="0.5", sharing="mps")
    bench.cluster.schedule(a)
    assert bench.admit(a)
    bench.cluster.delete(a)  # the kubelet has not cleaned up yet: pod-resources still lists it
    bench.agent.tick()
    assert bench.agent.mismatches == []


def test_a_whole_gpu_listing_mig_is_handed_the_full_instance_it_made_as_a_cdi_device(bench: Bench) -> None:
    # GPU 0 is a dynamic A100 in MIG mode, empty: a whole GPU listing mig is its 7g.80gb at slot 0
    # (GPU 1 holds a hand-made 3g.40gb, so its full profile cannot be made)
    key = bench.cluster.create_pod("whole-mig", gpu_count="1", sharing="mig")
    record = bench.cluster.schedule(key)
    (share,) = record.shares
    assert share.index == 0 and share.mig is not None and (share.mig.profile, share.mig.start) == ("7g.80gb", 0)
    assert bench.admit(key)
    (made,) = [i for i in bench.gpus.mig_instances(share.uuid) if i.start == 0 and i.uuid.startswith("MIG-fake")]
    assert [d.name for d in bench.kubelet.answers[(key, "main0")].cdi_devices] == [f"nvidia.com/gpu={made.uuid}"]
    # without mig listed the same request takes a GPU not in MIG mode (the L4 or the H100)
    plain = bench.cluster.create_pod("whole", gpu_count="1")
    (other,) = bench.cluster.schedule(plain).shares
    assert other.mig is None and other.uuid in ("GPU-l4-2", "GPU-h100-3")


def test_the_units_plugin_lists_the_nodes_gpu_units_and_hands_over_nothing(short_tmp: Path) -> None:
    # Four GPUs of at most the reference memory (two A100-80GB under MIG, an L4, an H100 under
    # MPS), no time-slicing: 100 units each, 400 in all (scheduler.core.units).
    cluster = Cluster(short_tmp)
    kubelet = FakeKubelet(short_tmp / "dp", short_tmp / "pr.sock", lambda key, message: None)
    agent = make_agent(short_tmp, node_gpus(), cluster, None, **CONFIG)
    plugin = DevicePlugin(agent, units=True)
    plugin.start()
    try:
        listed = kubelet.wait_for_devices()
        (request,) = kubelet.registrations
        assert (request.resource_name, request.endpoint) == ("gpuslice.io/gpu-units", "gpuslice-units.sock")
        assert listed.devices == [f"unit-{i:04d}" for i in range(400)]
        ask = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=["unit-0000", "unit-0001"])]
        )
        (answer,) = kubelet.stub.Allocate(ask, timeout=5).container_responses
        assert answer == pb.ContainerAllocateResponse()
    finally:
        plugin.stop()
        kubelet.stop()
