"""Two replicas never both decide the same node's share: the ledger's compare-and-set is the
leader election, per node. Shown, not assumed: many concurrent binds through both replicas
to few nodes make the API server refuse stale writes (its conflict counter), and still no
device is given beyond its capacity and exactly the shares that fit are given."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tests.fakes import FakeClock

from .harness import (
    Attempt,
    CountingApiServer,
    Replica,
    audit,
    cache_view,
    node_json,
    pod_json,
    schedule_once,
    truth,
    wait_for,
)

Make = Callable[..., Replica]
NODES = ["mps1", "mps2", "mig1"]


def test_two_replicas_racing_for_few_nodes_never_over_allocate(
    api: CountingApiServer, clock: FakeClock, replicas: Make
) -> None:
    api.put_node(node_json("mps1", gpus=2))  # quarters of a GPU: 8 per node
    api.put_node(node_json("mps2", gpus=2))
    api.put_node(node_json("mig1", gpus=2, mode="mig"))  # 1g.10gb instances: 7 per H100, 14 in all
    pods = [api.put_pod(pod_json(f"q{i:02d}", gpu_fraction="0.25", sharing="mps")) for i in range(24)]
    pods += [api.put_pod(pod_json(f"m{i:02d}", mig_profile="1g.10gb")) for i in range(20)]
    # A slower ledger read widens the window between read and compare-and-set, as a loaded API
    # server does; the race is there without it, this only makes it certain on a fast machine.
    api.fault("get", "configmaps", delay_s=0.01, status=None, times=None)
    first, second = replicas(), replicas()
    wait_for(lambda: all(len(r.extender.cache.pods) == len(pods) for r in (first, second)), "both caches synced")

    def kube_scheduler(i: int) -> list[Attempt]:
        rng = random.Random(i)
        tries = []
        turned_away = 0
        for k in range(10):  # kube-scheduler requeues a pod whose bind failed
            replica = (first, second)[(i + k) % 2]
            attempt = schedule_once(replica.client, pods[i], NODES, rng)
            tries.append(attempt)
            if attempt.outcome == "bound":
                break
            if attempt.outcome == "unschedulable":
                # The last free shares may be held for pods whose binds are still under way (and
                # then fail); kube-scheduler tries an unschedulable pod again once the cluster
                # changes. Turned away three times, with those binds landed between, it is.
                turned_away += 1
                if turned_away == 3:
                    break
                time.sleep(0.3)
        return tries

    with ThreadPoolExecutor(16) as pool:
        history = list(pool.map(kube_scheduler, range(len(pods))))
    final = [h[-1] for h in history]
    assert all(a.outcome in ("bound", "unschedulable") for a in final), [a for a in final if a.outcome != "bound"]
    bound = [a for a in final if a.outcome == "bound"]
    assert len(bound) == 16 + 14  # exactly what fits: 2 x 8 quarters, 2 x 7 MIG 1g instances
    assert api.conflicts > 0  # the two replicas did race for the same ledgers, and the API server refused
    report = audit(api)
    assert report.clean, report
    assert report.shares_by_node == {"mps1": 8, "mps2": 8, "mig1": 14}
    for replica in (first, second):
        wait_for(lambda r=replica: cache_view(r.extender, NODES) == truth(api), "the cache to equal the truth")
    print(f"conflicts refused by the API server: {api.conflicts}; failed binds retried: {_retried(history)}")


def _retried(history: list[list[Any]]) -> int:
    return sum(1 for tries in history for a in tries if a.outcome == "bind-failed")
