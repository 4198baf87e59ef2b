"""Play kube-scheduler against ``gpuslice serve``, as kube-scheduler really behaves, and measure it.

The driver writes a cluster file (nodes of 8 GPUs in all four sharing modes; with ``--fill``,
pods already bound on them with their allocation records) and starts ``gpuslice serve
--cluster-file FILE`` as a user does (a subprocess on 127.0.0.1). A do-nothing extender on
the same HTTP stack (uvicorn) is measured in the same run as the baseline. Then it runs
kube-scheduler's scheduling loop (:class:`KubeScheduler`, after pkg/scheduler of Kubernetes):

* a queue of pending pods; a pod whose bind failed comes back after a back-off (1 s,
  doubling with each attempt to 10 s); a pod that fits nowhere is retried again and again,
  up to 20 times: every 50 scheduling cycles a cluster event moves it back, to the active
  queue if its back-off since its last attempt has passed, else to the back-off queue (as
  kube-scheduler's priority queue does: a pod is never retried before its back-off ends);
* per pod, its own in-tree filter (CPU, memory, pod count, counting the pods it has
  assumed) over the nodes from a start index that rotates from pod to pod, stopping at
  ``numFeasibleNodesToFind`` feasible nodes: with ``percentageOfNodesToScore`` unset (the
  default, adaptive: 50 - nodes/125 percent, at least 5%, at least 100 nodes) about 500 at
  5,000 nodes; ``--sampling all`` sends every node in every call;
* filter with those NodeNames, prioritize on the survivors, the node of the highest score
  (a uniform draw among ties), the pod assumed there, and the bind sent asynchronously:
  the next pods are filtered before it arrives;
* a mix of many request shapes (``--mix many``: every memory size is a shape of its own),
  with pods that fit nowhere; ``--mix gfd`` (:func:`gfd_node`, :func:`gfd_shapes`) adds nodes
  known by GPU-Feature-Discovery labels or by ``nvidia.com/*`` allocatable alone, MIG under the
  ``mixed`` and ``single`` strategies, pods asking by ``nvidia.com/*`` resources and malformed
  pods.

It prints, per run: filter and prioritize p50/p99 and filter + prioritize p99 (ms, over
HTTP), bound pods per second, scheduling attempts per second, bind failures, the server's and
the driver's CPU per attempt, the server's resident memory, the ratios against the
do-nothing extender's figures of the same run (p99, pods bound a second, server CPU) and, with
``--floor``, the server CPU against the floor's; a cluster per ``--fill`` share (``0 0.85``:
empty and busy). After each run, the first calls: filter with every node and prioritize for 40
pods of request shapes never seen and 20 pods that fit nowhere (their median and slowest). With
``--probe DIR`` gpuslice runs under ``serve_probe.py`` and a line after each row says what the
cyclic collector took, each attempt's server CPU, how long the server's thread waited for a CPU,
and the slowest first calls split into CPU, waiting and collection (``--profile``: cProfile too).

    python benchmarks/extender_driver.py                                  # 1,000 and 5,000 nodes
    python benchmarks/extender_driver.py --nodes 5000 --sampling default all --repeat 3
    python benchmarks/extender_driver.py --nodes 5000 --fill 0.85 --mix many   # a busy cluster
    # every row of the speed table, empty and busy, on the second mix (GFD labels, MIG, malformed pods)
    python benchmarks/extender_driver.py --nodes 5000 --sampling default --floor --fill 0 0.85 --mix gfd
    # the same under cProfile, every collection of the cyclic GC timed beside the calls
    python benchmarks/extender_driver.py --nodes 5000 --sampling default --fill 0 0.85 --probe /tmp/p --profile
"""

from __future__ import annotations

import argparse
import gc
import heapq
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from scheduler.core.allocation import record_annotations
from scheduler.core.catalog import CATALOG, GpuModel
from scheduler.core.errors import InventoryError, RequestError
from scheduler.core.fit import fit
from scheduler.core.inventory import Device, Node, SharingMode
from scheduler.core.k8s import parse_node
from scheduler.core.policies import REGISTRY as POLICIES
from scheduler.core.quantity import bytes_to_mib, cpu_milli
from scheduler.core.request import MILLI, Demand, GpuKind, GpuRequest, parse_pod
from scheduler.core.state import NodeState
from scheduler.extender.client import ExtenderClient
from scheduler.extender.collector import THRESHOLDS as GC_THRESHOLDS
from scheduler.extender.wire import go_safe

PREFIX = "gpuslice.io/"
BODY_CAP = 256 * 1024 * 1024  # full Nodes at 5,000 nodes are several MiB
NODE_CPU, NODE_MEMORY_MIB, NODE_PODS = 128_000, 1024 * 1024, 110

# (share of nodes, inventory of one 8-GPU node)
NODE_KINDS = (
    (0.4, {"model": "H100-80GB", "mode": "exclusive"}),
    (0.3, {"model": "A100-80GB", "mode": "mps"}),
    (0.2, {"model": "L4", "mode": "time-slicing", "replicas": 4}),
    (0.1, {"model": "H100-80GB", "mode": "mig"}),
)
# The project's own mix: (weight, annotations)
PROJECT_MIX: tuple[tuple[float, dict[str, str]], ...] = (
    (0.25, {"gpu-fraction": "0.25"}),
    (0.20, {"gpu-fraction": "0.5"}),
    (0.10, {"gpu-memory": "10Gi", "gpu-compute": "20"}),
    (0.20, {"gpu-count": "1"}),
    (0.05, {"gpu-count": "2"}),
    (0.10, {"mig-profile": "1g.10gb"}),
    (0.05, {"mig-profile": "3g.40gb"}),
    (0.05, {}),  # CPU only
)
# Pods that fit nowhere on the generated cluster: more GPUs than a node has, a profile only the
# A30 offers, more memory than any GPU.
HOPELESS: tuple[dict[str, str], ...] = (
    {"gpu-count": "16"},
    {"mig-profile": "1g.6gb"},
    {"gpu-memory": "200Gi"},
)


def many_shapes(rng: random.Random) -> dict[str, str]:
    """One pod of a real cluster's mix: nearly every memory request is a shape of its own."""
    roll = rng.random()
    if roll < 0.20:
        return {"gpu-fraction": f"{rng.randint(1, 19) * 0.05:.2f}"}
    if roll < 0.45:
        out = {"gpu-memory": str(rng.randint(4, 320) * 256)}
        if rng.random() < 0.4:
            out["gpu-compute"] = str(rng.randint(1, 20) * 5)
        if rng.random() < 0.2:
            out["sharing"] = rng.choice(["mps", "time-slicing"])
        return out
    if roll < 0.70:
        return {"gpu-count": rng.choice(["1", "1", "1", "2", "4", "8"])}
    if roll < 0.82:
        return {"mig-profile": rng.choice(["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"])}
    if roll < 0.95:
        return {}
    return dict(rng.choice(HOPELESS))


def project_shapes(rng: random.Random) -> dict[str, str]:
    return dict(rng.choices([a for _, a in PROJECT_MIX], [w for w, _ in PROJECT_MIX])[0])


# The second mix (``--mix gfd``): nodes known by GPU-Feature-Discovery labels, by their
# ``nvidia.com/*`` allocatable alone or by gpuslice's annotation, MIG under the device plugin's
# ``mixed`` and ``single`` strategies, a few nodes gpuslice cannot read; pods of many shapes,
# asking by annotation or by ``nvidia.com/*`` resources, pods that fit nowhere and malformed pods.
GFD = "nvidia.com/"
A100_MIXED = {"3g.40gb": 8, "2g.20gb": 8, "1g.10gb": 16}  # per GPU 3g + 2g + 2 x 1g: 7 slices, 8 slots
GFD_NODE_KINDS: tuple[tuple[float, str], ...] = (
    (0.20, "annotation"),
    (0.18, "labels-exclusive"),
    (0.12, "labels-time-slicing"),
    (0.08, "labels-mps"),
    (0.10, "allocatable"),
    (0.17, "mig-mixed"),
    (0.12, "mig-single"),
    (0.03, "unreadable"),
)
MALFORMED: tuple[dict[str, str], ...] = (
    {"gpu-count": "two"},
    {"gpu-fraction": "1.5"},
    {"gpu-fraction": "0.5", "gpu-memory": "10Gi"},
    {"mig-profile": "9g.99gb"},
    {"gpu-cuont": "1"},
    {GFD + "mig-1g.10gb": "2"},
)


