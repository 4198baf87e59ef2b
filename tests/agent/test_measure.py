"""Measured use per share, stray use and the overrun guard: stories on fake GPUs with fake processes,
a fake ``/proc`` that maps them to pods, a fake clock, and the real extender reading what the agent
publishes.

The node: GPU 0 an L4 time-sliced four ways (23034 MiB), GPU 1 an L4 shared by MPS, GPU 2 an
A100-80GB in MIG mode (dynamic), GPU 3 an H100 given whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from scheduler.agent.agent import Agent
from scheduler.agent.fake import FakeGpus
from tests.agent.kit import NODE, Cluster, FakeClock, FakeProc, fake_gpus, make_agent, pod_uid

CONFIG: dict[str, Any] = {
    "gpus": {"0": {"mode": "time-slicing", "replicas": 4}, "1": {"mode": "mps"}},
    "overrun": {"graceSeconds": 60},
    "measure": {"strayGraceSeconds": 30, "strayEventSeconds": 600, "publishSeconds": 30},
    "metrics": {"podNames": True},  # the series name their pods (the default names none: test_http.py)
}
L4_MIB = 23034


def node_gpus() -> FakeGpus:
    return fake_gpus(
        {"model": "L4", "uuid": "GPU-l4-0"},
        {"model": "L4", "uuid": "GPU-l4-1"},
        {"model": "A100-80GB", "uuid": "GPU-a100-2", "mig": True},
        {"model": "H100-80GB", "uuid": "GPU-h100-3"},
    )


@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    return Cluster(tmp_path)


@pytest.fixture
def gpus() -> FakeGpus:
    return node_gpus()


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path / "proc")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def agent_of(tmp_path: Path, gpus: FakeGpus, cluster: Cluster, clock: FakeClock, **extra: Any) -> Agent:
    config = {**CONFIG, **extra}
    return make_agent(tmp_path, gpus, cluster, clock=clock, **config)


def running(cluster: Cluster, name: str, namespace: str = "default", **request: str) -> tuple[str, int]:
    """A pod scheduled by gpuslice, its containers started: its key and its GPU."""
    key = cluster.create_pod(name, namespace=namespace, **request)
    record = cluster.schedule(key)
    cluster.start_containers(key)
    return key, record.shares[0].index


def scrape(agent: Agent) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The agent's /metrics, parsed: metric name -> [(labels, value)]."""
    text = generate_latest(agent.measure.registry).decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def one(series: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    found = [v for got, v in series.get(name, []) if labels.items() <= got.items()]
    assert len(found) == 1, (name, labels, series.get(name))
    return found[0]


def events(cluster: Cluster, reason: str) -> list[tuple[Any, str, str, str]]:
    return [e for e in cluster.events if e[2] == reason]


# ---------------------------------------------------------------- use per share


def test_a_process_is_mapped_to_its_pod_and_its_share_is_exported(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus, proc: FakeProc, clock: FakeClock
) -> None:
    agent = agent_of(tmp_path, gpus, cluster, clock)
    key, index = running(cluster, "train", namespace="team-a", gpu_memory="8Gi", sharing="time-slicing")
    assert index == 0
    gpus.add_process(0, 5001, 3000, sm_percent=40)
    gpus.add_process(0, 5002, 1000, sm_percent=5)
    proc.pod_process(5001, "train")
    proc.pod_process(5002, "train", command="python3 worker")
    agent.tick()
    series = scrape(agent)
    labels = {
        "namespace": "team-a",
        "pod": "train",
        "node": NODE,
        "gpu": "0",
        "uuid": "GPU-l4-0",
        "model": "L4",
        "mode": "time-slicing",
        "mig_profile": "",
    }
    (got, _), *_ = series["gpuslice_share_memory_used_mib"]
    assert got == labels  # exactly the labels an operator filters by
    assert one(series, "gpuslice_share_memory_allocated_mib", pod="train") == 8192
    assert one(series, "gpuslice_share_memory_used_mib", pod="train") == 4000  # 3000 + 1000
    assert one(series, "gpuslice_share_compute_used_milli", pod="train") == 450  # (40 + 5) percent x 10
    assert one(series, "gpuslice_share_processes", pod="train") == 2
    assert one(series, "gpuslice_share_overrun", pod="train") == 0
    assert one(series, "gpuslice_gpu_memory_used_mib", gpu="0") == 4000
    assert one(series, "gpuslice_stray_memory_mib", gpu="0") == 0
    # the usage annotation, as the extender reads it: memory rounded up to 64 MiB (4000 -> 4032)
    assert cluster.usage()["pods"] == {key: [{"index": 0, "usedMiB": 4032, "usedComputeMilli": 500}]}
    (pod,) = [p for p in cluster.extender.describe(NODE)[0]["pods"] if p["pod"] == key]
    assert (pod["shares"][0]["usedMiB"], pod["shares"][0]["memoryMiB"]) == (4032, 8192)
    (share,) = agent.measure.view().sample.shares
    assert {p.container for p in share.processes} == {"main0"}  # the container, through its runtime ID


def test_an_idle_share_shows_allocated_and_nothing_used(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus, proc: FakeProc, clock: FakeClock
) -> None:
    agent = agent_of(tmp_path, gpus, cluster, clock)
    running(cluster, "idle", gpu_memory="6Gi", sharing="mps", gpu_compute="30")
    agent.tick()
    series = scrape(agent)
    assert one(series, "gpuslice_share_memory_allocated_mib", pod="idle", mode="mps") == 6144
    assert one(series, "gpuslice_share_memory_used_mib", pod="idle") == 0
    assert one(series, "gpuslice_share_compute_allocated_milli", pod="idle") == 300
    assert one(series, "gpuslice_share_compute_used_milli", pod="idle") == 0


def test_a_mig_share_is_measured_in_its_instance_without_utilisation(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus, proc: FakeProc, clock: FakeClock
) -> None:
    agent = agent_of(tmp_path, gpus, cluster, clock)
    key = cluster.create_pod("mig", mig_profile="3g.40gb")
    cluster.schedule(key)
    agent.allocate(("share-000",))  # the agent makes the instance
    cluster.start_containers(key)
    (inst,) = gpus.mig_instances("GPU-a100-2")
    gpus.add_process(2, 6001, 30000, instance_uuid=inst.uuid)
    proc.pod_process(6001, "mig")
    agent.tick()
    series = scrape(agent)
    assert one(series, "gpuslice_share_memory_used_mib", pod="mig", mig_profile="3g.40gb", mode="mig") == 30000
    assert not [s for s in series.get("gpuslice_share_compute_used_milli", []) if s[0]["pod"] == "mig"]
    assert one(series, "gpuslice_stray_processes", gpu="2") == 0


def test_series_of_a_pod_that_is_gone_are_removed_and_stay_bounded(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus, proc: FakeProc, clock: FakeClock
) -> None:
    agent = agent_of(tmp_path, gpus, cluster, clock)
    counts = []
    for k in range(12):  # pods come and go, one at a time
        key, index = running(cluster, f"job-{k}", gpu_memory="2Gi", sharing="time-slicing")
        gpus.add_process(index, 7000 + k, 500)
        proc.pod_process(7000 + k, f"job-{k}")
        agent.tick()
        counts.append(sum(len(v) for v in scrape(agent).values()))
        assert one(scrape(agent), "gpuslice_share_memory_used_mib", pod=f"job-{k}") == 500
        cluster.delete(key)
        gpus.remove_process(index, 7000 + k)
        agent.tick()
        assert not any(labels.get("pod") == f"job-{k}" for v in scrape(agent).values() for labels, _ in v)
    assert len(set(counts)) == 1  # the same number of series with one pod, whichever pod


# ---------------------------------------------------------------- stray use


def test_a_stray_process_is_reported_and_the_extender_counts_its_memory(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus, proc: FakeProc, clock: FakeClock
) -> None:
    agent = agent_of(tmp_path, gpus, cluster, clock)
    gpus.add_process(1, 4242, 8000)  # a host process on the MPS L4
    proc.host_process(4242, "python3")
    fits_now = cluster.create_pod("sixteen", gpu_memory="14Gi", sharing="mps", gpu_compute="10")
    assert cluster.filter(fits_now)["NodeNames"] == [NODE]
    agent.tick()
    assert one(scrape(agent), "gpuslice_stray_memory_mib", gpu="1") == 8000
    assert one(scrape(agent), "gpuslice_stray_processes", gpu="1") == 1
    # published for placement, rounded up to 256 MiB: 8000 -> 8192
    assert cluster.inventory()["devices"][1]["strayMemoryMiB"] == 8192
    # 23034 - 8192 = 14842 MiB left: 14 GiB (14336) fits, 15 GiB (15360) does not
    assert cluster.filter(fits_now)["NodeNames"] == [NODE]
    too_big = cluster.create_pod("fifteen", gpu_memory="15Gi", sharing="mps", gpu_compute="10")
    result = cluster.filter(too_big)
    failed = {**(result["FailedNodes"] or {}), **(result["FailedAndUnresolvableNodes"] or {})}
    assert failed[NODE] == "needs 15360 MiB on one GPU, more than is free"
    (row,) = [d for d in cluster.extender.describe(NODE)[0]["devices"] if d["index"] == 1]
    assert (row["strayMemoryMiB"], row["memoryFreeMiB"]) == (8192, L4_MIB - 8192)
    (stray,) = cluster.extender.describe(NODE)[0]["measured"]["stray"]
    assert stray == {"index": 1, "pid": 4242, "memoryMiB": 8000, "why": "host process python3"}
    # the Event: only once seen for the grace period, then at most every strayEventSeconds
    assert events(cluster, "GpusliceStrayProcess") == []
    for _ in range(5):
        clock.now += 10
        agent.tick()
    (about, kind, _, message) = events(cluster, "GpusliceStrayProcess")[0]
    assert (about.kind, about.name, kind) == ("Node", NODE, "Warning")
    assert message == (
        "GPU 1 (GPU-l4-1): PID 4242 holds 8000 MiB that no gpuslice allocation record on this GPU "
        "accounts for: host process python3"
    )
    for _ in range(20):  # 200 s more of samples: still one Event
        clock.now += 10
        agent.tick()
    assert len(events(cluster, "GpusliceStrayProcess")) == 1
    clock.now += 600
    agent.tick()
    assert len(events(cluster, "GpusliceStrayProcess")) == 2  # again after the interval
    # the process ends: the extender sees the memory free again
    gpus.remove_process(1, 4242)
    agent.tick()
    assert "strayMemoryMiB" not in cluster.inventory()["devices"][1]
    assert cluster.filter(too_big)["NodeNames"] == [NODE]


def test_a_stray_process_on_an_exclusive_gpu_keeps_whole_gpu_pods_off_it(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus, proc: FakeProc, clock: FakeClock
) -> None:
    agent = agent_of(tmp_path, gpus, cluster, clock)
    whole = cluster.create_pod("whole", gpu_count="1", sharing="exclusive")
    assert cluster.filter(whole)["NodeNames"] == [NODE]
    gpus.add_process(3, 4300, 500)
    proc.host_process(4300, "nvidia-smi")
    agent.tick()
    result = cluster.filter(whole)
    failed = {**(result["FailedNodes"] or {}), **(result["FailedAndUnresolvableNodes"] or {})}
    assert failed[NODE] == "GPU 3 is not free: 512 MiB held by processes no allocation record accounts for"


def test_whose_stray_process_it_is_is_said(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus, proc: FakeProc, clock: FakeClock
) -> None:
    agent = agent_of(tmp_path, gpus, cluster, clock)
    cluster.run_foreign_pod("other", namespace="team-b")
    key, index = running(cluster, "mine", gpu_memory="4Gi", sharing="time-slicing")
    gpus.add_process(0, 100, 1000)
    proc.pod_process(100, "other")  # another scheduler's pod on a GPU it was not given
    gpus.add_process(1, 101, 2000)
    proc.pod_process(101, "mine")  # our pod, on a GPU its record does not name
    gpus.add_process(1, 102, 300)
    proc.pod_process(102, "nobody-here")  # a pod this node does not know
    gpus.add_process(1, 103, 40)
    proc.host_process(103, "nvidia-cuda-mps")  # the MPS server: plumbing, not stray
    gpus.add_process(1, 104, 10)  # gone before its cgroup was read: left out
    agent.tick()
    why = {s.pid: s.why for s in agent.measure.view().sample.strays}
    assert why == {
        100: "pod team-b/other has no gpuslice record that counts (placed by another scheduler)",
        101: f"pod {key}'s record names GPU {index}, not GPU 1",
        102: f"pod UID {pod_uid('nobody-here')}, not a live pod on this node",
    }
    assert one(scrape(agent), "gpuslice_stray_memory_mib", gpu="1") == 2300


def test_a_process_in_a_mig_instance_its_record_does_not_name_is_stray(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus, proc: FakeProc, clock: FakeClock
) -> None:
    agent = agent_of(tmp_path, gpus, cluster, clock)
    key = cluster.create_pod("mig", mig_profile="3g.40gb")
    record = cluster.schedule(key)
    agent.allocate(("share-000",))
    cluster.start_containers(key)
    start = record.shares[0].mig.start if record.shares[0].mig else -1
    other = gpus.make_by_hand(2, "1g.10gb", 0 if start == 4 else 6)  # someone else's instance
    gpus.add_process(2, 6100, 5000, instance_uuid=other.uuid)
    proc.pod_process(6100, "mig")  # our pod's process, but in that instance
    agent.tick()
    (stray,) = agent.measure.view().sample.strays
    assert stray.why == f"pod {key} runs in MIG instance {other.uuid}; its record names 3g.40gb at slot {start}"
    assert one(scrape(agent), "gpuslice_share_memory_used_mib", pod="mig") == 0
    # on a MIG GPU a stray process takes no free slot: reported, not published for placement
    assert one(scrape(agent), "gpuslice_stray_memory_mib", gpu="2") == 5000
    assert "strayMemoryMiB" not in cluster.inventory()["devices"][2]


# ---------------------------------------------------------------- the guard


def overrun_pod(cluster: Cluster, gpus: FakeGpus, proc: FakeProc, namespace: str = "batch") -> str:
    key, index = running(cluster, "hog", namespace=namespace, gpu_memory="4Gi", sharing="time-slicing")
    assert index == 0
    gpus.add_process(0, 9001, 6000)  # 6000 MiB used on a 4096 MiB share
    proc.pod_process(9001, "hog")
    return key


def test_an_overrun_held_past_the_grace_period_gives_one_event_and_with_evict_one_eviction(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus, proc: FakeProc, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger="gpuslice.agent.guard")
    agent = agent_of(tmp_path, gpus, cluster, clock, overrun={"graceSeconds": 60, "namespaces": {"batch": "evict"}})
    key = overrun_pod(cluster, gpus, proc)
    for _ in range(6):  # 0 .. 50 s: inside the grace period
        agent.tick()
        clock.now += 10
    assert events(cluster, "GpusliceShareOverrun") == [] and cluster.evictions == []
    assert one(scrape(agent), "gpuslice_share_overrun", pod="hog") == 0
    agent.tick()  # 60 s
    (about, kind, _, message) = events(cluster, "GpusliceShareOverrun")[0]
    assert (about.kind, about.namespace, about.name, about.uid, kind) == (
        "Pod",
        "batch",
        "hog",
        pod_uid("hog"),
        "Warning",
    )
    assert message.startswith(
        "pod batch/hog uses 6000 MiB on GPU 0 (GPU-l4-0, time-slicing), above its share of 4096 MiB, for 60s"
    )
    assert message.endswith("processes: 9001/main0 6000 MiB); action: evict")
    (evicted,) = cluster.evictions
    assert (evicted.namespace, evicted.name, evicted.uid) == ("batch", "hog", pod_uid("hog"))
    assert key not in cluster.backend.pods()
    series = scrape(agent)
    assert one(series, "gpuslice_agent_overruns_total", action="reported") == 1
    assert one(series, "gpuslice_agent_overruns_total", action="evicted") == 1
    for _ in range(10):
        clock.now += 60
        agent.tick()
    assert len(events(cluster, "GpusliceShareOverrun")) == 1 and len(cluster.evictions) == 1
    # each action logged with the figures that caused it
    logged = [r.getMessage() for r in caplog.records if r.name == "gpuslice.agent.guard"]
    assert [m.split(":")[0] for m in logged] == ["overrun", "evicted batch/hog through the Eviction API"]
    assert all("uses 6000 MiB on GPU 0" in m and "above its share of 4096 MiB" in m for m in logged)


def test_a_pod_that_takes_long_to_terminate_is_evicted_once(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus, proc: FakeProc, clock: FakeClock
) -> None:
    agent = agent_of(tmp_path, gpus, cluster, clock, overrun={"graceSeconds": 60, "namespaces": {"batch": "evict"}})
    key = overrun_pod(cluster, gpus, proc)
    cluster.slow_termination = True  # the Eviction is accepted; the pod and its process stay a while
    for _ in range(40):  # 400 s, the process still over its share
        agent.tick()
        clock.now += 10
    assert len(cluster.evictions) == 1 and key in cluster.backend.pods()
    assert len(events(cluster, "GpusliceShareOverrun")) == 1


def test_report_only_is_the_default(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus, proc: FakeProc, clock: FakeClock
) -> None:
    agent = agent_of(tmp_path, gpus, cluster, clock)
    key = overrun_pod(cluster, gpus, proc)
    running(cluster, "quiet", namespace="team-a", gpu_memory="2Gi", sharing="time-slicing")  # within its share
    for _ in range(20):
        agent.tick()
        clock.now += 10
    (event,) = events(cluster, "GpusliceShareOverrun")
    assert event[3].endswith("action: report only")
    assert cluster.evictions == [] and key in cluster.backend.pods()
    assert one(scrape(agent), "gpuslice_share_overrun", pod="hog") == 1
    assert cluster.usage()["pods"][key] == [{"index": 0, "usedMiB": 6016, "overrun": True}]
    # the short table has no column for it: a line under it says so
    from scheduler.extender.inspection import render

    lines = render(cluster.extender.describe()).splitlines()
    flagged = [line for line in lines if line.startswith(f"{NODE}: GPU")]
    assert flagged == [f"{NODE}: GPU 0: {key} used 6016/4096 MiB OVERRUN"]


def test_a_short_spike_inside_the_grace_period_gives_nothing(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus, proc: FakeProc, clock: FakeClock
) -> None:
    agent = agent_of(tmp_path, gpus, cluster, clock, overrun={"graceSeconds": 60, "action": "evict"})
    overrun_pod(cluster, gpus, proc)
    for second in range(0, 600, 10):
        # above for 20 s every 5 minutes, within its share otherwise: never most of a grace period
        gpus.set_process(0, 9001, 6000 if second % 300 < 20 else 4000)
        agent.tick()
        clock.now += 10
    assert events(cluster, "GpusliceShareOverrun") == [] and cluster.evictions == []
    assert one(scrape(agent), "gpuslice_agent_overruns_total", action="reported") == 0


def test_a_pod_that_dips_under_its_share_once_per_grace_period_is_still_reported(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus, proc: FakeProc, clock: FakeClock
) -> None:
    agent = agent_of(tmp_path, gpus, cluster, clock, overrun={"graceSeconds": 60, "action": "evict"})
    key = overrun_pod(cluster, gpus, proc)
    for second in range(0, 130, 10):
        # above for 50 s, back within its share for 10 s, over and over: judged over the grace
        # period as a whole (5 of its 7 samples above), not reset by the one sample under
        gpus.set_process(0, 9001, 6000 if second % 60 < 50 else 4000)
        agent.tick()
        clock.now += 10
    assert len(events(cluster, "GpusliceShareOverrun")) == 1
    assert [f"{r.namespace}/{r.name}" for r in cluster.evictions] == [key]


def test_a_failed_read_is_unknown_not_under_its_share(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus, proc: FakeProc, clock: FakeClock
) -> None:
    agent = agent_of(tmp_path, gpus, cluster, clock, overrun={"graceSeconds": 60})
    overrun_pod(cluster, gpus, proc)  # 6000 MiB on a 4096 MiB share, throughout
    for second in range(0, 80, 10):
        # NVML cannot list the processes from 20 s to 60 s: those samples say nothing
        gpus.fail_process_reads(0, "NVML: Unknown Error" if 20 <= second < 60 else None)
        agent.tick()
        if second == 30:
            series = scrape(agent)
            assert one(series, "gpuslice_share_memory_allocated_mib", pod="hog") == 4096
            used = [v for labels, v in series.get("gpuslice_share_memory_used_mib", []) if labels["pod"] == "hog"]
            assert used == [], "an unread share has no used figure, not a 0"
        clock.now += 10
    # the episode began at 0 s and was never "under": reported once it lasted the grace period
    assert len(events(cluster, "GpusliceShareOverrun")) == 1


def test_a_pod_of_another_scheduler_is_never_evicted(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus, proc: FakeProc, clock: FakeClock
) -> None:
    agent = agent_of(tmp_path, gpus, cluster, clock, overrun={"graceSeconds": 60, "action": "evict"})
    key = cluster.run_foreign_pod("theirs", namespace="batch")
    gpus.add_process(0, 9100, 20000)  # most of the L4, for ten minutes
    proc.pod_process(9100, "theirs")
    for _ in range(60):
        agent.tick()
        clock.now += 10
    assert cluster.evictions == [] and key in cluster.backend.pods()
    assert events(cluster, "GpusliceShareOverrun") == []
    assert events(cluster, "GpusliceStrayProcess")  # what it is: stray use, reported on the Node


def test_a_record_gpuslice_did_not_bind_is_never_evicted(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus, proc: FakeProc, clock: FakeClock
) -> None:
    import json

    agent = agent_of(tmp_path, gpus, cluster, clock, overrun={"graceSeconds": 60, "action": "evict"})
    key = overrun_pod(cluster, gpus, proc)
    pod = json.loads(json.dumps(cluster.backend.pods()[key]))
    pod["metadata"]["annotations"]["gpuslice.io/bind-phase"] = "allocating"  # a copied record, not our Binding
    cluster.backend.put_pod(pod)
    for _ in range(20):
        agent.tick()
        clock.now += 10
    assert cluster.evictions == [] and events(cluster, "GpusliceShareOverrun") == []


def test_mig_and_exclusive_shares_are_only_reported(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus, proc: FakeProc, clock: FakeClock
) -> None:
    agent = agent_of(tmp_path, gpus, cluster, clock, overrun={"graceSeconds": 60, "action": "evict"})
    key, index = running(cluster, "whole", gpu_count="1", sharing="exclusive")
    gpus.add_process(index, 9200, 90000)  # more than the share (a figure NVML would not give: the rule holds anyway)
    proc.pod_process(9200, "whole")
    for _ in range(10):
        agent.tick()
        clock.now += 10
    (event,) = events(cluster, "GpusliceShareOverrun")
    assert event[3].endswith("action: report only (exclusive shares are isolated)")
    assert cluster.evictions == [] and key in cluster.backend.pods()


def test_an_eviction_a_budget_refuses_is_asked_again_once_per_grace_period(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus, proc: FakeProc, clock: FakeClock
) -> None:
    agent = agent_of(tmp_path, gpus, cluster, clock, overrun={"graceSeconds": 60, "namespaces": {"batch": "evict"}})
    key = overrun_pod(cluster, gpus, proc)
    cluster.refuse_evictions = "Cannot evict pod as it would violate the pod's disruption budget."
    for _ in range(19):  # 0 .. 180 s: tries at 60, 120 and 180 s
        agent.tick()
        clock.now += 10
    assert len(cluster.evictions) == 3 and key in cluster.backend.pods()
    assert one(scrape(agent), "gpuslice_agent_overruns_total", action="eviction_failed") == 3
    cluster.refuse_evictions = ""
    for _ in range(12):
        agent.tick()
        clock.now += 10
    assert len(cluster.evictions) == 4 and key not in cluster.backend.pods()
    assert len(events(cluster, "GpusliceShareOverrun")) == 1


# ---------------------------------------------------------------- writes to the API server


def test_the_usage_annotation_is_written_only_on_change_and_at_most_every_publish_interval(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus, proc: FakeProc, clock: FakeClock
) -> None:
    agent = agent_of(tmp_path, gpus, cluster, clock)
    running(cluster, "steady", gpu_memory="8Gi", sharing="time-slicing")
    gpus.add_process(0, 5100, 3000, sm_percent=30)
    proc.pod_process(5100, "steady")
    agent.tick()
    written = cluster.patches["usage"]
    for k in range(30):  # jitter inside the rounding (64 MiB, 10 percent): no change
        gpus.set_process(0, 5100, 3000 + k % 7, sm_percent=30 + k % 3)
        clock.now += 2
        agent.tick()
    assert cluster.patches["usage"] == written
    gpus.set_process(0, 5100, 6000, sm_percent=30)  # a real change, 60 s after the last write
    clock.now += 2
    agent.tick()
    assert cluster.patches["usage"] == written + 1
    gpus.set_process(0, 5100, 7000, sm_percent=30)  # another, 2 s later: waits for the interval
    clock.now += 2
    agent.tick()
    assert cluster.patches["usage"] == written + 1
    clock.now += 30
    agent.tick()
    assert cluster.patches["usage"] == written + 2
    assert cluster.usage()["pods"]["default/steady"][0]["usedMiB"] == 7040
    assert cluster.usage()["at"] == "2026-01-01T00:00:00Z"


# ---------------------------------------------------------------- gpuslice inspect


def test_inspect_shows_used_next_to_allocated_and_a_line_per_stray_process(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus, proc: FakeProc, clock: FakeClock
) -> None:
    from scheduler.extender.inspection import render

    agent = agent_of(tmp_path, gpus, cluster, clock)
    running(cluster, "train", namespace="team-a", gpu_memory="8Gi", sharing="time-slicing")
    running(cluster, "quiet", namespace="team-a", gpu_memory="2Gi", sharing="time-slicing")
    gpus.add_process(0, 5001, 3000, sm_percent=40)
    proc.pod_process(5001, "train")
    gpus.add_process(1, 4242, 8000)
    proc.host_process(4242, "python3")
    agent.tick()
    text = render(cluster.extender.describe(), "wide")
    # 8 GiB on an L4 (23034 MiB): compute in proportion, ceil(8192 x 1000 / 23034) = 356 milli = 35.6 percent
    assert "team-a/train used 3008/8192 MiB, 40/35.6 percent" in text
    assert "team-a/quiet used 0/2048 MiB, 0/8.9 percent" in text
    assert "stray: GPU 1 PID 4242 holds 8000 MiB: host process python3" in text
    # without the agent's figures, inspect shows what it always showed
    bare = cluster.extender.describe()
    for node in bare:
        node["measured"] = None
        for pod in node["pods"]:
            for share in pod["shares"]:
                share.pop("usedMiB", None)
    text = render(bare, "wide")
    assert "team-a/quiet, team-a/train" in text
    assert "train used" not in text and "stray:" not in text


def test_an_unreadable_usage_annotation_is_shown_and_changes_nothing_else(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus, proc: FakeProc, clock: FakeClock
) -> None:
    agent_of(tmp_path, gpus, cluster, clock)
    cluster.set_node_annotations({"gpuslice.io/usage": "{broken"})
    (node,) = cluster.extender.describe(NODE)
    assert node["usable"] is True
    assert node["measured"]["problem"].startswith("node gpu-1: usage annotation: not JSON")


def test_a_process_is_measured_by_its_cgroup_not_its_name(
    tmp_path: Path, cluster: Cluster, gpus: FakeGpus, proc: FakeProc, clock: FakeClock
) -> None:
    agent = agent_of(tmp_path, gpus, cluster, clock, overrun={"graceSeconds": 60})
    key = overrun_pod(cluster, gpus, proc)
    proc.pod_process(9001, "hog", command="nvidia-cuda-mps-server")  # a tenant's process, renamed
    cluster.run_foreign_pod("sneaky", namespace="team-b")
    gpus.add_process(1, 9002, 3000)
    proc.pod_process(9002, "sneaky", command="nvidia-cuda-mps-control")  # another scheduler's pod, renamed
    # the agent's own MPS daemon: its child, in its own pod's cgroup
    proc.pod_process(os_self := 9003, "gpuslice-agent", command="nvidia-cuda-mps-server")
    (proc.root / "self").mkdir()
    (proc.root / "self" / "cgroup").write_text((proc.root / str(os_self) / "cgroup").read_text())
    gpus.add_process(1, os_self, 200)
    for _ in range(8):
        agent.tick()
        clock.now += 10
    assert one(scrape(agent), "gpuslice_share_memory_used_mib", pod="hog") == 6000
    assert len(events(cluster, "GpusliceShareOverrun")) == 1 and key.endswith("/hog")
    strays = {s.pid: s.why for s in agent.measure.view().sample.strays}
    assert list(strays) == [9002]  # the renamed process is stray; the agent's own daemon is not
