"""Time to score one pod against 5,000 nodes of 8 GPUs, per policy (the core only, no HTTP).

Three figures per policy, all from the same run:
  baseline  the plain per-node loop: fit + the policy's placement on every node, nothing cached
  cold      the board's first call for a request shape (every node worked out once per state)
  steady    the board in use: a stream of pods of a few shapes, each told to the policy (observe,
            as the extender does at a pod's first sight) and placed after scoring, so every call
            re-scores only the node that changed since that shape's last call (and every node
            when an online policy's estimate moves)
The ratio baseline / steady is the speed-up of caching node scores by state.

    python benchmarks/core_scoring.py [--nodes 5000] [--pods 300]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time

from scheduler.core.board import Board
from scheduler.core.catalog import CATALOG, ProfileSpec
from scheduler.core.inventory import Device, Node, SharingMode
from scheduler.core.policies import make_policy, tell
from scheduler.core.request import Demand, GpuKind, GpuRequest
from scheduler.core.select import rank
from scheduler.core.state import NodeState

MODES = [
    (SharingMode.MPS, "H100-80GB"),
    (SharingMode.TIME_SLICING, "A100-80GB"),
    (SharingMode.MIG, "A100-80GB"),
    (SharingMode.EXCLUSIVE, "H100-80GB"),
]
SHAPES = [
    Demand(4000, 16384, GpuRequest(GpuKind.SHARE, 1, fraction_milli=250)),
    Demand(8000, 32768, GpuRequest(GpuKind.SHARE, 1, fraction_milli=500)),
    Demand(8000, 65536, GpuRequest(GpuKind.WHOLE, 1)),
    Demand(4000, 16384, GpuRequest(GpuKind.MIG, 1, profile=ProfileSpec.parse("3g.40gb"))),
    Demand(16000, 131072, GpuRequest(GpuKind.WHOLE, 4)),
]


def cluster(count: int, rng: random.Random) -> list[NodeState]:
    nodes = []
    for i in range(count):
        mode, model = MODES[i % len(MODES)]
        devices = tuple(Device(f"n{i}-g{g}", g, CATALOG[model], mode, replicas=4) for g in range(8))
        nodes.append(NodeState.empty(Node(f"node-{i:05d}", 128_000, 1_048_576, devices)))
    # pre-fill about a third of the GPU capacity so states differ from node to node
    board = Board(nodes)
    policy = make_policy("binpack")
    for k in range(count * 3):
        demand = rng.choice(SHAPES[:4])
        placement = board.best(policy, demand)
        if placement is not None:
            state = board.get(placement.node)
            assert state is not None
            board.put(state.apply(f"pre-{k}", placement.allocation))
    return [NodeState(s.node, s.usage, s.cpu_milli, s.memory_mib, s.pods) for s in board.states]


def fresh(states: list[NodeState]) -> list[NodeState]:
    return [NodeState(s.node, s.usage, s.cpu_milli, s.memory_mib, s.pods) for s in states]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=300)
    parser.add_argument("--policies", default="binpack,spread,bestfit,fgd")
    args = parser.parse_args()
    rng = random.Random(1)
    t0 = time.perf_counter()
    base = cluster(args.nodes, rng)
    # As the extender does after its first sync: move the long-lived cluster out of the garbage
    # collector's generations, so its pauses do not land on scoring calls.
    gc.collect()
    gc.freeze()
    print(
        f"cluster: {args.nodes} nodes x 8 GPUs (MPS, time-slicing, MIG, exclusive), pre-filled in "
        f"{time.perf_counter() - t0:.1f} s"
    )
    print(
        f"{'policy':<10}{'baseline ms':>13}{'cold ms':>10}{'steady p50 ms':>15}{'steady p99 ms':>15}"
        f"{'baseline/steady':>17}"
    )
    for name in args.policies.split(","):
        policy = make_policy(name)
        demand = SHAPES[0]
        t = time.perf_counter()
        rank(policy, demand, fresh(base))
        baseline = (time.perf_counter() - t) * 1000
        board = Board(fresh(base))
        t = time.perf_counter()
        board.scores(policy, demand)
        cold = (time.perf_counter() - t) * 1000
        for shape in SHAPES:  # warm every shape once, as a running extender would be
            board.scores(policy, shape)
        times = []
        for k in range(args.pods):
            shape = SHAPES[k % len(SHAPES)]
            t = time.perf_counter()
            tell(policy, shape)  # told of each pod at first sight, as the extender does
            placement = board.best(policy, shape)
            times.append((time.perf_counter() - t) * 1000)
            if placement is not None:
                state = board.get(placement.node)
                assert state is not None
                board.put(state.apply(f"pod-{k}", placement.allocation))
        times.sort()
        p50 = statistics.median(times)
        p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
        print(f"{name:<10}{baseline:>13.1f}{cold:>10.1f}{p50:>15.2f}{p99:>15.2f}{baseline / p50:>16.0f}x")


if __name__ == "__main__":
    main()
