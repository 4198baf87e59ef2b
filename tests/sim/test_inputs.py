"""Readers: openb CSVs, scenarios, Kubernetes Lists; bad input names file, line or row, and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.core.inventory import SharingMode
from scheduler.core.request import GpuKind
from scheduler.sim.errors import TraceError
from scheduler.sim.load import embedded_scenario, load_trace
from scheduler.sim.openb import read_pods, read_trace
from tests.sim.helpers import OPENB_NODES, POD_HEADER, openb_files, scenario


def test_openb_mapping(tmp_path: Path) -> None:
    trace = read_trace(openb_files(tmp_path))
    assert trace.name == "tiny"
    assert [len(n.devices) for n in trace.nodes] == [2, 4, 1]
    assert trace.gpus == 7
    assert trace.capacity_milli == 7000
    # every GPU is an MPS device whose client limit never binds
    device = trace.nodes[1].devices[0]
    assert device.mode is SharingMode.MPS and device.mps_client_limit >= 1000
    assert device.model.name == "G2"  # unknown model, assumed memory
    share, whole, cpu, multi, spec, _ = (p.demand for p in trace.pods)
    assert (share.gpu.kind, share.gpu.count, share.gpu.fraction_milli) == (GpuKind.SHARE, 1, 500)
    assert (whole.gpu.kind, whole.gpu.count) == (GpuKind.WHOLE, 1)
    assert cpu.gpu.kind is GpuKind.NONE and cpu.cpu_milli == 2000 and cpu.memory_mib == 4096
    assert (multi.gpu.kind, multi.gpu.count) == (GpuKind.WHOLE, 2)
    assert spec.gpu.models == ("V100-16GB", "T4")  # trace codes to catalogue names
    assert trace.pods[0].created == 0 and trace.pods[0].deleted == 100
    assert trace.pods[1].deleted is None


def test_openb_multigpu_files_have_fewer_columns(tmp_path: Path) -> None:
    path = tmp_path / "openb_pod_list_multigpu.csv"
    path.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,10,8,1000\n")
    (pod,) = read_pods(path)
    assert pod.demand.gpu.count == 8 and pod.created is None


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("p,1000,10,1,abc,,LS,Running,0,1,0", "openb_pod_list_tiny.csv row 2: gpu_milli 'abc' is not an integer"),
        ("p,1000,10,1,1500,,LS,Running,0,1,0", "row 2: gpu_milli 1500 is out of range (accepted: from 0 to 1000)"),
        ("p,-5,10,1,500,,LS,Running,0,1,0", "row 2: cpu_milli -5 is out of range"),
        ("p,1000,10,0,500,,LS,Running,0,1,0", "row 2: gpu_milli 500 with num_gpu 0"),
        ("p,1000,10,2,0,,LS,Running,0,1,0", "row 2: gpu_milli 0 with num_gpu 2"),
        ("p,1000,10,1,500,,LS,Running,9,3,0", "row 2: deletion_time 3 is before creation_time 9"),
        ("p,1000,10,1,500,,LS,Running,soon,,0", "row 2: creation_time 'soon' is not a number of seconds"),
        ("p,1000,10,1", "row 2: has 11 columns in the header but a different number in this row"),
        ("ok,1000,10,1,500,,LS,Running,0,1,0", "row 2: name 'ok' appears twice"),
    ],
)
def test_openb_pod_errors_name_file_row_and_field(tmp_path: Path, row: str, message: str) -> None:
    path = openb_files(tmp_path, f"{POD_HEADER}\nok,1000,10,1,500,,LS,Running,0,1,0\n{row}\n")
    with pytest.raises(TraceError) as info:
        read_trace(path)
    assert message in str(info.value)


def test_openb_node_errors(tmp_path: Path) -> None:
    path = openb_files(tmp_path, nodes=OPENB_NODES + "node-d,16000,65536,2,\n")
    with pytest.raises(TraceError, match=r"openb_node_list_gpu_node.csv row 4: model is empty but gpu is 2"):
        read_trace(path)
    path = openb_files(tmp_path, nodes="sn,cpu_milli,gpu,model\nx,1,1,T4\n")
    with pytest.raises(TraceError, match=r"header: missing column\(s\) memory_mib"):
        read_trace(path)


def test_openb_needs_its_node_list(tmp_path: Path) -> None:
    path = tmp_path / "openb_pod_list_x.csv"
    path.write_text(f"{POD_HEADER}\n")
    with pytest.raises(TraceError, match=r"openb_node_list_gpu_node\.csv was not found beside it"):
        load_trace(path)


# ---------------------------------------------------------------- scenarios

FULL = """
name: full
nodes:
  - name: mig-static
    cpu: 64
    memory: 512Gi
    gpus:
      model: A100-80GB
      count: 2
      mode: mig
      mig: {instances: [3g.40gb, {profile: 2g.20gb, start: 4}, 1g.10gb]}
  - name: mig-dynamic
    count: 2
    gpus: {model: H100-80GB, count: 4, mode: mig, mig: {allowed: [1g.10gb, 3g.40gb]}}
  - {name: mps, gpus: {model: L4, count: 4, mode: mps, mps_clients: 8}, mps_compute_oversub_pct: 150}
  - {name: ts, gpus: {model: T4, count: 2, mode: time-slicing, replicas: 4}, ts_memory_oversub_pct: 200}
  - {name: whole, nvlink: all, gpus: {model: H100-80GB, count: 4}}
  - {name: custom, gpus: {model: RTX-6000, memory: 48Gi, count: 2, mode: mps}}
  - {name: cpu, cpu: 16}
