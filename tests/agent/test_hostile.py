"""The node side against a hostile tenant, through real gRPC to the fake kubelet and the fake GPUs.

Any namespace may write any pod, annotations included, and the webhook is not always in the
path. So: a pod without a record the agent honours never receives a device, and while one waits
to be admitted the agent refuses every Allocate rather than guess whom it serves; a record is
honoured only if it fits the node's real GPUs beside the records already honoured; an MPS share
is never handed over without the daemon that enforces its caps.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from scheduler.agent.plugin import DevicePlugin
from scheduler.agent.podresources import KubeletPodResources
from tests.agent.kit import NODE, PREFIX, SHARE, FakeRunner, pod_uid
from tests.agent.test_plugin import Bench


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="gs-") as name:
        yield Path(name)


@pytest.fixture
def bench(short_tmp: Path) -> Iterator[Bench]:
    made = Bench(short_tmp)
    yield made
    made.close()


def stranger(bench: Bench, name: str, scheduler: str = "default-scheduler", namespace: str = "other") -> str:
    """A pod another scheduler bound to the node, asking for the agent's share with no record."""
    return bench.cluster.backend.put_pod(
        {
            "apiVersion": "v1",
            "metadata": {"name": name, "namespace": namespace, "uid": pod_uid(name), "creationTimestamp": "2026"},
            "spec": {
                "schedulerName": scheduler,
                "nodeName": NODE,
                "containers": [{"name": "main0", "resources": {"limits": {SHARE: "1"}}}],
            },
            "status": {"phase": "Pending"},
        }
    )


def forged(bench: Bench, name: str, record: dict[str, Any]) -> str:
    """A pod that wrote itself a bound record (where the webhook did not look) and was bound here."""
    key = bench.cluster.create_pod(name, namespace="tenant", gpu_count="1")
    pod = json.loads(json.dumps(bench.cluster.backend.pods()[key]))
    pod["spec"]["nodeName"] = NODE
    pod["metadata"]["annotations"] = {
        PREFIX + "allocation": json.dumps(record),
        PREFIX + "bind-phase": "bound",
    }
    return bench.cluster.backend.put_pod(pod)


