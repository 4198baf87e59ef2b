"""Run ``gpuslice serve`` as the benchmark driver does, with probes the driver reads back.

    python benchmarks/serve_probe.py [--profile FILE] [--gc-log FILE] -- serve --cluster-file ...

``--profile``: cProfile, counting the CPU time of the thread that answers filter, prioritize and
bind (uvicorn's event loop; with a cluster file bind is answered there too), so that what the
rest of a loaded machine takes does not show; it runs between signals: the first SIGUSR1 starts
it (the driver sends it when its measured attempts begin), the second writes it to FILE and
starts a fresh one (sent before the first calls of new shapes), the third writes that one to
FILE's ``.first.prof`` twin (after them; ``python -m pstats FILE``).

``--gc-log``: every collection of CPython's cyclic collector timed (a :data:`gc.callbacks`
hook, first in the list), written to FILE as JSON lines ``[start, seconds, generation,
collected]`` when the server stops. ``start`` is :func:`time.perf_counter`, on Linux the
system's monotonic clock, so the driver can lay the pauses beside its own timings of the calls.
Beside it, FILE's ``.learn.jsonl`` twin: every new estimate of the workload a learning policy
(``fgd-reserve``) adopts, ``[start, seconds, pods seen]``: each drops the scores kept under the
policy's previous version.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", type=Path)
    parser.add_argument("--gc-log", type=Path)
    parser.add_argument("args", nargs=argparse.REMAINDER, help="gpuslice's arguments, after --")
    options = parser.parse_args()
    args = options.args[1:] if options.args[:1] == ["--"] else options.args
    pauses: list[tuple[float, float, int, int]] = []
    began = [0.0]

    def timed(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            pauses.append((began[0], time.perf_counter() - began[0], info["generation"], info["collected"]))

    learned: list[tuple[float, float, int]] = []
    if options.gc_log:
        gc.callbacks.insert(0, timed)
        learned = _time_reestimates()
    profiles: list[cProfile.Profile] = []
    names = [options.profile, options.profile.with_suffix(".first.prof")] if options.profile else []

    def switch(signum: int, frame: Any) -> None:
        """The profile under way (if any) written; the next one started (if any is left)."""
        if profiles and names:
            profiles[-1].disable()
            profiles[-1].dump_stats(str(names.pop(0)))
        if names and len(profiles) < 2:
            profiles.append(cProfile.Profile(time.thread_time))
            profiles[-1].enable()

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    # uvicorn restores the handler it found once it has shut down and raises the signal again:
    # this one unwinds to the ``finally`` below, where the default one would end the process
    signal.signal(signal.SIGTERM, stop)
    if options.profile:
        signal.signal(signal.SIGUSR1, switch)
    sys.argv = ["gpuslice", *args]
    from scheduler.cli import main as gpuslice

    try:
        gpuslice()
    except SystemExit:
        pass
    finally:
        if profiles and names:  # a profile still under way
            profiles[-1].disable()
            profiles[-1].dump_stats(str(names[0]))
        if options.gc_log:
            options.gc_log.write_text("".join(json.dumps(p) + "\n" for p in pauses))
            options.gc_log.with_suffix(".learn.jsonl").write_text("".join(json.dumps(e) + "\n" for e in learned))


def _time_reestimates() -> list[tuple[float, float, int]]:
    """Every new estimate a learning policy adopts (``OnlineWorkload.observe`` answering True:
    the policy's version moves, and every score kept under the old one is dropped), timed as
    ``(start, seconds, pods seen)``; the method is wrapped in this process only."""
    from scheduler.core.fragmentation import OnlineWorkload

    adopted: list[tuple[float, float, int]] = []
    observe = OnlineWorkload.observe

    def timed(self: OnlineWorkload, demand: Any) -> bool:
        began = time.perf_counter()
        new = observe(self, demand)
        if new:
            adopted.append((began, time.perf_counter() - began, self._count))
        return new

    OnlineWorkload.observe = timed  # type: ignore[method-assign]
    return adopted


if __name__ == "__main__":
    main()
