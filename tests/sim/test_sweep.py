"""``gpuslice sweep`` and ``gpuslice report``: the same results locally and on Dask, a killed
sweep resumed, failed runs recorded, reports remade from the store alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from scheduler.cli import app
from scheduler.core.errors import UsageError
from scheduler.sim import executors
from scheduler.sim.executors import DaskExecutor, LocalExecutor, parse_executor
from scheduler.sim.store import RUNS_DIR, Store, StoreError, write_atomic
from scheduler.sim.sweep import SweepError, load_sweep, plan
from scheduler.sim.sweeper import input_hashes, run_sweep, stored_report
from tests.sim.helpers import OPENB_PODS, POD_HEADER, TWO_GPUS, openb_files

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]

SWEEP = """
name: tiny
inputs:
  - two.yaml
  - openb_pod_list_tiny.csv
policies: [fgd, bestfit, {name: random, label: rnd}]
seeds: 1-2
"""
RUNS = 2 * 3 * 2


def sweep_folder(tmp: Path, text: str = SWEEP) -> Path:
    """A folder with the two tiny inputs and ``sweep.yaml``; returns the file."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "two.yaml").write_text(TWO_GPUS)
    openb_files(tmp)
    path = tmp / "sweep.yaml"
    path.write_text(text)
    return path


def stored(out: Path) -> dict[str, dict[str, Any]]:
    """The store without what differs between two runs of the same run (time, host)."""
    entries = Store(out).entries()
    for entry in entries.values():
        entry.pop("made_by")
        entry.get("result", {}).pop("wall_seconds", None)
        entry.get("result", {}).pop("cpu_seconds", None)
        entry.pop("detail", None)
    return entries


@pytest.fixture(scope="module")
def dask_client() -> Iterator[Any]:
    distributed = pytest.importorskip("distributed")
    dask = pytest.importorskip("dask")
    with executors.local_cluster(2) as cluster, distributed.Client(cluster) as client:
        profiling = client.run(dask.config.get, "distributed.worker.profile.enabled")
        assert set(profiling.values()) == {False} and len(profiling) == 2
        yield client


def test_a_sweep_on_dask_gives_exactly_the_local_results(tmp_path: Path, dask_client: Any) -> None:
    file = sweep_folder(tmp_path)
    sweep = load_sweep(file)
    local = run_sweep(sweep, LocalExecutor(1), tmp_path / "local", show_progress=False)
    dask = DaskExecutor(None, 2)
    dask.client = dask_client
    remote = run_sweep(sweep, dask, tmp_path / "dask", show_progress=False)
    assert (local.ran, remote.ran, local.failed, remote.failed) == (RUNS, RUNS, [], [])
    a, b = stored(tmp_path / "local"), stored(tmp_path / "dask")
    assert len(a) == RUNS and set(a) == set(b)
    assert a == b
    # the runs really went to both workers, and each trace was shipped to each worker once
    hosts = {e["made_by"]["host"] for e in Store(tmp_path / "dask").entries().values()}
    assert hosts  # recorded by the client
    assert {e["run"]["label"] for e in a.values()} == {"fgd", "bestfit", "rnd"}
    assert all(e["status"] == "ok" for e in a.values())


def test_a_sweep_reaches_a_scheduler_by_its_address(tmp_path: Path, dask_client: Any) -> None:
    file = sweep_folder(tmp_path)
    address = dask_client.scheduler.address.removeprefix("tcp://")
    executor = parse_executor(f"dask://{address}")
    assert isinstance(executor, DaskExecutor) and executor.address == f"tcp://{address}"
    summary = run_sweep(load_sweep(file), executor, tmp_path / "remote", show_progress=False)
    assert (summary.ran, summary.failed) == (RUNS, [])
    run_sweep(load_sweep(file), LocalExecutor(1), tmp_path / "local", show_progress=False)
    assert stored(tmp_path / "remote") == stored(tmp_path / "local")


def test_no_scheduler_at_the_address_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(executors, "CONNECT_SECONDS", 0.5)
    file = sweep_folder(tmp_path)
    with pytest.raises(UsageError, match=r"--executor: no Dask scheduler answers at tcp://127.0.0.1:9"):
        run_sweep(load_sweep(file), parse_executor("dask://127.0.0.1:9"), tmp_path / "o", show_progress=False)


