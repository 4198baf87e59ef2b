"""``gpuslice simulate`` and ``gpuslice bound`` through Typer's runner."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from scheduler.cli import app
from scheduler.sim.metrics import CURVE_COLUMNS, SUMMARY_COLUMNS
from scheduler.sim.reference import ALLOCATION_FILE
from tests.sim.helpers import TWO_GPUS, openb_files

runner = CliRunner()


def test_simulate_without_arguments_runs_the_embedded_scenario() -> None:
    result = runner.invoke(app, ["simulate", "--workers", "1", "--quiet"])
    assert result.exit_code == 0, result.output
    assert "small-mixed" in result.output
    for policy in ("random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd"):
        assert policy in result.output


def test_simulate_writes_the_issue_outputs(tmp_path: Path) -> None:
    scenario = tmp_path / "two.yaml"
    scenario.write_text(TWO_GPUS)
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        [
            "simulate",
            str(scenario),
            "-p",
            "fgd",
            "--policy",
            "bestfit,spread",
            "--seeds",
            "1-2",
            "--workers",
            "1",
            "-q",
            "--bound",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    with (out / "summary.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0]) == SUMMARY_COLUMNS
    assert {(r["policy"], r["seed"]) for r in rows} == {(p, s) for p in ("fgd", "bestfit", "spread") for s in "12"}
    with (out / "curves.csv").open() as handle:
        assert tuple(next(csv.DictReader(handle))) == CURVE_COLUMNS
    assert (out / "two-gpus_unallocated.png").stat().st_size > 0
    assert (out / "two-gpus_frag_rate.png").stat().st_size > 0
    assert "bound: unalloc. %" in result.output


def test_simulate_in_worker_processes(tmp_path: Path) -> None:
    scenario = tmp_path / "two.yaml"
    scenario.write_text(TWO_GPUS)
    result = runner.invoke(app, ["simulate", str(scenario), "-p", "fgd,random", "--workers", "2", "-q"])
    assert result.exit_code == 0, result.output
    assert "fgd" in result.output and "random" in result.output


def test_simulate_openb_with_reference(tmp_path: Path) -> None:
    pods = openb_files(tmp_path)
    reference = tmp_path / "ref"
    reference.mkdir()
    header = "workload,sc_policy,tune,seed,total_gpus," + ",".join(str(k) for k in range(131))
    values = ",".join("90" if k >= 100 else str(k) for k in range(131))
    (reference / ALLOCATION_FILE).write_text(f"{header}\nopenb_pod_list_tiny,06-FGD,1.3,42,7,{values}\n")
    result = runner.invoke(
        app,
        [
            "simulate",
            str(pods),
            "-p",
            "fgd",
            "--workers",
            "1",
            "-q",
            "--reference",
            str(reference),
            "--out",
            str(tmp_path / "out"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "10.00" in result.output  # the paper's 100 - 90


def test_timed_replay_from_the_command_line(tmp_path: Path) -> None:
    pods = openb_files(tmp_path)
    result = runner.invoke(app, ["simulate", str(pods), "-p", "bestfit", "--replay", "timed", "--workers", "1", "-q"])
    assert result.exit_code == 0, result.output


def test_bound_command(tmp_path: Path) -> None:
    scenario = tmp_path / "two.yaml"
    scenario.write_text(TWO_GPUS)
    result = runner.invoke(app, ["bound", str(scenario), "--seeds", "1,2", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "100.00" in result.output
    with (tmp_path / "bound.csv").open() as handle:
        assert [r["seed"] for r in csv.DictReader(handle)] == ["1", "2"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["simulate", "--policy", "tetris"], "--policy 'tetris': accepted: bestfit, binpack"),
        (["simulate", "--seeds", "ten"], "--seeds 'ten': accepted: a seed (42), a list (42,43) or a range"),
        (["simulate", "--replay", "backwards"], "--replay 'backwards': accepted: arrivals, timed"),
        (["simulate", "missing.csv"], "input 'missing.csv': no such file"),
        (["simulate", "--workers", "0"], "--workers '0': accepted: 1 or more"),
        (["bound", "--seeds", "5-1"], "--seeds '5-1'"),
    ],
)
def test_bad_arguments_get_a_message_not_a_traceback(args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_bad_file_gets_file_row_and_field(tmp_path: Path) -> None:
    header = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
    pods = openb_files(tmp_path, header + "".join(f"ok-{i},1,1,1,500\n" for i in range(16)) + "bad,1,1,1,abc\n")
    result = runner.invoke(app, ["simulate", str(pods), "-q", "--workers", "1"])
    assert result.exit_code == 2
    assert "gpuslice simulate: openb_pod_list_tiny.csv row 17: gpu_milli 'abc' is not an integer" in result.output


def test_a_snapshot_whose_pods_ask_for_little_says_why_its_row_is_empty(tmp_path: Path) -> None:
    # One node of 8 H100s under MPS and one pending pod of one GPU: arrivals reach 12.5% of the
    # capacity (rounded to 12), never the 100% the table reads at.
    node = {
        "kind": "Node",
        "metadata": {
            "name": "n",
            "annotations": {
                "gpuslice.io/inventory": json.dumps(
                    {"devices": [{"index": i, "model": "H100-80GB", "mode": "mps"} for i in range(8)]}
                )
            },
        },
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi"}},
    }
    pod = {
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default", "annotations": {"gpuslice.io/gpu-count": "1"}},
        "spec": {"containers": [{"name": "c"}]},
        "status": {"phase": "Pending"},
    }
    snapshot = tmp_path / "cluster.json"
    snapshot.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [node, pod]}))
    result = runner.invoke(app, ["simulate", str(snapshot), "-p", "binpack", "--workers", "1", "-q"])
    assert result.exit_code == 0, result.output
    note = " ".join(result.output.split("note: ", 1)[1].split("nothing written", 1)[0].split())
    assert note == (
        "cluster: its pods ask for 12% of the cluster's GPU capacity, so arrivals never reach the 100% the table "
        "reads at ('–'). To compare policies on a full cluster, grow the workload from these pods' shapes: "
        "--inflate 1.3 (with --replay arrivals for a timed input); or write the curves up to 12% with --out DIR "
        "(curves.csv)."
    )
    result = runner.invoke(
        app, ["simulate", str(snapshot), "-p", "binpack", "--workers", "1", "-q", "--inflate", "1.3"]
    )
    assert result.exit_code == 0, result.output
    assert "note:" not in result.output and "0.00" in result.output  # full: nothing unallocated
