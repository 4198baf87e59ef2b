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
