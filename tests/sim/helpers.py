"""Small traces for the simulator tests, written the way users write them."""

from __future__ import annotations

from pathlib import Path

from scheduler.sim.model import Trace
from scheduler.sim.scenario import load_text

TWO_GPUS = """
name: two-gpus
shuffle: false
nodes:
  - {name: a, cpu: 32, memory: 64Gi, gpus: {model: V100-16GB, count: 1, mode: mps}}
  - {name: b, cpu: 32, memory: 64Gi, gpus: {model: V100-16GB, count: 1, mode: mps}}
pods:
  - {name: p0, cpu: 1, memory: 1Gi, gpu: {fraction: 0.2}}
  - {name: p1, cpu: 1, memory: 1Gi, gpu: {fraction: 0.5}}
  - {name: p2, cpu: 1, memory: 1Gi, gpu: {fraction: 0.8}}
  - {name: p3, cpu: 1, memory: 1Gi, gpu: {fraction: 0.5}}
"""


def scenario(text: str, name: str = "test.yaml") -> Trace:
    return load_text(text, Path(name))


OPENB_NODES = """sn,cpu_milli,memory_mib,gpu,model
node-a,32000,131072,2,V100M16
node-b,64000,262144,4,G2
node-c,16000,65536,1,T4
"""

POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"
)
OPENB_PODS = f"""{POD_HEADER}
pod-0,4000,8192,1,500,,LS,Running,0,100,0
pod-1,8000,16384,1,1000,,LS,Running,10,,10
pod-2,2000,4096,0,0,,BE,Running,20,30,20
pod-3,4000,8192,2,1000,,LS,Running,30,200,30
pod-4,1000,2048,1,250,V100M16|T4,LS,Running,40,50,40
pod-5,6000,8192,1,810,,LS,Running,50,60,50
"""


def openb_files(tmp: Path, pods: str = OPENB_PODS, nodes: str = OPENB_NODES) -> Path:
    (tmp / "openb_node_list_gpu_node.csv").write_text(nodes)
    path = tmp / "openb_pod_list_tiny.csv"
    path.write_text(pods)
    return path