def gfd_labels(kind: str) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, ``nvidia.com/*`` allocatable) of an 8-GPU node of ``kind`` as GFD and the
    device plugin publish them."""
    if kind == "labels-exclusive":
        return {GFD + "gpu.product": "NVIDIA-A100-SXM4-80GB", GFD + "gpu.count": "8"}, {GFD + "gpu": "8"}
    if kind in ("labels-time-slicing", "labels-mps"):
        strategy = kind.removeprefix("labels-")
        product = "NVIDIA-L4" if strategy == "time-slicing" else "NVIDIA-A100-SXM4-80GB"
        labels = {
            GFD + "gpu.product": product,
            GFD + "gpu.count": "8",
            GFD + "gpu.sharing-strategy": strategy,
            GFD + "gpu.replicas": "4",
        }
        return labels, {GFD + "gpu": "32"}  # the device plugin advertises 8 GPUs x 4 replicas
    if kind == "allocatable":
        return {}, {GFD + "gpu": "8"}
    if kind == "mig-mixed":
        labels = {GFD + "gpu.product": "NVIDIA-A100-SXM4-80GB", GFD + "gpu.count": "8", GFD + "mig.strategy": "mixed"}
        labels.update({f"{GFD}mig-{p}.count": str(n) for p, n in A100_MIXED.items()})
        return labels, {f"{GFD}mig-{p}": str(n) for p, n in A100_MIXED.items()}
    if kind == "mig-single":  # 4 A100-40GB split in 2 x 3g.20gb each: 8 alike MIG devices as nvidia.com/gpu
        labels = {
            GFD + "gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb",
            GFD + "gpu.count": "8",
            GFD + "gpu.memory": "20096",
            GFD + "mig.strategy": "single",
        }
        return labels, {GFD + "gpu": "8"}
    if kind == "unreadable":
        return {GFD + "gpu.product": "NVIDIA-A100-SXM4-80GB", GFD + "gpu.count": "eight"}, {GFD + "gpu": "8"}
    raise ValueError(f"node kind {kind!r}: accepted: {', '.join(k for _, k in GFD_NODE_KINDS)}")


def gfd_node(i: int, rng: random.Random) -> dict[str, Any]:
    kind = rng.choices([k for _, k in GFD_NODE_KINDS], [w for w, _ in GFD_NODE_KINDS])[0]
    if kind == "annotation":
        return make_node(i, node_inventory(i, rng))
    node = make_node(i, None)
    labels, allocatable = gfd_labels(kind)
    node["metadata"]["labels"].update(labels)
    node["status"]["allocatable"] = {k: v for k, v in node["status"]["allocatable"].items() if not k.startswith(GFD)}
    node["status"]["allocatable"].update(allocatable)
    node["status"]["capacity"] = dict(node["status"]["allocatable"])
    return node


def gfd_shapes(rng: random.Random) -> dict[str, str]:
    """A pod of the second mix: many shapes (:func:`many_shapes`, pods that fit nowhere among
    them), MIG and whole GPUs asked by ``nvidia.com/*`` resources, a model named, malformed pods."""
    roll = rng.random()
    if roll < 0.06:
        return dict(rng.choice(MALFORMED))
    if roll < 0.16:
        return {GFD + "mig-" + rng.choice(["1g.10gb", "2g.20gb", "3g.40gb"]): "1"}
    if roll < 0.26:
        return {GFD + "gpu": rng.choice(["1", "1", "2", "4"])}
    if roll < 0.32:
        return rng.choice([{"gpu-model": "L4", "gpu-fraction": "0.5"}, {"gpu-model": "A100-80GB", "gpu-count": "2"}])
    return many_shapes(rng)


MIXES = {"project": project_shapes, "many": many_shapes, "gfd": gfd_shapes}


# ---------------------------------------------------------------- the cluster


def node_inventory(i: int, rng: random.Random) -> dict[str, Any]:
    kind = rng.choices([k for _, k in NODE_KINDS], [w for w, _ in NODE_KINDS])[0]
    return {
        "devices": [
            {
                "index": g,
                "uuid": f"GPU-{i:05d}-{g}",
                **kind,
                **({"nvlinkPeers": [h for h in range(8) if h != g]} if kind["mode"] == "exclusive" else {}),
            }
            for g in range(8)
        ]
    }


def make_node(i: int, inventory: dict[str, Any] | None) -> dict[str, Any]:
    """A Node; with ``inventory``, gpuslice's inventory annotation of it."""
    name = f"node-{i:05d}"
    annotations = {PREFIX + "inventory": json.dumps(inventory, separators=(",", ":"))} if inventory is not None else {}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"node-uid-{i}",
            "resourceVersion": "1",
            "labels": {"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": f"zone-{i % 3}"},
            "annotations": annotations,
        },
        "spec": {"podCIDR": f"10.{i // 256 % 256}.{i % 256}.0/24"},
        "status": {
            "allocatable": {"cpu": "128", "memory": "1Ti", "pods": str(NODE_PODS), "nvidia.com/gpu": "8"},
            "capacity": {"cpu": "128", "memory": "1Ti", "pods": str(NODE_PODS), "nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            "nodeInfo": {"kubeletVersion": "v1.31.0", "osImage": "Ubuntu 22.04", "architecture": "amd64"},
        },
    }


def make_pod(name: str, annotations: dict[str, str], cpu: int, memory_gib: int) -> dict[str, Any]:
    """A pending pod; keys of ``annotations`` under ``nvidia.com/`` are its container's resources."""
    gpus = {k: v for k, v in annotations.items() if k.startswith(GFD)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "bench",
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "labels": {"app": "bench"},
            "annotations": {PREFIX + k: v for k, v in annotations.items() if k not in gpus},
        },
        "spec": {
            "schedulerName": "gpuslice",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/app:1",
                    "resources": {
                        "requests": {"cpu": str(cpu), "memory": f"{memory_gib}Gi", **gpus},
                        **({"limits": gpus} if gpus else {}),
                    },
                }
            ],
        },
        "status": {"phase": "Pending"},
    }


def core_node(name: str, inventory: dict[str, Any]) -> Node:
    devices = []
    for d in inventory["devices"]:
        devices.append(
            Device(d["uuid"], d["index"], CATALOG[d["model"]], SharingMode(d["mode"]), replicas=d.get("replicas", 1))
        )
    return Node(name, NODE_CPU, NODE_MEMORY_MIB, tuple(devices), NODE_PODS)


def demand_of(pod: dict[str, Any]) -> Demand | None:
    """The pod's demand as gpuslice reads it; None for a malformed pod (never bound)."""
    try:
        return parse_pod(pod).demand
    except RequestError:
        return None


def fill_node(state: NodeState, target: float, rng: random.Random, mix: Any, serial: list[int]) -> list[dict[str, Any]]:
    """Pods bound on ``state``'s node by gpuslice (records and bind-phase as a bind writes
    them) until ``target`` of its GPU is allocated or nothing more fits."""
    out: list[dict[str, Any]] = []
    misses = 0
    while 1000 * len(state.node.devices) - state.free_milli() < target * 1000 * len(state.node.devices) and misses < 8:
        name = f"fill-{serial[0]:07d}"
        pod = make_pod(name, mix(rng), rng.randint(1, 4), rng.randint(1, 16))
        demand = demand_of(pod)
        found = fit(demand, state) if demand is not None else None
        if not found:
            misses += 1
            continue
        serial[0] += 1
        alloc = found.allocations[0]
        state = state.apply(f"bench/{name}", alloc)
        pod["metadata"]["annotations"].update(record_annotations(alloc, PREFIX, "bound", "2025-01-01T00:00:00Z"))
        pod["spec"]["nodeName"] = state.node.name
        pod["status"] = {"phase": "Running"}
        out.append(pod)
    return out


@dataclass
class Cluster:
    nodes: list[dict[str, Any]]
    running: list[dict[str, Any]]  # pods already bound (``--fill``)
    pending: list[dict[str, Any]]  # what the scheduler will schedule, in arrival order


def bound_pod(state: NodeState, name: str, rng: random.Random, mix: Any) -> tuple[NodeState, dict[str, Any] | None]:
    """A pod of ``mix`` bound on ``state``'s node as a gpuslice bind leaves it, if it fits."""
    pod = make_pod(name, mix(rng), rng.randint(1, 4), rng.randint(1, 16))
    demand = demand_of(pod)
    found = fit(demand, state) if demand is not None else None
    if not found:
        return state, None
    alloc = found.allocations[0]
    state = state.apply(f"bench/{name}", alloc)
    pod["metadata"]["annotations"].update(record_annotations(alloc, PREFIX, "bound", "2025-01-01T00:00:00Z"))
    pod["spec"]["nodeName"] = state.node.name
    pod["status"] = {"phase": "Running"}
    return state, pod


def write_cluster(
    path: Path, nodes: int, pods: int, seed: int, mix: str = "project", fill: float = 0.0, running_pods: int = 0
) -> Cluster:
    """Nodes; with ``fill``, pods bound on each until that share of its GPU is allocated; with
    ``running_pods``, that many bound pods spread over the nodes one at a time; then ``pods``
    pending ones. Mix ``gfd`` makes its own nodes (:func:`gfd_node`), the others 8-GPU nodes
    described by gpuslice's annotation (:func:`node_inventory`)."""
    rng = random.Random(seed)
    shapes = MIXES[mix]
    node_list: list[dict[str, Any]] = []
    cores: list[Node | None] = []  # as gpuslice reads each node (None: it cannot)
    for i in range(nodes):
        if mix == "gfd":
            node_list.append(gfd_node(i, rng))
            try:
                cores.append(parse_node(node_list[-1]))
            except InventoryError:
                cores.append(None)
        else:
            inventory = node_inventory(i, rng)
            node_list.append(make_node(i, inventory))
            cores.append(core_node(node_list[-1]["metadata"]["name"], inventory))
    running: list[dict[str, Any]] = []
    if fill > 0:
        serial = [0]
        for core in cores:
            if core is not None:
                running.extend(fill_node(NodeState.empty(core), fill, rng, shapes, serial))
    if running_pods:
        states = [NodeState.empty(core) for core in cores if core is not None]
        placed_in_round = 1
        while len(running) < running_pods and placed_in_round:
            placed_in_round = 0
            for i in range(len(states)):
                if len(running) >= running_pods:
                    break
                states[i], pod = bound_pod(states[i], f"run-{len(running):07d}", rng, shapes)
                if pod is not None:
                    running.append(pod)
                    placed_in_round += 1
    pending = [make_pod(f"pod-{i:06d}", shapes(rng), rng.choice([1, 2, 4]), 8) for i in range(pods)]
    path.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "List", "items": node_list + running + pending}))
    return Cluster(node_list, running, pending)


# ---------------------------------------------------------------- the servers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def gpuslice_command() -> list[str]:
    script = Path(sys.executable).with_name("gpuslice")
    if script.exists():
        return [str(script)]
    found = shutil.which("gpuslice")
    return [found] if found else [sys.executable, "-c", "from scheduler.cli import main; main()"]


@contextmanager
def running(
    command: list[str], port: int, log: Path, cpus: set[int] | None = None
) -> Iterator[tuple[ExtenderClient, int]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        if cpus:
            os.sched_setaffinity(proc.pid, cpus)
        client = ExtenderClient(f"http://127.0.0.1:{port}", timeout=120)
        try:
            deadline = time.monotonic() + 600
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"{command[0]} exited with {proc.returncode}; see {log}")
                try:
                    if client.request("GET", "/readyz")[0] == 200:
                        break
                except Exception:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"not ready after 600 s; see {log}")
                time.sleep(0.1)
            yield client, proc.pid
        finally:
            client.close()
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def extender_app(filter_: Any, prioritize: Any, bind: Any) -> Any:
    """A Starlette app of the extender's three verbs (POST) and ``/readyz``: the HTTP stack of
    the do-nothing extender and of the floor."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def readyz(request: Request) -> Response:
        return Response(b"ready")

    verbs = {"/filter": filter_, "/prioritize": prioritize, "/bind": bind}
    return Starlette(routes=[*(Route(p, v, methods=["POST"]) for p, v in verbs.items()), Route("/readyz", readyz)])


def noop_app(bind_through: Any = None) -> Any:
    """The do-nothing extender: the same uvicorn and JSON work, no decision (``bind_through``:
    an async function of the bind's arguments that makes the bind, returning its error or "")."""
    from starlette.requests import Request
    from starlette.responses import Response

    async def filter_(request: Request) -> Response:
        args = orjson.loads(await request.body())
        nodes, names = args.get("Nodes"), args.get("NodeNames")
        body = {
            "Nodes": nodes,
            "NodeNames": names,
            "FailedNodes": None,
            "FailedAndUnresolvableNodes": None,
            "Error": "",
        }
        return Response(orjson.dumps(body), media_type="application/json")

    async def prioritize(request: Request) -> Response:
        args = orjson.loads(await request.body())
        names = args.get("NodeNames") or [n["metadata"]["name"] for n in (args.get("Nodes") or {}).get("items", [])]
        return Response(orjson.dumps([{"Host": n, "Score": 0} for n in names]), media_type="application/json")

    async def bind(request: Request) -> Response:
        body = await request.body()
        error = "" if bind_through is None else await bind_through(orjson.loads(body))
        return Response(orjson.dumps({"Error": error}), media_type="application/json")

    return extender_app(filter_, prioritize, bind)


def floor_app(cluster_file: Path) -> Any:
    """The floor: the least GPU accounting an extender can do, on the same HTTP stack. Per GPU
    its free compute and memory (two arrays), per node one code of its model and mode; filter:
    one array test of the listed nodes (the pod's model or MIG profile, its GPU count, its
    compute and memory per GPU) and one reason for every node that fails; prioritize: free
    compute left (best fit), only the ten best hosts returned (kube-scheduler scores a host left
    out as 0); bind: the GPUs with least compute free. No MIG slots, sharing modes, CPU, holds,
    fragmentation or reasons of their own: its decisions are not gpuslice's, only its cost is
    close to the least one: what an extender that does GPU accounting in Python on this stack
    can hope for at best (``--floor``).

    It reads what gpuslice reads, with gpuslice's own readers, so that it serves every mix the
    driver makes: nodes by their inventory annotation, GFD labels or ``nvidia.com/*``
    allocatable (:func:`parse_node`, once, at start; a node gpuslice cannot read has no GPU
    here), pods by :func:`parse_pod`, once per pod (uid and resourceVersion, as gpuslice
    caches them). A malformed pod is answered as gpuslice answers it: filter with every listed
    node unresolvable, each with the one message (kube-scheduler then leaves the pod
    Unschedulable rather than retrying an error), prioritize with every node at 0."""
    from starlette.requests import Request
    from starlette.responses import Response

    items = orjson.loads(cluster_file.read_bytes())["items"]
    nodes = [o for o in items if o.get("kind") == "Node"]
    cores: list[Node | None] = []
    for obj in nodes:
        try:
            cores.append(parse_node(obj))
        except InventoryError:
            cores.append(None)
    width = max([len(c.devices) for c in cores if c is not None] + [1])
    # one row per node, and one more for a name the cluster does not have (no GPU, fails all)
    rows = len(nodes) + 1
    index = _Index({n["metadata"]["name"]: i for i, n in enumerate(nodes)}, missing=len(nodes))
    # a kind: the model, the sharing mode and, for MIG, the profiles its GPUs offer (static MIG:
    # the instances there; dynamic: every profile of the model)
    kinds: dict[tuple[str, SharingMode, frozenset[str]], int] = {}
    offered: dict[int, frozenset[str]] = {}
    kind = np.full(rows, -1, dtype=np.int64)  # -1: no GPU (takes only pods without one)
    total = np.ones(rows, dtype=np.int64)  # memory of one of the node's GPUs (MiB)
    compute = np.zeros((rows, width), dtype=np.int64)
    memory = np.full((rows, width), -1, dtype=np.int64)  # -1: no such GPU (fails every request)
    capacity = np.ones(rows, dtype=np.int64)
    models: dict[int, GpuModel] = {}
    for i, core in enumerate(cores):
        if core is None or not core.devices:
            continue
        first = core.devices[0]
        profiles = frozenset(p.name for p in first.allowed_profiles()) if first.mode is SharingMode.MIG else frozenset()
        code = kinds.setdefault((first.model.name, first.mode, profiles), len(kinds))
        models[code], offered[code] = first.model, profiles
        kind[i], total[i] = code, first.model.memory_mib
        count = len(core.devices)
        compute[i, :count], memory[i, :count], capacity[i] = MILLI, total[i], count * MILLI

    def allowed(gpu: GpuRequest) -> np.ndarray:
        """Per kind code (and -1, last), whether the request may go there."""
        out = np.zeros(len(kinds) + 1, dtype=bool)
        if gpu.kind is GpuKind.NONE:
            out[:] = True
            return out
        for (name, mode, _), code in kinds.items():
            layout = models[code].mig
            if gpu.kind is GpuKind.MIG:
                wanted = layout.match(gpu.profile) if layout is not None and gpu.profile is not None else None
                ok = mode is SharingMode.MIG and wanted is not None and wanted.name in offered[code]
            else:
                ok = mode is not SharingMode.MIG and gpu.allows_mode(mode)
            out[code] = ok and gpu.allows_model(name)
        return out

    Req = tuple[int, int, int, np.ndarray]  # (GPUs, milli per GPU, MiB per GPU or -milli of it, kinds allowed)
    parsed: dict[tuple[str, str], Req | str] = {}

    def request(pod: Any) -> Req | str:
        """The pod's request, or why it is malformed (gpuslice's reader; once per pod version)."""
        meta = pod.get("metadata") if isinstance(pod, dict) else None
        key = (str(meta.get("uid")), str(meta.get("resourceVersion"))) if isinstance(meta, dict) else ("", "")
        hit = parsed.get(key)
        if hit is not None:
            return hit
        try:
            gpu = parse_pod(pod).demand.gpu
        except RequestError as exc:
            got: Req | str = f"gpuslice cannot schedule this pod: {exc}"
        else:
            if gpu.kind is GpuKind.MIG:
                assert gpu.profile is not None
                got = (1, gpu.profile.compute_slices * MILLI // 7, gpu.profile.memory_gb * 1024, allowed(gpu))
            elif gpu.kind is GpuKind.WHOLE:
                got = (gpu.count, MILLI, -MILLI, allowed(gpu))
            elif gpu.kind is GpuKind.SHARE and gpu.fraction_milli:
                got = (gpu.count, gpu.fraction_milli, -gpu.fraction_milli, allowed(gpu))
            elif gpu.kind is GpuKind.SHARE:
                got = (gpu.count, gpu.compute_milli, gpu.memory_mib, allowed(gpu))
            else:
                got = (0, 0, 0, allowed(gpu))
        if key[0] != "None":
            parsed[key] = got
        return got

    def fits(at: np.ndarray, req: Req) -> tuple[np.ndarray, np.ndarray]:
        count, milli, mib, kinds_ok = req
        need = (total[at] * -mib // MILLI)[:, None] if mib < 0 else mib
        gpus = (compute[at] >= milli) & (memory[at] >= need)
        return (gpus.sum(axis=1) >= count) & kinds_ok[kind[at]], gpus

    def take(i: int, req: Req) -> bool:
        ok, gpus = fits(np.array([i]), req)
        if not ok[0]:
            return False
        chosen = np.flatnonzero(gpus[0])
        chosen = chosen[np.argsort(compute[i, chosen], kind="stable")][: req[0]]
        compute[i, chosen] -= req[1]
        memory[i, chosen] -= total[i] * -req[2] // MILLI if req[2] < 0 else req[2]
        return True

    for pod in items:  # the pods the cluster file has bound (--fill)
        if pod.get("kind") == "Pod" and pod["spec"].get("nodeName"):
            req = request(pod)
            if not isinstance(req, str):
                take(index[pod["spec"]["nodeName"]], req)
    pending: dict[str, Req] = {}

    def listed(args: dict[str, Any]) -> tuple[list[str], np.ndarray]:
        names = args.get("NodeNames") or []
        return names, np.fromiter(map(index.__getitem__, names), np.int64, len(names))

    async def filter_(request_: Request) -> Response:
        args = orjson.loads(await request_.body())
        req = request(args.get("Pod"))
        if isinstance(req, str):
            names = args.get("NodeNames") or []
            body: dict[str, Any] = {
                "Nodes": None,
                "NodeNames": [],
                "FailedNodes": None,
                "FailedAndUnresolvableNodes": dict.fromkeys(names, go_safe(req)) or None,
                "Error": "",
            }
            return Response(orjson.dumps(body), media_type="application/json")
        names, at = listed(args)
        pending[args["Pod"]["metadata"]["name"]] = req
        ok = fits(at, req)[0].tolist()
        body = {
            "Nodes": None,
            "NodeNames": [n for n, f in zip(names, ok, strict=True) if f],
            "FailedNodes": {n: "not enough free GPU" for n, f in zip(names, ok, strict=True) if not f},
            "FailedAndUnresolvableNodes": None,
            "Error": "",
        }
        return Response(orjson.dumps(body), media_type="application/json")

    async def prioritize(request_: Request) -> Response:
        args = orjson.loads(await request_.body())
        names, at = listed(args)
        req = request(args.get("Pod"))
        if isinstance(req, str):
            return Response(orjson.dumps([{"Host": n, "Score": 0} for n in names]), media_type="application/json")
        ok = fits(at, req)[0]
        score = np.where(ok, 100 - compute[at].sum(axis=1) * 100 // capacity[at], 0)
        best = np.argsort(-score, kind="stable")[:10].tolist()
        answer = [{"Host": names[i], "Score": int(score[i])} for i in best]
        return Response(orjson.dumps(answer), media_type="application/json")

    async def bind(request_: Request) -> Response:
        args = orjson.loads(await request_.body())
        req = pending.pop(args.get("PodName"), None)
        done = req is None or take(index[args.get("Node")], req)
        return Response(b'{"Error":""}' if done else b'{"Error":"no GPU free"}', media_type="application/json")

    return extender_app(filter_, prioritize, bind)


class _Index(dict[str, int]):
    """Node name -> row; a name the cluster does not have -> ``missing`` (a row with no GPU)."""

    def __init__(self, rows: dict[str, int], missing: int) -> None:
        super().__init__(rows)
        self.missing = missing

    def __missing__(self, key: str) -> int:
        return self.missing


# ---------------------------------------------------------------- reading answers cheaply


class ServerClosed(RuntimeError):
    """The server closed the connection."""


class Connection:
    """One keep-alive HTTP/1.1 connection on a raw socket: kube-scheduler's Go client costs
    next to nothing, so the load generator must not either (http.client parses every
    response's headers with the email package)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._connect()

    def _connect(self) -> None:
        self.sock = socket.create_connection(("127.0.0.1", self.port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""

    def post(self, path: bytes, body: bytes) -> bytes:
        try:
            return self._post(path, body)
        except (ConnectionError, ServerClosed):
            # The server closed a keep-alive connection left idle: a new one, and the request again
            # (as Go's client does for a request whose connection was closed before any answer).
            self.sock.close()
            self._connect()
            return self._post(path, body)

    def _post(self, path: bytes, body: bytes) -> bytes:
        head = b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        self.sock.sendall(head % (path, len(body)) + body)
        while (end := self.buffer.find(b"\r\n\r\n")) < 0:
            self._read()
        lines = self.buffer[:end].split(b"\r\n")
        if not lines[0].startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"POST {path.decode()}: {lines[0].decode()}")
        length = next(
            int(v) for k, _, v in (line.partition(b":") for line in lines[1:]) if k.lower() == b"content-length"
        )
        start = end + 4
        while len(self.buffer) < start + length:
            self._read()
        data, self.buffer = self.buffer[start : start + length], self.buffer[start + length :]
        return data

    def _read(self) -> None:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ServerClosed("the server closed the connection")
        self.buffer += chunk

    def close(self) -> None:
        self.sock.close()


NAMES_KEY = b'"NodeNames":'


def split_filter_answer(data: bytes) -> tuple[dict[str, Any], bytes]:
    """Filter's answer decoded, except its NodeNames array, given back as its raw bytes.

    kube-scheduler (Go) decodes the survivors and encodes them again for prioritize at next to
    no cost; in Python, decoding thousands of names per pod would make the driver the
    bottleneck it measures. Node names hold no ``]`` (DNS subdomains), so the array ends at the
    first one; the rest is decoded in full, which proves the cut fell between two members
    (else the answer is decoded whole)."""
    at = data.find(NAMES_KEY)
    if at >= 0:
        begin = at + len(NAMES_KEY)
        end = data.find(b"]", begin) + 1
        if data[begin : begin + 1] == b"[" and end:
            try:
                return orjson.loads(data[:begin] + b"null" + data[end:]), data[begin:end]
            except orjson.JSONDecodeError:
                pass
    result = orjson.loads(data)
    return result, orjson.dumps(result.get("NodeNames"))


def top_host(data: bytes) -> str | None:
    """The first host with the highest score in prioritize's answer (``max`` over the decoded
    list gives the same), None for an empty list.

    Decoding thousands of ``{"Host", "Score"}`` objects per pod would make the driver the
    bottleneck it measures. Host names hold no ``}``, so where every entry ends with its score
    (``"Score":N}``, or ``"Score": N}`` as gpuslice pads them) the scores are read at the
    closing braces; any other shape is decoded in full."""
    buf = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(buf == ord("}"))
    if len(ends) and ends[0] >= 3:
        ones = buf[ends - 1].astype(np.int64) - ord("0")
        before = buf[ends - 2]
        tens = before == ord("1")
        if (
            ((ones >= 0) & (ones <= 9)).all()
            and (tens | (before == ord(":")) | (before == ord(" "))).all()
            and (buf[ends[tens] - 3] == ord(":")).all()
        ):
            end = int(ends[np.argmax(ones + 10 * tens)])
            key = data.rfind(b'"Host":', 0, end)
            if key >= 0:
                start = data.index(b'"', key + len(b'"Host":')) + 1
                return data[start : data.index(b'"', start)].decode()
    scores = orjson.loads(data)
    return str(max(scores, key=itemgetter("Score"))["Host"]) if scores else None


def top_hosts(data: bytes) -> list[str]:
    """Every host with the highest score (kube-scheduler draws among them)."""
    first = top_host(data)
    if first is None:
        return []
    scores = orjson.loads(data) if data.count(b'"Score"') < 64 else None
    if scores is None:
        return [first]  # many hosts: gpuslice gives one node the top score; read no further
    best = max(s["Score"] for s in scores)
    return [s["Host"] for s in scores if s["Score"] == best]


# ---------------------------------------------------------------- kube-scheduler's loop


def nodes_to_find(total: int, percentage: int) -> int:
    """numFeasibleNodesToFind of kube-scheduler: how many feasible nodes a cycle looks for."""
    if total < 100 or percentage >= 100:
        return total
    adaptive = percentage if percentage > 0 else max(5, 50 - total // 125)
    return max(100, total * adaptive // 100)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and its threads so far (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def schedstat(pid: int | None) -> tuple[float, float]:
    """(ms on a CPU, ms runnable but waiting for one) of process ``pid``'s main thread so far
    (Linux /proc schedstat, nanoseconds): the wait is what the rest of the machine took from it."""
    if pid is None:
        return float("nan"), float("nan")
    try:
        run, wait = Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[:2]
    except (OSError, ValueError):
        return float("nan"), float("nan")
    return int(run) / 1e6, int(wait) / 1e6


def resident_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


@dataclass
class Result:
    filter_ms: list[float] = field(default_factory=list)
    prioritize_ms: list[float] = field(default_factory=list)
    attempts: int = 0  # scheduling cycles measured
    bound: int = 0  # pods bound in the measured window
    unschedulable: int = 0  # cycles whose pod fit nowhere
    bind_errors: int = 0  # binds that failed (the pod went back to the queue)
    binds: int = 0  # binds sent
    elapsed_s: float = 0.0
    server_cpu_ms: float = float("nan")  # per measured attempt
    driver_cpu_ms: float = float("nan")
    server_rss_mib: float = float("nan")
    cold_ms: list[float] = field(default_factory=list)  # filter + prioritize of shapes never seen, every node
    hopeless_ms: list[float] = field(default_factory=list)  # the same for pods that fit nowhere
    hopeless_passed: int = 0  # of those, how many some node passed (0 unless the extender errs)
    spans: list[tuple[float, float]] = field(default_factory=list)  # each measured attempt: perf_counter at start, end
    run_ms: list[float] = field(default_factory=list)  # with --probe, each: the server's main thread on a CPU meanwhile
    cold_spans: list[tuple[float, float]] = field(default_factory=list)  # the first calls' (cold, then hopeless)
    cold_labels: list[str] = field(default_factory=list)  # each first call: what it asked
    cold_run_ms: list[float] = field(default_factory=list)  # each first call: the server's main thread on a CPU
    cold_wait_ms: list[float] = field(default_factory=list)  # ... and runnable, waiting for a CPU
    cold_driver_wait_ms: list[float] = field(default_factory=list)  # ... and this driver, waiting for a CPU
    server_wait_ms: float = float("nan")  # per measured attempt: the server's main thread waiting for a CPU

    @property
    def bound_per_s(self) -> float:
        return self.bound / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def attempts_per_s(self) -> float:
        return self.attempts / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def bind_failure_pct(self) -> float:
        return 100.0 * self.bind_errors / self.binds if self.binds else 0.0


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def both_p99(got: Result) -> float:
    """p99 of filter + prioritize per attempt (an attempt that stops at filter counts filter alone)."""
    return pct([f + p for f, p in zip(got.filter_ms, got.prioritize_ms, strict=True)], 99)


class KubeScheduler:
    """kube-scheduler's scheduling loop, reduced to what shapes the extender's load.

    ``percentage`` is ``percentageOfNodesToScore`` (0: the adaptive default; 100: every
    node). In-tree filtering counts CPU, memory and pods of the pods it has assumed or seen
    bound. Binds run on ``binders`` threads while the loop goes on; a failed bind forgets the
    pod's assumption and requeues it after a back-off.
    """

    BACKOFF_S = (1.0, 10.0)

    def __init__(
        self,
        port: int,
        nodes: Sequence[dict[str, Any]],
        running: Sequence[dict[str, Any]],
        *,
        percentage: int = 0,
        mode: str = "names",
        binders: int = 8,
        retry_every: int = 50,
        seed: int = 1,
    ) -> None:
        self.port = port
        self.mode = mode
        self.percentage = percentage
        self.names = [n["metadata"]["name"] for n in nodes]
        self.index = {n: i for i, n in enumerate(self.names)}
        self.encoded = [orjson.dumps(n) for n in self.names]
        self.all_names = orjson.dumps(self.names)
        self.nodes_json = [orjson.dumps(n) for n in nodes]
        self.cpu = np.full(len(nodes), NODE_CPU, dtype=np.int64)
        self.memory = np.full(len(nodes), NODE_MEMORY_MIB, dtype=np.int64)
        self.pods = np.full(len(nodes), NODE_PODS, dtype=np.int64)
        for pod in running:  # the bound pods kube-scheduler's cache starts with
            self._take(self.index[pod["spec"]["nodeName"]], self._requests(pod), 1)
        self.start = 0
        self.binders = binders
        self.errors: list[str] = []  # what failed binds answered
        self.retry_every = retry_every
        self.rng = random.Random(seed)

    @staticmethod
    def _requests(pod: dict[str, Any]) -> tuple[int, int]:
        """CPU (milli) and memory (MiB) the pod asks; a pod gpuslice finds malformed asks what its
        container's requests say (kube-scheduler reads those alone)."""
        demand = demand_of(pod)
        if demand is not None:
            return demand.cpu_milli, demand.memory_mib
        asked = pod["spec"]["containers"][0]["resources"]["requests"]
        return cpu_milli(asked["cpu"]), bytes_to_mib(asked["memory"])

    def _take(self, i: int, requests: tuple[int, int], sign: int) -> None:
        self.cpu[i] -= sign * requests[0]
        self.memory[i] -= sign * requests[1]
        self.pods[i] -= sign

    def feasible(self, requests: tuple[int, int]) -> np.ndarray:
        """The nodes this cycle sends the extender: the first feasible ones from the rotating start."""
        total = len(self.names)
        wanted = nodes_to_find(total, self.percentage)
        order = np.roll(np.arange(total), -self.start)
        fits = (self.cpu[order] >= requests[0]) & (self.memory[order] >= requests[1]) & (self.pods[order] > 0)
        hits = np.flatnonzero(fits)
        processed = int(hits[wanted - 1]) + 1 if len(hits) >= wanted else total
        self.start = (self.start + processed) % total
        return order[hits[:wanted]]

    def listed(self, chosen: np.ndarray) -> bytes:
        if self.mode == "nodes":
            return b'{"metadata":{},"items":[' + b",".join(self.nodes_json[i] for i in chosen.tolist()) + b"]}"
        if len(chosen) == len(self.names) and (chosen == np.arange(len(chosen))).all():
            return self.all_names
        return b"[" + b",".join(self.encoded[i] for i in chosen.tolist()) + b"]"

    def body(self, pod: bytes, listed: bytes) -> bytes:
        if self.mode == "names":
            return b'{"Pod":' + pod + b',"Nodes":null,"NodeNames":' + listed + b"}"
        return b'{"Pod":' + pod + b',"Nodes":' + listed + b',"NodeNames":null}'

    def first_calls(self, result: Result, count: int = 40, seed: int = 7, server: int | None = None) -> None:
        """Filter with every node, then prioritize on the survivors, for ``count`` pods of request
        shapes never seen (memory sizes off the mix's 256 MiB grid, compute shares of 1 percent
        steps) and ``count // 2`` pods that fit nowhere (more GPUs than a node has, more memory than a GPU, a model
        the cluster lacks; each of a shape of its own), into
        ``result.cold_ms`` and ``result.hopeless_ms``: the slowest calls an extender can get."""
        rng = random.Random(seed)
        conn = Connection(self.port)
        listed = self.all_names if self.mode == "names" else self.listed(np.arange(len(self.names)))
        cold = [
            {"gpu-memory": str(rng.randint(1_000, 80_000) | 1), "gpu-compute": str(rng.randint(1, 99))}
            if k % 2
            else {"gpu-fraction": f"{rng.randint(1, 999) / 1000:.3f}"}
            for k in range(count)
        ]
        hopeless = [
            {"gpu-count": str(9 + k)}
            if k % 3 == 0
            else {"gpu-memory": f"{150 + k}Gi"}
            if k % 3 == 1
            else {"gpu-model": "A30", "gpu-memory": str(1_000 + k)}
            for k in range(count // 2)
        ]
        for into, kind, shapes in ((result.cold_ms, "cold", cold), (result.hopeless_ms, "hopeless", hopeless)):
            for k, wanted in enumerate(shapes):
                pod = orjson.dumps(make_pod(f"first-{kind}-{k}", wanted, 1, 8))
                run0, wait0 = schedstat(server)
                mine0 = schedstat(os.getpid())[1]
                t0 = time.perf_counter()
                data = conn.post(b"/filter", self.body(pod, listed))
                if self.mode == "names":
                    answer, survivors = split_filter_answer(data)
                    empty = survivors in (b"[]", b"null") or bool(answer.get("Error"))
                else:
                    answer = orjson.loads(data)
                    items = (answer["Nodes"] or {}).get("items", [])
                    survivors = b'{"metadata":{},"items":[' + b",".join(orjson.dumps(n) for n in items) + b"]}"
                    empty = not items or bool(answer.get("Error"))
                if not empty:
                    conn.post(b"/prioritize", self.body(pod, survivors))
                    result.hopeless_passed += kind == "hopeless"
                t1 = time.perf_counter()
                run1, wait1 = schedstat(server)
                result.cold_driver_wait_ms.append(schedstat(os.getpid())[1] - mine0)
                into.append((t1 - t0) * 1000)
                result.cold_spans.append((t0, t1))
                result.cold_labels.append(kind + " " + ",".join(f"{k}={v}" for k, v in wanted.items()))
                result.cold_run_ms.append(run1 - run0)
                result.cold_wait_ms.append(wait1 - wait0)
        conn.close()

    def run(
        self,
        pods: Sequence[dict[str, Any]],
        warmup: int,
        server: int | None = None,
        every: tuple[int, Any] | None = None,
        max_cycles: int = 0,
        measuring_starts: Any = None,
        per_call_cpu: bool = False,
    ) -> Result:
        """Schedule ``pods`` (in order; failed ones again) until every pod is bound or has been
        retried, or ``max_cycles`` scheduling cycles have run (0: no limit), measuring after
        ``warmup`` attempts. ``server``: its pid, for its CPU; ``every``: (n, call) to call
        ``call(cycles)`` every n cycles."""
        encoded = [orjson.dumps(p) for p in pods]
        requests = [self._requests(p) for p in pods]
        binds = [
            orjson.dumps({"PodName": p["metadata"]["name"], "PodNamespace": "bench", "PodUID": p["metadata"]["uid"]})[
                :-1
            ]
            for p in pods
        ]
        active: deque[int] = deque(range(len(pods)))
        backoff: list[tuple[float, int, int]] = []  # (ready at, attempt, pod)
        unschedulable: list[int] = []
        tries = [0] * len(pods)
        last_try = [0.0] * len(pods)  # when each pod's last attempt failed (its back-off runs from there)
        resting: set[int] = set()  # the pods in ``backoff`` that fit nowhere when last tried
        inflight: dict[Future[str], tuple[int, int]] = {}  # bind -> (pod, node)
        result = Result()
        conn = Connection(self.port)
        local = threading.local()
        opened: list[Connection] = []

        def bind(i: int, node: str) -> str:
            c = getattr(local, "conn", None)
            if c is None:
                c = local.conn = Connection(self.port)
                opened.append(c)
            return str(orjson.loads(c.post(b"/bind", binds[i] + b',"Node":' + orjson.dumps(node) + b"}"))["Error"])

        gc.collect()
        gc.freeze()
        thresholds = gc.get_threshold()
        gc.set_threshold(*GC_THRESHOLDS)
        cycles = 0
        measuring = False
        started = server0 = driver0 = idle = wait0 = 0.0
        with ThreadPoolExecutor(self.binders) as pool:
            while active or backoff or inflight or unschedulable:
                for done in [f for f in inflight if f.done()]:
                    pod, node = inflight.pop(done)
                    error = done.result()
                    if error:
                        self.errors.append(error)
                        self._take(node, requests[pod], -1)  # forget the assumption
                        tries[pod] += 1
                        lo, hi = self.BACKOFF_S
                        heapq.heappush(
                            backoff, (time.monotonic() + min(hi, lo * 2 ** (tries[pod] - 1)), tries[pod], pod)
                        )
                        result.bind_errors += measuring
                    else:
                        result.bound += measuring
                now = time.monotonic()
                while backoff and backoff[0][0] <= now:
                    pod = heapq.heappop(backoff)[2]
                    resting.discard(pod)
                    active.append(pod)
                if cycles and cycles % self.retry_every == 0 and unschedulable:
                    # a cluster event moves them back: to the active queue once their back-off
                    # (from their last attempt) has passed, else to the back-off queue
                    lo, hi = self.BACKOFF_S
                    for pod in unschedulable:
                        ready = last_try[pod] + min(hi, lo * 2 ** (tries[pod] - 1))
                        if ready <= now:
                            active.append(pod)
                        else:
                            heapq.heappush(backoff, (ready, tries[pod], pod))
                            resting.add(pod)
                    unschedulable.clear()
                if not active:
                    if not inflight and len(backoff) == len(resting):
                        break  # only pods that fit nowhere are left, waiting out their back-off
                    waited = time.perf_counter()
                    time.sleep(0.001)
                    idle += time.perf_counter() - waited  # nothing to schedule: not the extender's time
                    continue
                if max_cycles and cycles >= max_cycles:
                    break
                if cycles == warmup:
                    measuring = True
                    started = time.perf_counter()
                    server0 = cpu_seconds(server) if server else float("nan")
                    wait0 = schedstat(server)[1]
                    if measuring_starts is not None:
                        measuring_starts()
                    driver0 = time.process_time()
                pod = active.popleft()
                cycles += 1
                if every is not None and cycles % every[0] == 0:
                    every[1](cycles)
                chosen = self.feasible(requests[pod])
                listed = self.listed(chosen)
                cpu0 = schedstat(server)[0] if per_call_cpu and measuring else 0.0
                t0 = time.perf_counter()
                data = conn.post(b"/filter", self.body(encoded[pod], listed))
                t1 = time.perf_counter()
                if self.mode == "names":
                    answer, survivors = split_filter_answer(data)
                    empty = survivors in (b"[]", b"null")
                else:
                    answer = orjson.loads(data)
                    items = (answer["Nodes"] or {}).get("items", [])
                    survivors = b'{"metadata":{},"items":[' + b",".join(orjson.dumps(n) for n in items) + b"]}"
                    empty = not items
                if answer.get("Error"):
                    empty = True
                if measuring:
                    result.attempts += 1
                    result.filter_ms.append((t1 - t0) * 1000)
                if empty:
                    if measuring:
                        result.prioritize_ms.append(0.0)
                        result.spans.append((t0, t1))
                        if per_call_cpu:
                            result.run_ms.append(schedstat(server)[0] - cpu0)
                        result.unschedulable += 1
                    tries[pod] += 1
                    last_try[pod] = time.monotonic()
                    if tries[pod] <= 20:
                        unschedulable.append(pod)
                    continue
                t2 = time.perf_counter()
                data = conn.post(b"/prioritize", self.body(encoded[pod], survivors))
                t3 = time.perf_counter()
                if measuring:
                    result.prioritize_ms.append((t3 - t2) * 1000)
                    result.spans.append((t0, t3))
                    if per_call_cpu:
                        result.run_ms.append(schedstat(server)[0] - cpu0)
                hosts = top_hosts(data)
                if not hosts:
                    raise RuntimeError(f"prioritize answered no host: {data[:300]!r}")
                host = hosts[self.rng.randrange(len(hosts))] if len(hosts) > 1 else hosts[0]
                node = self.index[host]
                self._take(node, requests[pod], 1)  # assume
                result.binds += measuring
                inflight[pool.submit(bind, pod, host)] = (pod, node)
            result.elapsed_s = time.perf_counter() - started - idle if measuring else 0.0
        if measuring and result.attempts:
            if server:
                result.server_cpu_ms = (cpu_seconds(server) - server0) * 1000 / result.attempts
                result.server_rss_mib = resident_mib(server)
                result.server_wait_ms = (schedstat(server)[1] - wait0) / result.attempts
            result.driver_cpu_ms = (time.process_time() - driver0) * 1000 / result.attempts
        for c in [conn, *opened]:
            c.close()
        gc.set_threshold(*thresholds)
        gc.unfreeze()
        return result


def pin(server_cpus: int) -> set[int] | None:
    """Split this machine's CPUs: the first ``server_cpus`` for the server, the rest for this
    driver (set here at once); None when ``server_cpus`` is 0. kube-scheduler and the
    extender run in separate containers, so they do not take each other's cores."""
    if not server_cpus:
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if server_cpus >= len(cpus):
        raise SystemExit(f"--server-cpus {server_cpus}: this machine has {len(cpus)} CPUs; leave the driver one")
    os.sched_setaffinity(0, set(cpus[server_cpus:]))
    return set(cpus[:server_cpus])


def over_allocated(client: ExtenderClient) -> int:
    """Records the service refused as conflicting (0 means nothing is over capacity)."""
    nodes = client.get("/debug/nodes")["nodes"]
    return sum(len(n.get("recordErrors") or {}) for n in nodes)


# ---------------------------------------------------------------- main


SAMPLING = {"default": 0, "all": 100}


def serve_command(cluster: Path, port: int, policy: str) -> list[str]:
    return [
        *gpuslice_command(),
        "serve",
        "--cluster-file",
        str(cluster),
        "--port",
        str(port),
        "--policy",
        policy,
        "--max-body-bytes",
        str(BODY_CAP),
    ]


def measure(
    command: list[str], cluster: Cluster, sampling: str, mode: str, warmup: int, log: Path, cpus: set[int] | None
) -> tuple[Result, int]:
    profiled = "--profile" in command and "serve_probe.py" in " ".join(command)
    port = free_port()
    command = [*command[:-1], str(port)] if command[-2] == "--noop-port" else _with_port(command, port)
    with running(command, port, log, cpus) as (client, pid):
        scheduler = KubeScheduler(port, cluster.nodes, cluster.running, percentage=SAMPLING[sampling], mode=mode)
        # serve_probe.py --profile: a profile of the measured attempts, another of the first calls
        toggle = (lambda: os.kill(pid, signal.SIGUSR1)) if profiled else None
        probing = "serve_probe.py" in " ".join(command)
        got = scheduler.run(cluster.pending, warmup, pid, measuring_starts=toggle, per_call_cpu=probing)
        if toggle:
            toggle()
            time.sleep(0.5)
        scheduler.first_calls(got, server=pid)
        if toggle:
            toggle()
        bad = over_allocated(client) if "--noop-port" not in command else 0
    return got, bad


def _with_port(command: list[str], port: int) -> list[str]:
    out = list(command)
    out[out.index("--port") + 1] = str(port)
    return out


COLUMNS = (
    "nodes",
    "fill",
    "sampling",
    "extender",
    "filter p50",
    "filter p99",
    "prio p50",
    "prio p99",
    "f+p p99",
    "bound/s",
    "tries/s",
    "bind fail %",
    "srv cpu/try",
    "drv cpu/try",
    "srv RSS MiB",
    "x p99",
    "x bound/s",
    "x cpu",
    "x floor cpu",
    "over-alloc",
    "cold p50",
    "cold max",
    "hopeless max",
    "load 1m",
)
KEY = 4  # the columns that name a run: nodes, fill, sampling, extender


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b and b == b and a == a else "-"


def row(
    n: int,
    fill: float,
    sampling: str,
    name: str,
    got: Result,
    base: Result | None,
    bad: int,
    floor: Result | None = None,
) -> tuple[str, ...]:
    """One run's figures; ``base``: the do-nothing extender's of the same round, ``floor`` the floor's."""
    both = both_p99(got)
    return (
        str(n),
        f"{fill:.2f}",
        sampling,
        name,
        f"{pct(got.filter_ms, 50):.2f}",
        f"{pct(got.filter_ms, 99):.2f}",
        f"{pct([p for p in got.prioritize_ms if p], 50):.2f}",
        f"{pct([p for p in got.prioritize_ms if p], 99):.2f}",
        f"{both:.2f}",
        f"{got.bound_per_s:.0f}",
        f"{got.attempts_per_s:.0f}",
        f"{got.bind_failure_pct:.2f}",
        f"{got.server_cpu_ms:.2f}",
        f"{got.driver_cpu_ms:.2f}",
        f"{got.server_rss_mib:.0f}",
        ratio(both, both_p99(base)) if base else "-",
        ratio(got.bound_per_s, base.bound_per_s) if base else "-",
        ratio(got.server_cpu_ms, base.server_cpu_ms) if base else "-",
        ratio(got.server_cpu_ms, floor.server_cpu_ms) if floor else "-",
        str(bad),
        f"{pct(got.cold_ms, 50):.2f}",
        f"{max(got.cold_ms, default=float('nan')):.2f}",
        f"{max(got.hopeless_ms, default=float('nan')):.2f}",
        f"{os.getloadavg()[0]:.2f}",
    )


def summary(rows: list[tuple[str, ...]]) -> list[str]:
    """Median (range) of the repeated runs, per (nodes, fill, sampling, extender)."""
    groups: dict[tuple[str, ...], list[tuple[str, ...]]] = {}
    for r in rows:
        groups.setdefault(r[:KEY], []).append(r)
    out = []
    for key, runs in groups.items():
        cells = list(key)
        for c in range(KEY, len(COLUMNS)):
            try:
                values = [float(r[c]) for r in runs]
            except ValueError:
                cells.append("-")
                continue
            cells.append(f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")
        out.append(" | ".join(cells))
    return out


def gc_pauses(path: Path) -> list[tuple[float, float, int, int]]:
    """The collections ``serve_probe.py --gc-log`` timed: (start, seconds, generation, collected)."""
    if not path.exists():
        return []
    rows = (json.loads(line) for line in path.read_text().splitlines() if line)
    return [(float(s), float(d), int(g), int(n)) for s, d, g, n in rows]


def inside(span: tuple[float, float], pauses: Sequence[tuple[float, float, int, int]]) -> float:
    """Seconds of ``pauses`` that fall within ``span``."""
    t0, t1 = span
    return sum(max(0.0, min(t1, s + d) - max(t0, s)) for s, d, _, _ in pauses)


def gc_report(got: Result, pauses: Sequence[tuple[float, float, int, int]] | None) -> str:
    """What the collector took of the measured calls and of the first calls (``pauses`` None: not
    logged, for the do-nothing extender and the floor), and what the rest of the machine took."""
    if not got.spans:
        return "  gc: no measured calls"
    logged = pauses is not None
    pauses = pauses or []
    window = (got.spans[0][0], got.spans[-1][1])
    during = [p for p in pauses if window[0] <= p[0] <= window[1]]
    per_call = [inside(s, during) * 1000 for s in got.spans]
    totals = [(t1 - t0) * 1000 for t0, t1 in got.spans]
    slow = pct(totals, 99)
    over = [k for k, t in enumerate(totals) if t >= slow]
    net = [t - g for t, g in zip(totals, per_call, strict=True)]
    first = [inside(s, pauses) * 1000 for s in got.cold_spans]
    worst = max(range(len(got.cold_spans)), key=lambda k: got.cold_spans[k][1] - got.cold_spans[k][0], default=None)
    gens = [sum(1 for p in during if p[2] == g) for g in range(3)]
    slowest = max(range(len(first)), key=lambda k: got.cold_run_ms[k] + got.cold_wait_ms[k], default=None)
    where = (
        (
            f"; the server's main thread on a CPU per attempt: p50 {pct(got.run_ms, 50):.2f} / p99 "
            f"{pct(got.run_ms, 99):.2f} / max {max(got.run_ms):.2f} ms"
            if got.run_ms
            else ""
        )
        + f"; the server's main thread waited for a CPU {got.server_wait_ms:.2f} ms an attempt; first calls: "
        f"on a CPU p50 {pct(got.cold_run_ms, 50):.1f} / max {max(got.cold_run_ms, default=float('nan')):.1f} ms, "
        f"waiting for one p50 {pct(got.cold_wait_ms, 50):.1f} / max {max(got.cold_wait_ms, default=float('nan')):.1f}"
        + (
            f" (the slowest: {got.cold_run_ms[slowest]:.1f} on a CPU + {got.cold_wait_ms[slowest]:.1f} waiting)"
            if slowest is not None
            else ""
        )
    )
    walls = [(t1 - t0) * 1000 for t0, t1 in got.cold_spans]
    top = sorted(range(len(walls)), key=walls.__getitem__, reverse=True)[:3]
    if got.cold_labels and got.cold_run_ms:
        where += "; the slowest first calls: " + "; ".join(
            f"{got.cold_labels[k]}: {walls[k]:.1f} ms = {got.cold_run_ms[k]:.1f} on a CPU + "
            f"{got.cold_wait_ms[k]:.1f} waiting (collection {first[k]:.1f})"
            + (f", the driver waiting {got.cold_driver_wait_ms[k]:.1f}" if k < len(got.cold_driver_wait_ms) else "")
            for k in top
        )
    if not logged:
        return "  " + where.removeprefix("; ").replace(" (collection 0.0)", "")
    return (
        f"  gc during the run: {len(during)} collections (gen 0/1/2: {gens[0]}/{gens[1]}/{gens[2]}), "
        f"{sum(p[1] for p in during) * 1000:.1f} ms in all, "
        f"longest {max((p[1] for p in during), default=0) * 1000:.1f} ms; "
        f"calls at or over the f+p p99 ({slow:.1f} ms): {len(over)}, {sum(1 for k in over if per_call[k] > 0)} of them "
        f"with a collection inside; f+p p99 without the collections' time: {pct(net, 99):.1f} ms; "
        f"first calls: {sum(1 for g in first if g > 0)} of {len(first)} with a collection inside "
        f"({sum(first):.1f} ms in all), the slowest "
        + (
            f"{(got.cold_spans[worst][1] - got.cold_spans[worst][0]) * 1000:.1f} ms of which collection "
            f"{first[worst]:.1f} ms"
            if worst is not None
            else "-"
        )
        + where
    )


def learn_events(path: Path) -> list[tuple[float, float, int]]:
    """The re-estimates ``serve_probe.py`` timed: (start, seconds, pods seen)."""
    if not path.exists():
        return []
    return [(float(a), float(b), int(c)) for a, b, c in (json.loads(x) for x in path.read_text().splitlines() if x)]


def learn_report(got: Result, events: Sequence[tuple[float, float, int]], after: int = 20) -> str | None:
    """The workload's re-estimates inside the measured run (``serve_probe.py``'s ``.learn.jsonl``)
    and what the ``after`` attempts that follow each cost against the run's median."""
    if not got.spans:
        return None
    window = (got.spans[0][0], got.spans[-1][1])
    inside_run = [e for e in events if window[0] <= e[0] <= window[1]]
    if not inside_run:
        return f"  workload re-estimates inside the run: none ({len(events)} in all, at pods {[e[2] for e in events]})"
    totals = [(t1 - t0) * 1000 for t0, t1 in got.spans]
    starts = [t0 for t0, _ in got.spans]
    parts = []
    for began, took, seen in inside_run:
        k = next((i for i, t in enumerate(starts) if t >= began), len(starts))
        k = max(0, k - 1)  # the attempt whose call made it
        following = totals[k : k + after]
        on_cpu = got.run_ms[k : k + after]
        parts.append(
            f"at pod {seen}: {took * 1000:.1f} ms, then f+p median {pct(following, 50):.1f} / max "
            f"{max(following, default=float('nan')):.1f} ms over {len(following)} attempts"
            + (f", on a CPU median {pct(on_cpu, 50):.1f} / max {max(on_cpu):.1f} ms" if on_cpu else "")
        )
    head = f"run median f+p {pct(totals, 50):.1f} ms" + (
        f", on a CPU {pct(got.run_ms, 50):.1f} ms" if got.run_ms else ""
    )
    return f"  workload re-estimates inside the run ({head}): " + "; ".join(parts)


def probed(command: list[str], probe: Path | None, name: str, profile: bool) -> tuple[list[str], Path | None]:
    """``command`` (gpuslice serve) run by serve_probe.py: collections logged, under cProfile if ``profile``."""
    if probe is None:
        return command, None
    probe.mkdir(parents=True, exist_ok=True)
    gc_log = probe / f"{name}.gc.jsonl"
    wrapper = [sys.executable, str(Path(__file__).with_name("serve_probe.py")), "--gc-log", str(gc_log)]
    if profile:
        wrapper += ["--profile", str(probe / f"{name}.prof")]
    return [*wrapper, "--", *command[command.index("serve") :]], gc_log


def run(args: argparse.Namespace) -> None:
    cpus = pin(args.server_cpus)
    work = Path(tempfile.mkdtemp(prefix="gpuslice-bench-"))
    print(" | ".join(COLUMNS), flush=True)
    rows: list[tuple[str, ...]] = []
    for n in args.nodes:
        for fill in args.fill:
            path = work / f"cluster-{n}-{fill:.2f}.json"
            cluster = write_cluster(path, n, args.pods + args.warmup, args.seed, args.mix, fill)
            for k in range(args.repeat):
                for sampling in args.sampling:
                    noop = [sys.executable, __file__, "--noop-port", "0"]
                    base, _ = measure(noop, cluster, sampling, args.mode, args.warmup, work / "noop.log", cpus)
                    rows.append(row(n, fill, sampling, "(noop)", base, None, 0))
                    print(" | ".join(rows[-1]), flush=True)
                    if args.probe:
                        print(gc_report(base, None), flush=True)
                    floor = None
                    if args.floor:
                        command = [sys.executable, __file__, "--floor-cluster", str(path), "--noop-port", "0"]
                        floor, _ = measure(command, cluster, sampling, args.mode, args.warmup, work / "floor.log", cpus)
                        rows.append(row(n, fill, sampling, "(floor)", floor, base, 0))
                        print(" | ".join(rows[-1]), flush=True)
                        if args.probe:
                            print(gc_report(floor, None), flush=True)
                    for policy in args.policy:
                        name = f"{policy}-{n}-{fill:.2f}-{sampling}-{k}"
                        command, gc_log = probed(serve_command(path, 0, policy), args.probe, name, args.profile)
                        log = work / f"{policy}.log"
                        got, bad = measure(command, cluster, sampling, args.mode, args.warmup, log, cpus)
                        rows.append(row(n, fill, sampling, policy, got, base, bad, floor))
                        print(" | ".join(rows[-1]), flush=True)
                        if gc_log is not None:
                            print(gc_report(got, gc_pauses(gc_log)), flush=True)
                            events = learn_events(gc_log.with_suffix(".learn.jsonl"))
                            line = learn_report(got, events)
                            if line and events:
                                print(line, flush=True)
            if not args.keep:
                path.unlink(missing_ok=True)
    if args.repeat > 1:
        print("\nmedian (range) over the runs:")
        print(" | ".join(COLUMNS))
        for line in summary(rows):
            print(line)
    print(
        f"\n(times in ms, client side over HTTP; {args.pods} measured scheduling attempts after {args.warmup}; "
        f"mix {args.mix}; fill: the share of GPU allocated before the run; sampling default = "
        "percentageOfNodesToScore unset (adaptive), all = every node; bound/s: pods bound per second; "
        "tries/s: scheduling attempts per second (pods that fit nowhere included); cpu/try: CPU ms per attempt "
        "of the server and of this driver; x: the ratio against the do-nothing extender of the same run "
        "(p99 of filter + prioritize, bound/s, server CPU), x floor cpu: server CPU against the floor's; "
        "cold p50, cold / hopeless max: the median and slowest filter + prioritize, every node listed, of 40 "
        "pods of shapes never seen and of 20 pods that fit nowhere, after the run; "
        f"logs in {work}" + (f"; probes in {args.probe}" if args.probe else "") + ")"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--policy", nargs="+", default=["binpack", "fgd-reserve"])
    parser.add_argument("--sampling", nargs="+", choices=sorted(SAMPLING), default=["default", "all"])
    parser.add_argument("--mode", choices=["names", "nodes"], default="names")
    parser.add_argument("--mix", choices=sorted(MIXES), default="many")
    parser.add_argument(
        "--fill",
        type=float,
        nargs="+",
        default=[0.0],
        help="GPU share allocated before the run (0..1; several: a cluster of each, e.g. 0 0.85: empty and busy)",
    )
    parser.add_argument("--pods", type=int, default=600, help="measured scheduling attempts' pods")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each (alternating), then medians")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the generated cluster files")
    parser.add_argument(
        "--server-cpus",
        type=int,
        default=0,
        help="give the server (gpuslice or the noop) this many CPUs of its own and the driver the rest "
        "(Linux; 0: share them all, the default)",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also measure the floor: the least GPU accounting an extender can do on the same HTTP stack "
        "(its ratios to the do-nothing extender are the best any such extender can reach here)",
    )
    parser.add_argument(
        "--probe",
        type=Path,
        help="run gpuslice under benchmarks/serve_probe.py: time every collection of the cyclic GC and lay the "
        "pauses beside the calls (a line after each row); files in this folder",
    )
    parser.add_argument("--profile", action="store_true", help="with --probe: cProfile gpuslice too (DIR/*.prof)")
    parser.add_argument("--noop-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--floor-cluster", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.noop_port is not None:
        import uvicorn

        app = floor_app(args.floor_cluster) if args.floor_cluster else noop_app()
        uvicorn.run(app, host="127.0.0.1", port=args.noop_port, log_level="warning", access_log=False, lifespan="off")
        return
    if args.floor and args.mode != "names":
        raise SystemExit(f"--floor with --mode {args.mode}: accepted: --mode names (the floor reads NodeNames)")
    for fill in args.fill:
        if not 0 <= fill < 1:
            raise SystemExit(f"--fill {fill}: accepted: a share from 0 to below 1")
    if args.profile and not args.probe:
        raise SystemExit("--profile without --probe: accepted: --probe DIR --profile (the profiles go to DIR)")
    unknown = [p for p in args.policy if p not in POLICIES]
    if unknown:
        raise SystemExit(f"--policy {' '.join(unknown)}: unknown; accepted: {', '.join(sorted(POLICIES))}")
    os.environ.setdefault("PYTHONHASHSEED", "0")
    run(args)


if __name__ == "__main__":
    main()
