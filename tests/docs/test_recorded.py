"""The recorded scenario results are what the code gives today: seed 1 of every policy recorded
under simulations/ is run again and must match its row (test_docs.py holds the documents to
the recorded files; this holds the files to the code). The openb results need the Alibaba trace,
which CI does not have: with it fetched (see the README), the same check runs on seed 42."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from scheduler.sim.datasets import openb_dir
from scheduler.sim.load import load_trace
from scheduler.sim.metrics import summary_row
from scheduler.sim.runner import RunSpec, run_all

from .reading import REPO

SIMULATIONS = REPO / "simulations"
SCENARIOS = {
    "scenarios/h100-mig-fractions": SIMULATIONS / "scenarios" / "h100-mig-fractions.yaml",
    "scenarios/inference-mps-timeslicing": SIMULATIONS / "scenarios" / "inference-mps-timeslicing.yaml",
    "fgd-cpu/scenarios/h100-mig-fractions": SIMULATIONS / "scenarios" / "h100-mig-fractions.yaml",
    "fgd-cpu/scenarios/inference-mps-timeslicing": SIMULATIONS / "scenarios" / "inference-mps-timeslicing.yaml",
}
FIGURES = ("unallocated_gpu_pct_at_100", "allocated_gpu_pct_final", "failed_pods", "frag_rate_pct_at_100")


def recorded(folder: str, seed: int) -> dict[str, dict[str, str]]:
    with (SIMULATIONS / folder / "summary.csv").open(newline="", encoding="utf-8") as handle:
        return {r["policy"]: r for r in csv.DictReader(handle) if r["seed"] == str(seed)}


def rerun(trace_path: Path, folder: str, seed: int) -> None:
    rows = recorded(folder, seed)
    trace = load_trace(trace_path)
    specs = [RunSpec(trace, policy, seed) for policy in rows]
    for spec, result in zip(specs, run_all(specs, 1, show_progress=False), strict=True):
        again = summary_row(result)
        assert {k: str(again[k]) for k in FIGURES} == {k: rows[spec.policy][k] for k in FIGURES}, spec.label


@pytest.mark.parametrize("folder", sorted(SCENARIOS))
def test_the_recorded_scenarios_are_what_the_code_gives(folder: str) -> None:
    rerun(SCENARIOS[folder], folder, 1)


OPENB = openb_dir(REPO)


@pytest.mark.openb
@pytest.mark.skipif(not (OPENB / "openb_pod_list_default.csv").exists(), reason=f"no openb trace at {OPENB}")
@pytest.mark.parametrize("folder", ["openb/default", "fgd-cpu/default"])
def test_the_recorded_openb_runs_are_what_the_code_gives(folder: str) -> None:
    rerun(OPENB / "openb_pod_list_default.csv", folder, 42)