def test_each_trace_is_scattered_once_and_taken_by_reference(tmp_path: Path, dask_client: Any) -> None:
    file = sweep_folder(tmp_path)
    dask = DaskExecutor(None, 2)
    dask.client = dask_client
    scattered: list[Any] = []
    real_scatter = dask_client.scatter

    def counting_scatter(data: Any, **kwargs: Any) -> Any:
        scattered.append((type(data).__name__, kwargs.get("broadcast")))
        return real_scatter(data, **kwargs)

    dask_client.scatter = counting_scatter
    try:
        run_sweep(load_sweep(file), dask, tmp_path / "out", show_progress=False)
    finally:
        dask_client.scatter = real_scatter
    assert scattered == [("Trace", True), ("Trace", True)]  # two inputs, twelve runs


def test_run_ids_follow_content_not_path(tmp_path: Path) -> None:
    here = load_sweep(sweep_folder(tmp_path / "a"))
    there = load_sweep(sweep_folder(tmp_path / "b"))
    ids = [r.run_id for r in plan(here, input_hashes(here))]
    assert len(set(ids)) == RUNS
    assert ids == [r.run_id for r in plan(there, input_hashes(there))]
    openb_files(tmp_path / "b", OPENB_PODS.replace("pod-5,6000", "pod-5,5000"))
    edited = [r.run_id for r in plan(there, input_hashes(there))]
    assert edited[:6] == ids[:6] and not set(edited[6:]) & set(ids)  # only the edited trace's runs change


def test_a_killed_sweep_runs_only_the_missing_runs(tmp_path: Path) -> None:
    file = sweep_folder(tmp_path)
    whole = run_sweep(load_sweep(file), LocalExecutor(1), tmp_path / "whole", show_progress=False)
    assert whole.ran == RUNS
    out = tmp_path / "cut"
    command = [sys.executable, "-c", "from scheduler.cli import main; main()"]
    command += ["sweep", str(file), "--out", str(out), "--executor", "local:2", "-q"]
    child = subprocess.Popen(
        command, cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 60
    while len(list((out / RUNS_DIR).glob("*.json"))) < 3 and time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.02)
    os.killpg(child.pid, signal.SIGKILL)  # the sweep and its worker processes, mid-run
    child.wait()
    kept = len(list((out / RUNS_DIR).glob("*.json")))
    assert 3 <= kept < RUNS, f"the sweep was not cut halfway ({kept} of {RUNS} stored)"
    (out / RUNS_DIR / ".0000000000000000.json.1.tmp").write_text('{"half": ')  # as a kill mid-write leaves
    again = run_sweep(load_sweep(file), LocalExecutor(1), out, show_progress=False)
    assert (again.stored_before, again.ran) == (kept, RUNS - kept)
    assert stored(out) == stored(tmp_path / "whole")
    assert not list((out / RUNS_DIR).glob(".*"))
    assert run_sweep(load_sweep(file), LocalExecutor(1), out, show_progress=False).ran == 0


def test_a_malformed_trace_is_recorded_and_the_others_finish(tmp_path: Path) -> None:
    file = sweep_folder(tmp_path, SWEEP.replace("  - two.yaml\n", "  - two.yaml\n  - openb_pod_list_bad.csv\n"))
    rows = "".join(f"ok-{i},1000,1024,1,500\n" for i in range(3))
    (tmp_path / "openb_pod_list_bad.csv").write_text(f"{POD_HEADER}\n{rows}bad,1000,1024,1,abc\n")
    out = tmp_path / "out"
    result = runner.invoke(app, ["sweep", str(file), "--out", str(out), "--executor", "local:1", "-q"])
    assert result.exit_code == 6, result.output  # the bad trace's 3 policies x 2 seeds
    assert "Traceback" not in result.output
    entries = Store(out).entries()
    failed = [e for e in entries.values() if e["status"] == "failed"]
    assert len(entries) == RUNS + 6 and len(failed) == 6
    assert {e["run"]["trace"] for e in failed} == {"bad"}
    assert all(e["error"] == "openb_pod_list_bad.csv row 4: gpu_milli 'abc' is not an integer" for e in failed)
    assert "6 failed" in result.output
    with (out / "summary.csv").open() as handle:
        assert len(handle.readlines()) == 1 + RUNS  # the good runs, reported
    # started again: the failed runs are tried again, nothing else
    again = run_sweep(load_sweep(file, out=out), LocalExecutor(1), out, show_progress=False)
    assert (again.stored_before, again.ran, len(again.failed)) == (RUNS, 6, 6)
    # the trace fixed is another input (another hash): its runs are new, and succeed
    (tmp_path / "openb_pod_list_bad.csv").write_text(f"{POD_HEADER}\n{rows}")
    fixed = run_sweep(load_sweep(file, out=out), LocalExecutor(1), out, show_progress=False)
    assert (fixed.stored_before, fixed.ran, fixed.failed) == (RUNS, 6, [])


