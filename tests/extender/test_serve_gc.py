"""``gpuslice serve`` hides the synced cluster from the garbage collector, and then whatever
survives a collection, only once the first full sync is in; a sweep now and then collects
everything."""

from __future__ import annotations

import gc
import logging
import threading
import weakref
from collections.abc import Iterator

import pytest

from scheduler.extender import collector as gcs
from scheduler.extender import run as commands


class SlowSync:
    def __init__(self) -> None:
        self.synced = threading.Event()

    def ready(self) -> bool:
        return self.synced.is_set()


@pytest.fixture
def collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gcs.release()
    gc.unfreeze()
    gc.set_threshold(*thresholds)
    gc.enable()


class Cycle:
    def __init__(self) -> None:
        self.me = self


def generation_of(obj: object) -> int | None:
    """The generation ``obj`` is in (None: frozen, or not tracked)."""
    return next((g for g in range(3) if any(o is obj for o in gc.get_objects(g))), None)


@pytest.mark.usefixtures("collector")
def test_the_collector_is_tuned_after_the_first_sync_only() -> None:
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    backend = SlowSync()
    stopping = threading.Event()
    worker = threading.Thread(target=commands._freeze_when_synced, args=(backend, stopping), daemon=True)
    worker.start()
    try:
        worker.join(timeout=0.3)
        assert worker.is_alive() and gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == 0
        assert gcs._freeze_survivors not in gc.callbacks
        backend.synced.set()
        for _ in range(1000):  # the first collection walks the whole test process: it can take a while
            if gcs._freeze_survivors in gc.callbacks:
                break
            stopping.wait(0.01)
        assert worker.is_alive()  # sweeping now and then, until the service stops
        assert gc.get_threshold() == gcs.THRESHOLDS == (10_000, 10, 10)
        assert gc.get_freeze_count() > 0 and gcs._freeze_survivors in gc.callbacks
    finally:
        stopping.set()
        worker.join(timeout=10)
    assert not worker.is_alive()
    gcs.release()
    assert gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == 0
    assert gcs._freeze_survivors not in gc.callbacks


@pytest.mark.usefixtures("collector")
def test_what_survives_a_collection_is_frozen_and_a_sweep_frees_frozen_cycles() -> None:
    gcs.settle()
    kept = Cycle()
    assert generation_of(kept) == 0
    gc.collect(0)
    assert generation_of(kept) is None  # frozen: no later collection walks it again
    lost = weakref.ref(kept)
    del kept
    gc.collect()  # a frozen cycle is out of reach of the ordinary collections
    assert lost() is not None
    assert gcs.sweep() >= 1
    assert lost() is None
    assert gc.isenabled() and gc.get_freeze_count() > 0  # frozen again after the sweep


@pytest.mark.usefixtures("collector")
def test_a_sweep_comes_once_the_frozen_objects_grew_by_a_quarter(caplog: pytest.LogCaptureFixture) -> None:
    """When, not what: that a sweep frees a frozen cycle is the test above (a cycle checked here
    could be held for a moment by this thread's own check while the sweeper runs)."""
    gcs.settle()
    stopping = threading.Event()
    worker = threading.Thread(target=gcs.sweep_when_grown, args=(stopping, 0.01), daemon=True)
    with caplog.at_level(logging.INFO, logger="gpuslice.serve"):
        worker.start()
        try:
            stopping.wait(0.2)
            assert not caplog.records  # nothing grew: no sweep
            more = [[Cycle() for _ in range(100)] for _ in range(gc.get_freeze_count() // 300 + 1)]
            gc.collect(0)  # now a third more are frozen
            for _ in range(3000):  # a sweep of the whole test process can take seconds
                if caplog.records:
                    break
                stopping.wait(0.01)
        finally:
            stopping.set()
            worker.join(timeout=30)
    assert not worker.is_alive() and len(more) > 1
    assert caplog.records and {r.getMessage() for r in caplog.records} == {"full garbage collection"}


class _Cache:
    def __init__(self) -> None:
        self.nodes: dict[str, object] = {}

    def unusable(self) -> list[str]:
        return []


class _Extender:
    """An extender whose first sync notes whether the collector ran during it, or fails."""

    def __init__(self, fails: bool) -> None:
        self.fails = fails
        self.collecting: bool | None = None
        self.cache = _Cache()

    def start(self) -> None:
        self.collecting = gc.isenabled()
        if self.fails:
            raise RuntimeError("the API server said no")


class _Server:
    def __init__(self, extender: _Extender) -> None:
        self.extender = extender
        self.sync_error: Exception | None = None
        self.stopped = False

    def stop_soon(self) -> None:
        self.stopped = True


@pytest.mark.usefixtures("collector")
@pytest.mark.parametrize("fails", [False, True])
def test_the_collector_is_paused_during_the_first_sync_only(fails: bool) -> None:
    """The first sync builds the whole cache: the collector waits until it is in (then
    _freeze_when_synced collects once and starts it again), or starts again at once when the
    sync fails (the process is stopping; nothing will freeze)."""
    assert gc.isenabled()
    extender = _Extender(fails)
    server = _Server(extender)
    try:
        commands._sync(server, "test")  # type: ignore[arg-type]
        assert extender.collecting is False
        assert server.stopped is fails and (server.sync_error is not None) is fails
        assert gc.isenabled() is fails  # a good sync leaves it to _freeze_when_synced
        if not fails:
            backend = SlowSync()
            backend.synced.set()
            stopping = threading.Event()
            stopping.set()  # settle, then return at once instead of sweeping
            commands._freeze_when_synced(backend, stopping)  # type: ignore[arg-type]
            assert gc.isenabled() and gc.get_freeze_count() > 0
    finally:
        gc.enable()