def record_of(bench: Bench, key: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(
        bench.cluster.backend.pods()[key]["metadata"]["annotations"][PREFIX + "allocation"]
    )
    return loaded


def one_gpu_record(uuid: str, index: int, mode: str, memory_mib: int, compute_milli: int, **mig: Any) -> dict[str, Any]:
    """A record as gpuslice writes it, for one GPU (``mig``: profile, start, size, slices)."""
    device = {"uuid": uuid, "index": index, "mode": mode, "memoryMiB": memory_mib, "computeMilli": compute_milli}
    return {"node": NODE, "devices": [{**device, "mig": mig or None}], "cpuMilli": 0, "memoryMiB": 0}


def handed(bench: Bench, key: str) -> list[str]:
    return [d.name for d in bench.kubelet.answers[(key, "main0")].cdi_devices]


def refused(bench: Bench, reason: str) -> float:
    text = generate_latest(bench.agent.measure.registry).decode()
    line = f'gpuslice_agent_allocate_refused_total{{node="{NODE}",reason="{reason}"}}'
    values = [float(row.split()[-1]) for row in text.splitlines() if row.startswith(line)]
    return values[0] if values else 0.0


# ---------------------------------------------------------------- whom the handover serves


@pytest.mark.parametrize("scheduler", ["default-scheduler", "gpuslice"])
def test_a_pod_without_a_record_never_gets_the_gpu_of_the_pod_bound_while_it_waits(
    bench: Bench, scheduler: str
) -> None:
    # The finding: the stranger blocks in Allocate; meanwhile gpuslice binds the rightful pod,
    # and the agent answered the stranger with that pod's record.
    rightful = bench.cluster.create_pod("rightful", gpu_count="1", sharing="exclusive")
    intruder = stranger(bench, "intruder", scheduler)
    listing = bench.cluster.list_pods
    bound: list[str] = []

    def bind_meanwhile() -> list[Any]:
        if not bound:
            bound.append(rightful)
            bench.cluster.schedule(rightful)
        return listing()

    bench.cluster.list_pods = bind_meanwhile  # type: ignore[method-assign]
    assert not bench.admit(intruder)
    assert bound, "the agent did not look again while it waited"
    assert (intruder, "main0") not in bench.kubelet.answers
    assert "cannot tell which pod this Allocate serves" in bench.kubelet.rejected[intruder]
    assert f"pods other/{intruder.split('/')[1]} ask for {SHARE}" in bench.kubelet.rejected[intruder]
    assert any(r == "GpusliceNoRecord" and a.name == "intruder" for a, _, r, _ in bench.cluster.events)
    assert refused(bench, "no-record") == 1
    # the kubelet failed the stranger; the rightful pod is admitted next and gets its own GPU
    assert bench.admit(rightful)
    assert handed(bench, rightful) == [f"nvidia.com/gpu={bench.cluster.record(rightful).shares[0].uuid}"]


def test_while_a_stranger_waits_no_pod_is_answered_by_guess(bench: Bench) -> None:
    rightful = bench.cluster.create_pod("rightful", mig_profile="1g.10gb")
    bench.cluster.schedule(rightful)
    stranger(bench, "intruder")
    # the kubelet may be admitting either pod: the agent refuses rather than guess
    assert not bench.admit(rightful)
    assert "cannot tell which pod" in bench.kubelet.rejected[rightful]
    assert not any(i.uuid.startswith("MIG-fake") for i in bench.gpus.mig_instances("GPU-a100-0"))


def test_a_running_pod_without_a_record_does_not_block_admission(bench: Bench) -> None:
    bench.cluster.run_foreign_pod("web")  # asks for no share: not a candidate
    key = bench.cluster.create_pod("job", gpu_count="1", sharing="exclusive")
    bench.cluster.schedule(key)
    assert bench.admit(key)


# ---------------------------------------------------------------- records checked before they are honoured


def test_a_forged_record_naming_another_pods_exclusive_gpu_is_refused(bench: Bench) -> None:
    victim = bench.cluster.create_pod("victim", gpu_count="1", sharing="exclusive")
    bench.cluster.schedule(victim)
    assert bench.admit(victim)
    thief = forged(bench, "thief", record_of(bench, victim))
    assert not bench.admit(thief)
    assert (thief, "main0") not in bench.kubelet.answers
    message = bench.kubelet.rejected[thief]
    assert "record refused" in message and "GPU 3 is not free" in message
    node_events = [m for a, _, r, m in bench.cluster.events if a.kind == "Node" and r == "GpusliceAllocateFailed"]
    assert any("tenant/thief" in m for m in node_events)
    assert refused(bench, "record-refused") == 1


def test_a_forged_record_naming_another_pods_mig_placement_is_refused(bench: Bench) -> None:
    victim = bench.cluster.create_pod("victim", mig_profile="3g.40gb")
    bench.cluster.schedule(victim)
    assert bench.admit(victim)
    made = handed(bench, victim)
    thief = forged(bench, "thief", record_of(bench, victim))
    assert not bench.admit(thief)
    assert "record refused" in bench.kubelet.rejected[thief]
    assert handed(bench, victim) == made
    assert bench.agent.owners() == {"share-000": victim}


def test_a_record_naming_a_gpu_the_node_lacks_creates_no_mig_instance(bench: Bench) -> None:
    body = one_gpu_record("GPU-not-on-this-node", 0, "mig", 9728, 142, profile="1g.10gb", start=0, size=1, slices=1)
    thief = forged(bench, "thief", body)
    before = list(bench.gpus.calls)
    assert not bench.admit(thief)
    assert "record refused" in bench.kubelet.rejected[thief]
    assert "GPU-not-on-this-node" in bench.kubelet.rejected[thief]
    assert bench.gpus.calls == before  # no instance made, none destroyed


def test_an_mps_record_beyond_its_gpu_is_refused_not_handed_with_200_percent(bench: Bench) -> None:
    body = one_gpu_record("GPU-l4-2", 2, "mps", 2 * 23034, 2000)
    thief = forged(bench, "thief", body)
    assert not bench.admit(thief)
    assert (thief, "main0") not in bench.kubelet.answers
    assert "record refused" in bench.kubelet.rejected[thief]


def test_mps_shares_beyond_the_gpu_together_are_refused_for_the_later_one(bench: Bench) -> None:
    first = bench.cluster.create_pod("first", gpu_fraction="0.75", sharing="mps")
    bench.cluster.schedule(first)
    assert bench.admit(first)
    body = record_of(bench, first)
    thief = forged(bench, "thief", body)  # another 75% of the same GPU: 150% together
    assert not bench.admit(thief)
    assert "record refused" in bench.kubelet.rejected[thief]


# ---------------------------------------------------------------- never a share without its caps


class NoMpsRunner(FakeRunner):
    def start(self, argv: Any, env: Any) -> Any:
        raise OSError(2, "No such file or directory", argv[0])


def test_an_mps_share_is_refused_while_its_daemon_cannot_run(short_tmp: Path) -> None:
    from tests.agent.kit import Cluster, make_agent
    from tests.agent.kubelet import FakeKubelet
    from tests.agent.test_stories import CONFIG, node_gpus

    cluster = Cluster(short_tmp)
    kubelet = FakeKubelet(
        short_tmp / "dp", short_tmp / "pr.sock", lambda k, m: cluster.fail_pod(k, "UnexpectedAdmissionError", m)
    )
    agent = make_agent(
        short_tmp,
        node_gpus(),
        cluster,
        KubeletPodResources(str(short_tmp / "pr.sock")),
        runner=NoMpsRunner(),
        **CONFIG,
        shareSlots=16,
    )
    plugin = DevicePlugin(agent)
    plugin.start()
    try:
        key = cluster.create_pod("infer", gpu_fraction="0.25", sharing="mps")
        cluster.schedule(key)
        assert not kubelet.admit(key, ["main0"])
        assert (key, "main0") not in kubelet.answers
        assert "an MPS share needs its caps" in kubelet.rejected[key]
        assert "nvidia-cuda-mps-control" in kubelet.rejected[key]
    finally:
        plugin.stop()
        kubelet.stop()


# ---------------------------------------------------------------- against what gpuslice bound (its ledger)


def test_a_forged_record_for_a_free_gpu_is_refused_as_not_bound_by_gpuslice(bench: Bench) -> None:
    # Collides with nothing honoured: only gpuslice's ledger says gpuslice never bound it.
    body = one_gpu_record("GPU-h100-3", 3, "exclusive", 81559, 1000)
    thief = forged(bench, "thief", body)
    assert not bench.admit(thief)
    assert (thief, "main0") not in bench.kubelet.answers
    assert "has no entry for pod tenant/thief" in bench.kubelet.rejected[thief]
    assert refused(bench, "record-refused") == 1


def test_a_record_edited_after_the_bind_is_refused(bench: Bench) -> None:
    key = bench.cluster.create_pod("edited", gpu_fraction="0.25", sharing="mps")
    bench.cluster.schedule(key)
    pod = json.loads(json.dumps(bench.cluster.backend.pods()[key]))
    record = json.loads(pod["metadata"]["annotations"][PREFIX + "allocation"])
    record["devices"][0]["computeMilli"] = 1000  # the whole GPU's compute, while the webhook was down
    pod["metadata"]["annotations"][PREFIX + "allocation"] = json.dumps(record)
    bench.cluster.backend.put_pod(pod)
    assert not bench.admit(key)
    assert "differs from what gpuslice bound" in bench.kubelet.rejected[key]


def test_an_unreadable_ledger_refuses_rather_than_trusts(bench: Bench) -> None:
    key = bench.cluster.create_pod("job", gpu_count="1", sharing="exclusive")
    bench.cluster.schedule(key)
    bench.cluster.ledger_error = "get configmaps: HTTP 503"
    assert not bench.admit(key)
    assert "cannot be read (get configmaps: HTTP 503)" in bench.kubelet.rejected[key]


def test_an_admitted_pods_record_edited_later_does_not_refuse_the_next_pod(bench: Bench) -> None:
    first = bench.cluster.create_pod("first", gpu_fraction="0.5", sharing="mps")
    bench.cluster.schedule(first)
    assert bench.admit(first)
    second = bench.cluster.create_pod("second", gpu_fraction="0.5", sharing="mps")
    bench.cluster.schedule(second)
    # the first pod's record is edited to all of the GPU's compute: 150% with the second's
    pod = json.loads(json.dumps(bench.cluster.backend.pods()[first]))
    record = json.loads(pod["metadata"]["annotations"][PREFIX + "allocation"])
    record["devices"][0]["computeMilli"] = 1000
    pod["metadata"]["annotations"][PREFIX + "allocation"] = json.dumps(record)
    bench.cluster.backend.put_pod(pod)
    # the agent weighs the first pod as gpuslice bound it (its ledger), so the second fits
    assert bench.admit(second), bench.kubelet.rejected.get(second)


def test_a_pod_made_again_under_the_same_name_with_its_predecessors_record_is_refused(bench: Bench) -> None:
    # The ledger names the pod gpuslice bound by UID: a new pod of the same name (the old one
    # deleted) that copies its predecessor's record word for word is not the pod it names.
    key = bench.cluster.create_pod("job", gpu_count="1", sharing="exclusive")
    bench.cluster.schedule(key)
    pod = json.loads(json.dumps(bench.cluster.backend.pods()[key]))
    pod["metadata"]["uid"] = pod_uid("job-again")
    bench.cluster.backend.put_pod(pod)
    assert not bench.admit(key)
    assert (key, "main0") not in bench.kubelet.answers
    assert f"has no entry for pod {key} (uid {pod_uid('job-again')})" in bench.kubelet.rejected[key]
