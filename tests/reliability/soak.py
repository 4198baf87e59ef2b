"""A soak: pods arriving and departing at a steady rate through two ``gpuslice serve`` replicas.

Both replicas are subprocesses sharing one fake API server (in this process, 127.0.0.1). A
driver plays kube-scheduler: for each arriving pod, filter, prioritize, pick the best score,
bind, through one replica or the other; a failed bind is retried after a short backoff (the
scheduler's requeue); departures end or delete pods. Every window it audits the API server's
objects (no device over-allocated, from the pods' records) and takes latency percentiles;
at the end, after a stale interval and a sweep, it checks that no share is lost (no ledger
entry or record of a pod that is gone, none half-written) and that both replicas show the
truth, and compares each replica's memory at the start and at the end.

``run_soak`` is shared by tests/reliability/test_soak.py (a short run) and benchmarks/soak.py.
"""

from __future__ import annotations

import heapq
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .harness import (
    Attempt,
    Audit,
    CountingApiServer,
    ServeProcess,
    audit,
    node_json,
    percentile,
    pod_json,
    schedule_once,
    shown_by_service,
    shown_by_state,
    truth_states,
    wait_for,
)

# (weight, annotations) of arriving pods: every sharing mode
POD_KINDS: tuple[tuple[float, dict[str, str]], ...] = (
    (0.25, {"gpu_fraction": "0.25", "sharing": "mps"}),
    (0.15, {"gpu_fraction": "0.5"}),
    (0.10, {"gpu_memory": "10Gi", "gpu_compute": "20", "sharing": "mps"}),
    (0.15, {"mig_profile": "1g.10gb"}),
    (0.05, {"mig_profile": "3g.40gb"}),
    (0.15, {"gpu_fraction": "0.25", "sharing": "time-slicing"}),
    (0.10, {"gpu_count": "1", "sharing": "exclusive"}),
    (0.05, {}),  # no GPU
)
MEMORY_BOUND_KIB = 64 * 1024  # allowed RSS growth of a replica from warm-up to the end


def soak_cluster(api: CountingApiServer) -> list[str]:
    nodes = [
        node_json("mps-1", gpus=2),
        node_json("mps-2", gpus=2),
        node_json("mig-1", gpus=2, mode="mig"),
        node_json("ts-1", gpus=2, model="L4", mode="time-slicing", replicas=4),
        node_json("whole-1", gpus=2, mode="exclusive"),
        node_json("whole-2", gpus=2, mode="exclusive"),
    ]
    for node in nodes:
        api.put_node(node)
    return [n["metadata"]["name"] for n in nodes]


@dataclass
class Window:
    index: int
    arrivals: int = 0
    departures: int = 0
    attempts: list[Attempt] = field(default_factory=list)
    over_allocations: int = 0

    def latency(self, part: str) -> tuple[float, float]:
        values = [getattr(a, f"{part}_s") for a in self.attempts if getattr(a, f"{part}_s") > 0]
        return percentile(values, 0.5) * 1000, percentile(values, 0.99) * 1000

    HEADING = (
        "window  arrivals  departures  bound  failed-binds  filter p50/p99 ms  prioritize p50/p99 ms  "
        "bind p50/p99 ms  over-allocations"
    )

    def row(self) -> str:
        bound = sum(1 for a in self.attempts if a.outcome == "bound")
        failed = sum(1 for a in self.attempts if a.outcome == "bind-failed")
        f, p, b = self.latency("filter"), self.latency("prioritize"), self.latency("bind")
        return (
            f"{self.index:>6}  {self.arrivals:>8}  {self.departures:>10}  {bound:>5}  {failed:>12}  "
            f"{f[0]:>7.1f}/{f[1]:<9.1f}  {p[0]:>10.1f}/{p[1]:<10.1f}  {b[0]:>7.1f}/{b[1]:<7.1f}  "
            f"{self.over_allocations:>16}"
        )


