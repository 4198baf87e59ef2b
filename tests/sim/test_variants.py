"""The openb variant generator (scheduler/sim/variants.py) on small hand-made pod lists."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from scheduler.sim.errors import TraceError
from scheduler.sim.variants import (
    SPEC_TABLE,
    NodeRoom,
    VariantSpec,
    describe,
    make_variant,
    pod_class,
    read_rows,
    write_rows,
)

ROOMS = (
    NodeRoom("T4", 104_000, 524_288, 2),
    NodeRoom("P100", 64_000, 262_144, 2),
    NodeRoom("G2", 96_000, 393_216, 8),
    NodeRoom("G3", 128_000, 786_432, 8),
    NodeRoom("V100M16", 64_000, 262_144, 8),
    NodeRoom("V100M32", 96_000, 786_432, 8),
    NodeRoom("A10", 128_000, 1_048_576, 1),
)


def row(cpu: int, gpus: int, milli: int, memory: int = 8192) -> dict[str, str]:
    return {
        "name": "x",
        "cpu_milli": str(cpu),
        "memory_mib": str(memory),
        "num_gpu": str(gpus),
        "gpu_milli": str(milli),
    }


def base() -> list[dict[str, str]]:
    """4 CPU-only, 6 sharing (0.5 GPU each: 3 GPUs), 8 one-GPU (8 GPUs), 2 four-GPU pods (8 GPUs)."""
    return (
        [row(4000 + i, 0, 0) for i in range(4)]
        + [row(2000 + i, 1, 500) for i in range(6)]
        + [row(8000 + i, 1, 1000) for i in range(8)]
        + [row(32000 + i, 4, 1000) for i in range(2)]
    )


def key(r: dict[str, str]) -> tuple[str, ...]:
    return (r["cpu_milli"], r["memory_mib"], r["num_gpu"], r["gpu_milli"])


def test_cpu_share_grows_by_copies_and_leaves_gpu_pods_alone() -> None:
    # 16 GPU pods; CPU-only pods become 60% of all: round(0.6 x 16 / 0.4) = 24 (4 kept, 20 copies)
    out = make_variant(base(), ROOMS, VariantSpec("v", 1, cpu=0.6))
    classes = Counter(pod_class(r) for r in out)
    assert classes == {"cpu": 24, "share": 6, "whole": 8, "multi": 2}
    originals = {key(r) for r in base() if pod_class(r) == "cpu"}
    assert {key(r) for r in out if pod_class(r) == "cpu"} == originals  # every added row is a copy of one
    assert sorted(key(r) for r in out if pod_class(r) != "cpu") == sorted(key(r) for r in base() if r["num_gpu"] != "0")


def test_cpu_share_shrinks_to_a_sample() -> None:
    # 10% of all: round(0.1 x 16 / 0.9) = 2 of the 4 CPU-only rows, none twice
    out = make_variant(base(), ROOMS, VariantSpec("v", 1, cpu=0.1))
    cpu = [key(r) for r in out if pod_class(r) == "cpu"]
    assert len(cpu) == len(set(cpu)) == 2


def test_share_request_keeps_the_number_of_gpu_pods() -> None:
    # 16 GPU pods: s = 500 milli, w = (8 x 1000 + 2 x 4000) / 10 = 1600. For 60%:
    # k = 0.6 x 16 x 1600 / (500 x 0.4 + 0.6 x 1600) = 15360 / 1160 = 13.24 -> 13 sharing pods,
    # 3 whole-GPU pods; then single moves bring the realised share as close to 60% as they can.
    out = make_variant(base(), ROOMS, VariantSpec("v", 3, gpushare=0.6))
    classes = Counter(pod_class(r) for r in out)
    assert classes["share"] + classes["whole"] + classes["multi"] == 16
    assert classes["cpu"] == 4
    assert describe(out)["gpushare"] == pytest.approx(0.6, abs=0.15)
    assert classes["share"] >= 10


def test_every_gpu_pod_shares_at_gpushare_one() -> None:
    out = make_variant(base(), ROOMS, VariantSpec("v", 1, gpushare=1.0))
    assert Counter(pod_class(r) for r in out) == {"cpu": 4, "share": 16}


def test_multi_request_adds_copies_until_the_share_is_reached() -> None:
    # multi-GPU pods carry 8 of 19 GPUs (42%); to reach 70% each copy adds 4 GPUs:
    # (8 + 4k) / (19 + 4k) >= 0.7 -> k >= (13.3 - 8) / 1.2 = 4.4 -> 5 copies: 28 / 39 = 71.8%
    out = make_variant(base(), ROOMS, VariantSpec("v", 1, multigpu=0.7))
    assert Counter(pod_class(r) for r in out)["multi"] == 7
    assert describe(out)["multigpu"] == pytest.approx(28 / 39)


def test_multi_request_removes_pods_above_the_share() -> None:
    # 10%: removing one leaves 4 of 15 GPUs (26.7%, still >= 10%), removing both would leave 0%:
    # as when adding, the share stops at the first count at or above the target
    out = make_variant(base(), ROOMS, VariantSpec("v", 1, multigpu=0.1))
    assert Counter(pod_class(r) for r in out)["multi"] == 1


def test_pinning_takes_the_fraction_of_gpu_pods_from_the_class_tables() -> None:
    # 16 GPU pods, 50% -> 8 pinned; each spec from its class's table; each pod fits some node of its models
    out = make_variant(base(), ROOMS, VariantSpec("v", 7, gpuspec=0.5))
    pinned = [r for r in out if r["gpu_spec"]]
    assert len(pinned) == 8
    for r in pinned:
        assert r["gpu_spec"] in {s for s, _ in SPEC_TABLE[pod_class(r)]}
        assert r["num_gpu"] != "0"
    # a 4-GPU pod is never pinned to a model whose nodes hold fewer GPUs (T4, P100 and A10 here)
    for r in pinned:
        if r["num_gpu"] == "4":
            assert not set(r["gpu_spec"].split("|")) <= {"T4", "P100", "A10"}


def test_pinning_skips_pods_no_model_of_the_table_can_hold() -> None:
    # a 200-core one-GPU pod fits no node: it is never pinned, so only the other one is
    rows = [row(200_000, 1, 1000), row(8000, 1, 1000)]
    out = make_variant(rows, ROOMS, VariantSpec("v", 1, gpuspec=0.99))
    assert [r["cpu_milli"] for r in out if r["gpu_spec"]] == ["8000"]


def test_same_seed_same_rows_and_names_in_order() -> None:
    a = make_variant(base(), ROOMS, VariantSpec("v", 5, cpu=0.5, gpuspec=0.3))
    b = make_variant(base(), ROOMS, VariantSpec("v", 5, cpu=0.5, gpuspec=0.3))
    c = make_variant(base(), ROOMS, VariantSpec("v", 6, cpu=0.5, gpuspec=0.3))
    assert a == b
    assert a != c
    assert [r["name"] for r in a] == [f"openb-pod-{i:04d}" for i in range(len(a))]


def test_levels_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError, match=re.escape("cpu 1.5 (accepted: a fraction from 0 to 0.99)")):
        VariantSpec("v", 1, cpu=1.5)


def test_rows_round_trip_through_a_file(tmp_path: Path) -> None:
    out = make_variant(base(), ROOMS, VariantSpec("v", 1, gpuspec=0.5))
    path = tmp_path / "openb_pod_list_v.csv"
    write_rows(path, out)
    assert read_rows(path) == out
    assert not list(tmp_path.glob("*.partial"))


def test_a_pod_list_without_the_columns_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("name,cpu\nx,1\n")
    with pytest.raises(TraceError, match=re.escape("bad.csv header: missing column(s) cpu_milli, memory_mib")):
        read_rows(path)