def test_a_misspelt_policy_option_stops_the_sweep_before_any_run(tmp_path: Path) -> None:
    text = SWEEP.replace("[fgd, bestfit, {name: random, label: rnd}]", "[{name: fgd, options: {x: 1}}]")
    file = sweep_folder(tmp_path, text)
    with pytest.raises(SweepError) as caught:
        load_sweep(file)
    assert "policies[0].options" in str(caught.value) and "unknown option 'x'; accepted: workload" in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_a_run_that_raises_is_recorded_with_its_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = executors.simulate

    def simulate(trace: Any, policy: str, *args: Any, **kwargs: Any) -> Any:
        if policy == "bestfit":
            raise TypeError("bestfit broke")
        return real(trace, policy, *args, **kwargs)

    monkeypatch.setattr(executors, "simulate", simulate)
    file = sweep_folder(tmp_path)
    summary = run_sweep(load_sweep(file), LocalExecutor(1), tmp_path / "out", show_progress=False)
    entries = Store(tmp_path / "out").entries().values()
    failed = [e for e in entries if "error" in e]
    assert len(failed) == len(summary.failed) == summary.ran // 3 > 0
    assert all(e["error"] == "TypeError: bestfit broke" and "Traceback" in e["detail"] for e in failed)


def test_report_remakes_the_tables_from_the_store_alone(tmp_path: Path) -> None:
    file = sweep_folder(tmp_path)
    out = tmp_path / "out"
    first = runner.invoke(app, ["sweep", str(file), "--out", str(out), "--executor", "local:1", "-q"])
    assert first.exit_code == 0, first.output
    made = {name: (out / name).read_bytes() for name in ("summary.csv", "curves.csv", "table.md")}
    for path in out.iterdir():
        if path.is_file() and path.name != "sweep.json":  # the store is runs/ and the plan
            path.unlink()
    for name in ("two.yaml", "openb_pod_list_tiny.csv", "openb_node_list_gpu_node.csv", "sweep.yaml"):
        (tmp_path / name).unlink()  # nothing but the store is left
    again = runner.invoke(app, ["report", str(out)])
    assert again.exit_code == 0, again.output
    assert {name: (out / name).read_bytes() for name in made} == made
    for name in ("two_unallocated.png", "tiny_frag_rate.png", "unallocated_by_trace.png"):
        assert (out / name).stat().st_size > 0
    assert "two" in again.output and "rnd" in again.output


def test_renaming_a_label_relabels_the_stored_runs_without_running_them(tmp_path: Path) -> None:
    file = sweep_folder(tmp_path)
    out = tmp_path / "out"
    run_sweep(load_sweep(file), LocalExecutor(1), out, show_progress=False)
    file.write_text(SWEEP.replace("label: rnd", "label: uniform"))
    again = run_sweep(load_sweep(file), LocalExecutor(1), out, show_progress=False)
    assert again.ran == 0
    report, _, _ = stored_report(out)
    assert {r.policy for r in report.records} == {"fgd", "bestfit", "uniform"}
    assert [s["ran"] for s in Store(out).read_plan()["sessions"]] == [RUNS, 0]
    assert report.preamble.startswith(f"{RUNS} runs stored of the {RUNS} planned (0 failed); 2 sweep(s)")