@dataclass
class SoakReport:
    seconds: float = 0.0
    arrivals: int = 0
    departures: int = 0
    binds_done: int = 0
    failed_binds: int = 0
    failure_reasons: Counter[str] = field(default_factory=Counter)
    unschedulable: int = 0  # pods that found no node in their tries (a full cluster), not an error
    unreachable: int = 0
    over_allocations: int = 0  # seen in any window's audit or at the end
    final: Audit = field(default_factory=Audit)
    views_match: bool = False  # both replicas show the API server's truth at the end
    conflicts: int = 0
    rss_kib: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # replica -> (ready, warm, end)
    windows: list[Window] = field(default_factory=list)

    @property
    def lost_shares(self) -> int:
        return len(self.final.lost_shares) + len(self.final.half_written)

    def memory_ok(self) -> bool:
        return all(end - warm <= MEMORY_BOUND_KIB for _, warm, end in self.rss_kib.values())

    def ok(self) -> bool:
        return (
            self.over_allocations == 0
            and self.lost_shares == 0
            and self.unreachable == 0
            and self.views_match
            and self.memory_ok()
        )

    def render(self) -> str:
        lines = [Window.HEADING, *(w.row() for w in self.windows)]
        lines.append(
            f"duration {self.seconds:.0f}s: arrivals {self.arrivals}, departures {self.departures}, "
            f"binds done {self.binds_done}, failed binds {self.failed_binds} (retried), "
            f"unschedulable {self.unschedulable}, unreachable {self.unreachable}"
        )
        lines.append(
            f"over-allocations {self.over_allocations}, lost shares {self.lost_shares} "
            f"(ledger entries of gone pods {len(self.final.lost_shares)}, half-written records "
            f"{len(self.final.half_written)}), replicas show the truth: {self.views_match}, "
            f"API-server conflicts {self.conflicts}"
        )
        if self.failure_reasons:
            top = ", ".join(f"{n} x {r}" for r, n in self.failure_reasons.most_common(4))
            lines.append(f"failed-bind reasons: {top}")
        for name, (ready, warm, end) in self.rss_kib.items():
            lines.append(
                f"memory of {name}: RSS {ready / 1024:.1f} MiB at start, {warm / 1024:.1f} MiB after warm-up, "
                f"{end / 1024:.1f} MiB at end (growth {(end - warm) / 1024:+.1f} MiB; bound "
                f"{MEMORY_BOUND_KIB / 1024:.0f} MiB)"
            )
        if len(self.windows) >= 2:
            first, last = self.windows[0], self.windows[-1]
            drift = [
                f"{part} p99 {first.latency(part)[1]:.1f} -> {last.latency(part)[1]:.1f} ms"
                for part in ("filter", "prioritize", "bind")
            ]
            lines.append("latency drift, first window to last: " + ", ".join(drift))
        return "\n".join(lines)


def _reason(error: str) -> str:
    for marker in ("no share", "changed under", "may still land", "not known", "HTTP", "unknown"):
        if marker in error:
            return marker
    return error[:60]


