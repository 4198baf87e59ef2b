"""``gpuslice serve`` hides the synced cluster from the garbage collector and makes it run
less often, only once the first full sync is in."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

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
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("collector")
def test_the_collector_is_tuned_after_the_first_sync_only() -> None:
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    backend = SlowSync()
    worker = threading.Thread(target=commands._freeze_when_synced, args=(backend,))
    worker.start()
    worker.join(timeout=0.3)
    assert worker.is_alive() and gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == 0
    backend.synced.set()
    worker.join(timeout=10)
    assert not worker.is_alive()
    assert gc.get_threshold() == commands.GC_THRESHOLDS == (10_000, 10, 10)
    assert gc.get_freeze_count() > 0


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
            commands._freeze_when_synced(backend)  # type: ignore[arg-type]
            assert gc.isenabled() and gc.get_freeze_count() > 0
    finally:
        gc.enable()
