"""How ``gpuslice serve`` runs CPython's cyclic garbage collector.

Serving makes no cyclic garbage worth the name: nodes' states, pods and the board's tables
are freed by reference counting when they are replaced (a 3,000-pod run of the benchmark
driver at 5,000 nodes left 48 objects in cycles). Yet the collector walks every object that
survives a young collection again in the older generations, and the board keeps hundreds of
thousands of them (kept answers per node state and kind of pod): each collection of the
middle generation took 70-120 ms there, paid by whichever call was running, and a full one
more.

So, once the first sync is in (:func:`settle`): one full collection, then whatever a
collection leaves alive is frozen at once (:func:`gc.freeze`), so that no object is walked
twice; the young generation is collected every ``THRESHOLDS[0]`` allocations (3-15 ms
each at 5,000 nodes). What a frozen cycle would hold is found by :func:`sweep`, a full
collection of everything, run when the frozen objects have grown by a quarter since the last
one: CPython's own rule for its oldest generation, so that the work stays in proportion to the
objects made (a pause of 0.2-0.4 s at 5,000 nodes, 1.7-1.9 s with 50,000 pods bound; logged, with
what it freed).
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

from scheduler import logs

log = logs.get("serve")

# The collector's thresholds while serving (CPython's default: 700, 10, 10).
THRESHOLDS = (10_000, 10, 10)
GROWTH = 1.25  # a sweep once the frozen objects have grown by this much (CPython's rule for its oldest generation)
POLL_S = 10.0


_before: list[tuple[int, ...]] = []  # the thresholds settle found, for release


def _freeze_survivors(phase: str, info: dict[str, Any]) -> None:
    if phase == "stop":
        gc.freeze()


def settle() -> None:
    """Collect once, freeze what is left, and freeze the survivors of every later collection."""
    gc.collect()
    gc.freeze()
    if _freeze_survivors not in gc.callbacks:
        _before[:] = [gc.get_threshold()]
        gc.set_threshold(*THRESHOLDS)
        gc.callbacks.append(_freeze_survivors)  # last: once it is in, all of the above is done
    gc.enable()


def release() -> None:
    """Back to CPython's own ways (when the service stops: its process may go on, as in tests)."""
    if _freeze_survivors not in gc.callbacks:
        return
    gc.callbacks.remove(_freeze_survivors)
    gc.unfreeze()
    gc.set_threshold(*_before.pop())


def sweep() -> int:
    """A full collection, frozen objects included; the number of objects it freed."""
    was_enabled = gc.isenabled()
    gc.disable()  # no automatic collection (which would freeze all again) before this one
    try:
        gc.unfreeze()
        found = gc.collect()
        gc.freeze()
    finally:
        if was_enabled:
            gc.enable()
    return found


def sweep_when_grown(stopping: threading.Event, poll_s: float = POLL_S) -> None:
    """:func:`sweep` whenever the frozen objects have grown by a quarter since the last sweep
    (or since :func:`settle`), looking every ``poll_s`` seconds, until ``stopping`` is set."""
    after = gc.get_freeze_count()
    while not stopping.wait(poll_s):
        if gc.get_freeze_count() <= after * GROWTH:
            continue
        started = time.perf_counter()
        freed = sweep()
        after = gc.get_freeze_count()
        log.info(
            "full garbage collection",
            extra={"seconds": round(time.perf_counter() - started, 3), "freed": freed, "objects": after},
        )