pods:
  - {name: train, count: 2, cpu: 16, memory: 128Gi, gpu: {count: 4}, arrive: 5, duration: 60}
  - {name: mig, gpu: {mig: 3g.40gb}}
  - {name: mem, gpu: {memory: 20Gi, compute: 30, sharing: mps, models: [L4, RTX-6000]}}
workloads:
  - name: gen
    pods: 10
    rate: 2
    duration: {distribution: uniform, low: 5, high: 10}
    shapes: [{weight: 1, gpu: {fraction: 0.25}}, {weight: 2, cpu: 500m}]
"""


def test_scenario_node_groups_in_every_mode() -> None:
    trace = scenario(FULL)
    names = [n.name for n in trace.nodes]
    assert names == ["mig-static", "mig-dynamic-0", "mig-dynamic-1", "mps", "ts", "whole", "custom", "cpu"]
    static = trace.nodes[0].devices[0]
    # given starts first (2g.20gb at 4); then 3g.40gb: slot 4 is taken, so 0; 1g.10gb (one
    # memory slot on the 80 GB card) where it blocks least: slot 6
    assert [(i.profile.name, i.start) for i in static.mig_instances] == [("3g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)]
    assert trace.nodes[1].devices[0].mig_allowed == ("1g.10gb", "3g.40gb")
    assert trace.nodes[3].mps_compute_oversub_pct == 150 and trace.nodes[3].devices[0].mps_client_limit == 8
    assert trace.nodes[4].devices[1].replicas == 4 and trace.nodes[4].ts_memory_oversub_pct == 200
    assert len(trace.nodes[5].nvlink) == 6  # all pairs of 4 GPUs
    assert trace.nodes[6].devices[0].memory_mib == 48 * 1024
    assert trace.nodes[7].devices == () and trace.nodes[7].cpu_milli == 16_000
    train = trace.pods[0]
    assert (train.name, train.created, train.deleted) == ("train-0", 5, 65)
    mem = trace.pods[3].demand.gpu
    assert (mem.memory_mib, mem.compute_milli, mem.models) == (20 * 1024, 300, ("L4", "RTX-6000"))
    assert trace.generators[0].count == 10 and trace.generators[0].duration is not None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nodes: []\npods: []\n", "line 1: nodes: at least one node group is needed"),
        (
            "nodes:\n  - {name: a, gpus: {model: T4, mode: nvlink}}\npods: [{name: p}]\n",
            "line 2: nodes[0].gpus.mode: 'nvlink' (accepted: exclusive, mps, time-slicing, mig)",
        ),
        (
            "nodes:\n  - {name: a, gpus: {model: T4, count: 1, mode: mig}}\npods: [{name: p}]\n",
            "line 2: nodes[0].gpus.mode: model T4 cannot do MIG",
        ),
        (
            "nodes:\n  - {name: a, gpus: {model: Mystery}}\npods: [{name: p}]\n",
            "nodes[0].gpus.model: unknown GPU model 'Mystery' needs its memory in MiB (give gpus.memory)",
        ),
        (
            "nodes: [{name: a}]\npods:\n  - name: p\n    gpu: {fraction: 1.5}\n",
            "line 4: pods[0].gpu.fraction: invalid value '1.5'; accepted: a number in (0, 1]",
        ),
        ("nodes: [{name: a}]\npods:\n  - {name: p, gpu: {mig: 5g.99gb}}\n", "pods[0].gpu.mig"),
        ("nodes: [{name: a}]\npods:\n  - {name: p, cpu: lots}\n", "line 3: pods[0].cpu: 'lots' is not a CPU quantity"),
        (
            "nodes: [{name: a, colour: red}]\npods: [{name: p}]\n",
            "line 1: nodes[0].colour: unknown key (accepted: count, cpu, gpus, max_pods, memory",
        ),
        (
            "nodes: [{name: a}]\nworkloads:\n  - {name: w, pods: 3, shapes: []}\n",
            "line 3: workloads[0].shapes: at least one shape with a positive weight is needed",
        ),
        ("nodes: [{name: a}]\nreplay: later\npods: [{name: p}]\n", "replay: 'later' (accepted: arrivals, timed)"),
        ("nodes: [{name: a}\n", "test.yaml line 2: is not valid YAML"),
        (
            "nodes:\n  - name: a\n    gpus:\n      model: A100-80GB\n      mode: mig\n      mig:\n"
            "        instances: [4g.40gb, 4g.40gb]\npods: [{name: p}]\n",
            "line 7: nodes[0].gpus.mig.instances[1]: 4g.40gb: no legal slot left",
        ),
    ],
)
def test_scenario_errors_name_line_and_field(text: str, message: str) -> None:
    with pytest.raises(TraceError) as info:
        scenario(text)
    assert message in str(info.value)


def test_embedded_scenario_loads() -> None:
    trace = embedded_scenario()
    assert trace.gpus == 44 and trace.inflate == 1.3
    assert {d.mode for n in trace.nodes for d in n.devices} == set(SharingMode)


# ---------------------------------------------------------------- Kubernetes Lists


def kube_list(items: str) -> str:
    return "apiVersion: v1\nkind: List\nitems:\n" + items


NODE = """- apiVersion: v1
  kind: Node
  metadata:
    name: n1
    labels: {nvidia.com/gpu.product: NVIDIA-L4, nvidia.com/gpu.count: "2", nvidia.com/gpu.memory: "23034",
             nvidia.com/gpu.sharing-strategy: mps}
  status: {allocatable: {cpu: "16", memory: 64Gi, pods: "110", nvidia.com/gpu: "2"}}
