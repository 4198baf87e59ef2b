"""Fuzz every HTTP endpoint of the service with generated bodies (10,000 and more), and print the figures.

The service (Extender + KubeBackend + uvicorn) runs against the fake API server on 127.0.0.1,
over a cluster whose every pod is already bound, so no request can legitimately change the
allocation state. Bodies come from the hypothesis strategies of tests/reliability/fuzzing.py
(random JSON, Go-shaped bodies with a field mutated, malformed quantities, bodies over the
size cap, invalid UTF-8, deep nesting, odd paths and methods). Each answer is judged there:
no 5xx, no hang (client timeout 10 s), no change of the API server's objects or of the cache's
node states, no catch-all "internal error", a message whenever a request is refused.

    python benchmarks/fuzz_endpoints.py                      # 1,000 bodies for each of 10 endpoints
    python benchmarks/fuzz_endpoints.py --per-endpoint 3000 --seed 7
    python benchmarks/fuzz_endpoints.py --endpoints filter,bind

Exit status 1 when any answer broke a rule (the first failures are printed).
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.* are importable

from hypothesis import HealthCheck, Phase, given, seed, settings

from tests.fakes import FakeClock
from tests.reliability.fuzzing import ENDPOINTS, FuzzTarget, Probe, failures, probes, table, totals
from tests.reliability.harness import CountingApiServer, Replica


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-endpoint", type=int, default=1000, help="bodies per endpoint (default 1000)")
    parser.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: a random one, printed)")
    parser.add_argument("--endpoints", default=",".join(ENDPOINTS), help=f"comma-separated, of {', '.join(ENDPOINTS)}")
    args = parser.parse_args(argv)
    endpoints = [e for e in args.endpoints.split(",") if e]
    unknown = sorted(set(endpoints) - set(ENDPOINTS))
    if unknown or args.per_endpoint < 1:
        parser.error(f"--endpoints: unknown {unknown}; accepted: {', '.join(ENDPOINTS)}; --per-endpoint >= 1")
    chosen_seed = args.seed if args.seed is not None else random.randrange(2**32)
    for name in ("gpuslice", "uvicorn", "uvicorn.error"):
        logging.getLogger(name).setLevel(logging.CRITICAL)  # every refusal is logged; the table says it all

    api = CountingApiServer()
    api.start()
    replicas: list[Replica] = []

    def make(**options: object) -> Replica:
        replicas.append(Replica(api.url, clock=FakeClock(), **options))  # type: ignore[arg-type]
        return replicas[-1]

    started = time.monotonic()
    target = FuzzTarget(api, make)
    try:
        for endpoint in endpoints:
            began = time.monotonic()

            @seed(chosen_seed)
            @settings(
                max_examples=args.per_endpoint,
                deadline=None,
                database=None,
                phases=[Phase.generate],  # collect every failure; no shrinking
                suppress_health_check=list(HealthCheck),
            )
            @given(probe=probes(endpoint, target.context, target.replica.config.url_prefix))
            def run(probe: Probe) -> None:
                target.check(probe)

            run()
            print(
                f"{endpoint}: {target.stats[endpoint].tried} bodies in {time.monotonic() - began:.1f}s",
                file=sys.stderr,
                flush=True,
            )
    finally:
        target.close()
        for replica in replicas:
            replica.stop()
        api.stop()
    total = totals(target.stats)
    print(f"gpuslice endpoint fuzzing: seed {chosen_seed}, {time.monotonic() - started:.0f}s")
    print(table({e: target.stats[e] for e in endpoints}))
    broken = total.server_errors + total.state_changes + total.hangs + total.internal_errors + total.unexplained
    print(
        f"bodies tried {total.tried}, refused with a message {total.refused}, 5xx {total.server_errors}, "
        f"state changes {total.state_changes}, hangs {total.hangs}, internal errors {total.internal_errors}, "
        f"refusals without a message {total.unexplained}, max latency {total.max_seconds * 1000:.1f} ms"
    )
    for line in failures(target.stats):
        print("FAIL", line)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
