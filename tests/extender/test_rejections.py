"""What a filter call counts of its rejections: per reason, then per class of reason."""

from __future__ import annotations

import numpy as np

from scheduler.core.board import Outcomes, Status
from scheduler.extender.answers import tally
from scheduler.extender.metrics import Metrics


def test_tally_counts_the_reasons_met_among_many_known() -> None:
    # the board knows 5,000 texts (reasons name numbers); this call met three of them
    texts = ["", *(f"needs {k} MiB on one GPU, free 0 MiB" for k in range(1, 5_000))]
    status = np.array([Status.FITS, Status.UNSCHEDULABLE, Status.UNSCHEDULABLE, Status.UNRESOLVABLE, Status.FITS])
    reason = np.array([0, 4_321, 7, 4_321, 0], dtype=np.int32)
    outcomes = Outcomes(status.astype(np.int8), reason, np.zeros(5), texts)
    assert tally(outcomes) == {texts[7]: 1, texts[4_321]: 2}
    fitting = Outcomes(np.zeros(2, dtype=np.int8), np.zeros(2, dtype=np.int32), np.zeros(2), texts)
    assert tally(fitting) == {}


def test_rejections_are_counted_per_class_of_reason() -> None:
    metrics = Metrics()
    metrics.reject_counts(
        {
            "needs 4096 MiB on one GPU, free 1024 MiB": 3,
            "needs 8192 MiB on one GPU, free 0 MiB": 2,
            "node has no GPUs": 1,
        }
    )
    got = {
        sample.labels["reason"]: sample.value
        for family in metrics.registry.collect()
        if family.name == "gpuslice_filter_rejections"
        for sample in family.samples
        if sample.name.endswith("_total")
    }
    assert got == {"needs N MiB on one GPU, free N MiB": 5.0, "node has no GPUs": 1.0}