def run_soak(
    workdir: Path,
    seconds: float,
    arrival_per_s: float = 6.0,
    mean_life_s: float = 8.0,
    window_s: float = 60.0,
    seed: int = 1,
    log: Callable[[str], None] = print,
) -> SoakReport:
    rng = random.Random(seed)
    report = SoakReport()
    api = CountingApiServer()
    api.start()
    names = soak_cluster(api)
    kube = {"request_timeout_s": 5.0, "stale_allocation_s": 3.0, "sweep_interval_s": 1.0}
    replicas = [ServeProcess(workdir, api.url, f"replica-{i}", **kube) for i in (1, 2)]
    lock = threading.Lock()
    try:
        for replica in replicas:
            replica.wait_ready()
        ready_rss = {r.log_path.stem: r.rss_kib() for r in replicas}
        departures: list[tuple[float, int, str]] = []  # (when, seq, pod name)
        pending: list[Future[None]] = []
        window = Window(0)
        report.windows.append(window)

        def scheduled(pod: dict[str, Any], which: int) -> None:
            name = pod["metadata"]["name"]
            for attempt_no in range(4):  # kube-scheduler requeues with a backoff
                replica = replicas[(which + attempt_no) % 2]
                attempt = schedule_once(replica.client, pod, names, random.Random(f"{name}/{attempt_no}"))
                with lock:
                    window.attempts.append(attempt)
                    if attempt.outcome == "bind-failed":
                        report.failed_binds += 1
                        report.failure_reasons[_reason(attempt.error)] += 1
                    elif attempt.outcome == "unreachable":
                        report.unreachable += 1
                if attempt.outcome == "bound":
                    with lock:
                        report.binds_done += 1
                        heapq.heappush(departures, (time.monotonic() + rng.expovariate(1 / mean_life_s), seq(), name))
                    return
                if attempt.outcome in ("unreachable", "filter-error"):
                    return
                time.sleep(0.05 * 2**attempt_no)
            with lock:
                report.unschedulable += 1
                heapq.heappush(departures, (time.monotonic() + mean_life_s, seq(), name))  # gives up, goes away

        counter = iter(range(1 << 62))

        def seq() -> int:
            return next(counter)

        weights = [w for w, _ in POD_KINDS]
        started = time.monotonic()
        next_window = started + window_s
        next_arrival = started
        warm_rss: dict[str, int] = {}
        with ThreadPoolExecutor(8) as pool:
            while time.monotonic() - started < seconds:
                now = time.monotonic()
                while next_arrival <= now:
                    kind = rng.choices(POD_KINDS, weights)[0][1]
                    n = report.arrivals
                    pod = api.put_pod(pod_json(f"soak-{n:06d}", **kind))
                    report.arrivals += 1
                    window.arrivals += 1
                    pending.append(pool.submit(scheduled, pod, n % 2))
                    next_arrival += rng.expovariate(arrival_per_s)
                while True:
                    with lock:
                        if not departures or departures[0][0] > now:
                            break
                        _, _, name = heapq.heappop(departures)
                    if rng.random() < 0.5:
                        api.set_pod_phase("default", name, "Succeeded")  # ends first, deleted later by its owner
                    api.delete_pod("default", name)
                    report.departures += 1
                    window.departures += 1
                if now >= next_window:
                    window.over_allocations = len(audit(api).over_allocations)
                    report.over_allocations += window.over_allocations
                    if window.index == 0:
                        log(Window.HEADING)
                    log(window.row())
                    if not warm_rss:
                        warm_rss = {r.log_path.stem: r.rss_kib() for r in replicas}
                    with lock:
                        window = Window(len(report.windows))
                        report.windows.append(window)
                    next_window += window_s
                pending = [f for f in pending if not f.done()]
                time.sleep(0.01)
            for future in pending:
                future.result(timeout=120)
        report.seconds = time.monotonic() - started
        if not window.attempts and len(report.windows) > 1:
            report.windows.pop()
        else:
            window.over_allocations = len(audit(api).over_allocations)
            report.over_allocations += window.over_allocations
        # The end: after a stale interval and a sweep, nothing of a gone pod may hold a share
        try:
            wait_for(lambda: audit(api).clean, "the sweep to drop what departed pods held", timeout_s=15)
        except AssertionError as exc:
            log(str(exc))
        report.final = audit(api)
        report.over_allocations += len(report.final.over_allocations)
        expected = {n: shown_by_state(s) for n, s in truth_states(api).items() if s is not None}

        def views_match() -> bool:
            return all(
                {n["name"]: shown_by_service(n) for n in r.client.get("/debug/nodes")["nodes"]} == expected
                for r in replicas
            )

        try:
            wait_for(views_match, "both replicas to show the API server's truth", timeout_s=15, step_s=0.2)
            report.views_match = True
        except AssertionError as exc:
            log(str(exc))
        report.conflicts = api.conflicts
        for replica in replicas:
            name = replica.log_path.stem
            report.rss_kib[name] = (ready_rss[name], warm_rss.get(name, ready_rss[name]), replica.rss_kib())
        return report
    finally:
        for replica in replicas:
            replica.stop()
        api.stop()