"""


def test_kube_list_nodes_bound_and_pending_pods(tmp_path: Path) -> None:
    record = (
        '{"node":"n1","devices":[{"uuid":"GPU-n1-0","index":0,"mode":"mps","memoryMiB":11517,'
        '"computeMilli":500,"mig":null}],"cpuMilli":1000,"memoryMiB":1024}'
    )
    pods = f"""- kind: Pod
  metadata: {{name: bound, namespace: t, annotations: {{gpuslice.io/gpu-fraction: "0.5",
             gpuslice.io/allocation: '{record}'}}}}
  spec: {{nodeName: n1, containers: [{{name: c, resources: {{requests: {{cpu: "1", memory: 1Gi}}}}}}]}}
- kind: Pod
  metadata: {{name: done, namespace: t, annotations: {{gpuslice.io/gpu-fraction: "0.5"}}}}
  spec: {{nodeName: n1, containers: [{{name: c}}]}}
  status: {{phase: Succeeded}}
- kind: Pod
  metadata: {{name: pending, namespace: t, annotations: {{gpuslice.io/gpu-fraction: "0.25"}}}}
  spec: {{containers: [{{name: c}}]}}
- kind: Service
  metadata: {{name: ignored}}
"""
    path = tmp_path / "cluster.yaml"
    path.write_text(kube_list(NODE + pods))
    trace = load_trace(path)
    assert [n.name for n in trace.nodes] == ["n1"]
    assert [(b.name, b.node, b.allocation is not None) for b in trace.bound] == [("t/bound", "n1", True)]
    assert [p.name for p in trace.pods] == ["t/pending"]


def test_kube_list_errors_name_the_item(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    bad_pod = """- kind: Pod
  metadata: {name: p, namespace: t, annotations: {gpuslice.io/gpu-fraction: "two"}}
  spec: {containers: [{name: c}]}
"""
    path.write_text(kube_list(NODE + bad_pod))
    with pytest.raises(TraceError, match=r"bad.yaml items\[1\] \(Pod p\): gpuslice.io/gpu-fraction"):
        load_trace(path)
    path.write_text(kube_list("- {kind: Node, metadata: {name: x, annotations: {gpuslice.io/inventory: 'nope'}}}\n"))
    with pytest.raises(TraceError, match=r"bad.yaml items\[0\] \(Node x\)"):
        load_trace(path)
    path.write_text(kube_list(""))
    with pytest.raises(TraceError, match="has no Node items"):
        load_trace(path)
