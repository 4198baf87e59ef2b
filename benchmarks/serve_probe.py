"""Run ``gpuslice serve`` as the benchmark driver does, with probes the driver reads back.

    python benchmarks/serve_probe.py [--profile FILE] [--gc-log FILE] -- serve --cluster-file ...

``--profile``: cProfile on the thread that answers filter, prioritize and bind (uvicorn's
event loop: with a cluster file, bind is answered there too), written to FILE when the server
stops (``python -m pstats FILE``); SIGUSR1 writes it at once and starts a fresh one, written
to FILE's ``.first.prof`` twin when the server stops (the driver sends it before the first
calls of new shapes). ``--gc-log``: every collection of CPython's cyclic collector
timed (a :data:`gc.callbacks` hook, first in the list), written to FILE as JSON lines
``[start, seconds, generation, collected]`` when the server stops. ``start`` is
:func:`time.perf_counter`, on Linux the system's monotonic clock, so the driver can lay the
pauses beside its own timings of the calls.
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

    if options.gc_log:
        gc.callbacks.insert(0, timed)
    profiles = [cProfile.Profile()] if options.profile else []

    def switch(signum: int, frame: Any) -> None:
        """The profile so far to FILE; from now on a fresh one, to FILE's ``.first.prof`` twin."""
        profiles[-1].disable()
        profiles[-1].dump_stats(str(options.profile))
        profiles.append(cProfile.Profile())
        profiles[-1].enable()

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    # uvicorn restores the handler it found once it has shut down and raises the signal again:
    # this one unwinds to the ``finally`` below, where the default one would end the process
    signal.signal(signal.SIGTERM, stop)
    if profiles:
        signal.signal(signal.SIGUSR1, switch)
    sys.argv = ["gpuslice", *args]
    from scheduler.cli import main as gpuslice

    if profiles:
        profiles[0].enable()
    try:
        gpuslice()
    except SystemExit:
        pass
    finally:
        if profiles:
            profiles[-1].disable()
            last = options.profile if len(profiles) == 1 else options.profile.with_suffix(".first.prof")
            profiles[-1].dump_stats(str(last))
        if options.gc_log:
            options.gc_log.write_text("".join(json.dumps(p) + "\n" for p in pauses))


if __name__ == "__main__":
    main()