def test_local_sweeps_never_import_distributed(tmp_path: Path) -> None:
    file = sweep_folder(tmp_path)
    code = (
        "import sys\nfrom pathlib import Path\nfrom scheduler.sim import commands\n"
        f"commands.sweep(Path({str(file)!r}), out=Path({str(tmp_path / 'o')!r}), executor='local:1', quiet=True)\n"
        "print('distributed' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "False"


def test_writes_are_atomic_and_a_bad_run_file_is_named(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere" / "a.json"
    write_atomic(target, "{}")
    assert target.read_text() == "{}" and [p.name for p in target.parent.iterdir()] == ["a.json"]
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "abc.json").write_text('{"id": "abc", "status": "ok"')
    with pytest.raises(StoreError, match=r"runs/abc.json: is not a run record"):
        Store(tmp_path).entries()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("inputs: [two.yaml]\npolicies: [fgd]\ncolour: red\n", "colour: unknown key (accepted: name, data, out"),
        ("policies: [fgd]\n", "inputs: missing or empty"),
        ("inputs: [two.yaml]\npolicies: [tetris]\n", "policies[0].name: 'tetris' (accepted: bestfit, binpack"),
        ("inputs: [two.yaml]\npolicies: [fgd, fgd]\n", "policies[1]: a second policy labelled 'fgd'"),
        (
            "inputs: [two.yaml]\npolicies: [fgd, {name: fgd, label: again}]\n",
            "policies[1]: the same policy and options as policies[0]",
        ),
        ("inputs: [two.yaml]\npolicies: [fgd]\nseeds: ten\n", "seeds: 'ten' (accepted: a seed (42)"),
        ("inputs: [two.yaml]\npolicies: [fgd]\ninflate: -1\n", "inflate: -1 (accepted: 0 (as given)"),
        ("inputs: [two.yaml]\npolicies: [fgd]\nreplay: backwards\n", "replay: 'backwards' (accepted: arrivals, timed"),
        ("inputs: [a/x.csv, b/x.csv]\npolicies: [fgd]\n", "inputs[1]: a second input named 'x'"),
        ("inputs: [two.yaml\n", "sweep.yaml line 2: is not valid YAML"),
    ],
)
def test_a_bad_sweep_file_gets_one_line(tmp_path: Path, text: str, message: str) -> None:
    file = sweep_folder(tmp_path, text)
    result = runner.invoke(app, ["sweep", str(file), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_the_same_trace_twice_is_refused(tmp_path: Path) -> None:
    file = sweep_folder(tmp_path, SWEEP.replace("  - two.yaml\n", "  - two.yaml\n  - copy.yaml\n"))
    (tmp_path / "copy.yaml").write_text(TWO_GPUS)
    result = runner.invoke(app, ["sweep", str(file), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "inputs[1]: the same content as inputs[0] (list it once)" in result.output


def test_a_missing_input_names_the_data_folder(tmp_path: Path) -> None:
    file = sweep_folder(tmp_path, SWEEP)
    (tmp_path / "elsewhere").mkdir()  # a folder that exists, without the sweep's inputs
    result = runner.invoke(app, ["sweep", str(file), "--data", str(tmp_path / "elsewhere"), "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "inputs[0]:" in result.output and "--data DIR" in result.output


def test_report_of_a_folder_without_runs(tmp_path: Path) -> None:
    result = runner.invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2
    assert "holds no stored run" in result.output


@pytest.mark.parametrize("text", ["ray://x", "local:0", "dask-local:two"])
def test_a_bad_executor_is_refused(text: str) -> None:
    with pytest.raises(UsageError, match="--executor"):
        parse_executor(text)


def test_the_shipped_paper_grid_is_the_papers(tmp_path: Path) -> None:
    sweep = load_sweep(REPO / "simulations" / "paper-grid" / "sweep.yaml", data=tmp_path)
    names = [i.trace_name for i in sweep.inputs]
    assert len(names) == 17 and "cpu0" not in names and "default" in names
    assert [p.name for p in sweep.policies] == [
        "random",
        "dotprod",
        "gpuclustering",
        "gpupacking",
        "bestfit",
        "fgd",
        "fgd-cpu",
        "fgd-reserve",
    ]
    assert sweep.seeds == tuple(range(42, 52))
    assert all(i.path.is_relative_to(tmp_path) for i in sweep.inputs)
    assert sweep.reference == tmp_path / "fgd_expected_results"
