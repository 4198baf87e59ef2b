"""``gpuslice advise`` on recorded metrics: the resized shares and the freed GPUs, derived by hand.

The recorded hour (data/advise-range.json, Prometheus query_range format, 13 points a series)
and the cluster (data/advise-cluster.yaml): nodes l4-a and l4-b with two time-sliced L4s each
(23034 MiB, 4 replicas), node a100 with an A100-80GB in MIG mode. Running:

    pod       GPU        share         peak
    team-a/a  l4-a/0     10240 MiB     2000
    team-a/b  l4-a/0     10240 MiB     3000
    team-b/c  l4-b/0     10240 MiB     9000
    team-b/d  l4-b/0     10240 MiB     1500
    team-c/e  a100/0     3g.40gb       8000   (40960 MiB)
    team-x/ghost         8192 MiB       100   (in the metrics only)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from scheduler.cli import app
from scheduler.core.errors import UsageError
from scheduler.sim.advise import DEFAULT_POLICY, Options, advise
from scheduler.sim.errors import TraceError

DATA = Path(__file__).parent / "data"
RANGE = DATA / "advise-range.json"
SNAPSHOT = DATA / "advise-snapshot.prom"
CLUSTER = DATA / "advise-cluster.yaml"


def suggested(report: object) -> dict[str, str]:
    return {a.pod: a.suggested_profile or str(a.suggested_mib) for a in report.advice}  # type: ignore[attr-defined]


def test_the_resized_shares_and_the_freed_gpus() -> None:
    report = advise([RANGE], CLUSTER, Options())
    # far below: peak <= 50 percent of the share. 10240 x 0.5 = 5120: a (2000), b (3000), d (1500); not c (9000).
    # e: 40960 x 0.5 = 20480 >= 8000. ghost: 4096 >= 100.
    # suggested: peak x 1.2 rounded up to 1024 MiB:
    #   a 2400 -> 3072; b 3600 -> 4096; d 1800 -> 2048; ghost 120 -> 1024
    #   e 9600 -> the smallest A100-80GB profile with >= 9600 MiB: 1g.10gb (10240 MiB)
    assert suggested(report) == {
        "team-a/a": "3072",
        "team-a/b": "4096",
        "team-b/d": "2048",
        "team-c/e": "1g.10gb",
        "team-x/ghost": "1024",
    }
    assert report.shares == 6
    assert {a.pod: a.peak_mib for a in report.advice}["team-b/d"] == 1500
    packing = report.packing
    assert packing is not None
    # as they are (binpack, in file order): a + b = 20480 <= 23034 share one L4, c + d another (a third
    # 10240 would make 30720); e on the A100: 3 GPUs.
    # resized: 3072 + 4096 + 10240 + 2048 = 19456 <= 23034 and 4 replicas: one L4; e on the A100: 2 GPUs.
    assert (packing.gpus_now, packing.gpus_packed, packing.gpus_resized, packing.freed) == (3, 3, 2, 1)
    assert (packing.failed_packed, packing.failed_resized, packing.resized_pods) == (0, 0, 4)
    assert packing.not_in_cluster == ("team-x/ghost",)


def test_the_options_change_the_advice_as_documented() -> None:
    # threshold 25: 10240 x 0.25 = 2560: a (2000) and d (1500), not b (3000); e: 10240 >= 8000
    # headroom 0, granularity 512: a 2000 -> 2048, d 1500 -> 1536; e 8000 -> 1g.10gb
    report = advise([RANGE], None, Options(threshold_pct=25, headroom_pct=0, granularity_mib=512))
    assert suggested(report) == {"team-a/a": "2048", "team-b/d": "1536", "team-c/e": "1g.10gb", "team-x/ghost": "512"}
    assert report.packing is None


def test_several_files_give_the_peak_over_all_of_them() -> None:
    # the snapshot saw b at 4500 (above its recorded 3000): 4500 <= 5120 still, 4500 x 1.2 = 5400 -> 6144;
    # c at 3100 is below its recorded 9000: the peak stays 9000, no advice
    report = advise([RANGE, SNAPSHOT], CLUSTER, Options())
    assert suggested(report)["team-a/b"] == "6144"
    assert "team-b/c" not in suggested(report)
    # resized: 3072 + 6144 + 10240 + 2048 = 21504 <= 23034: still one L4
    assert report.packing is not None and report.packing.freed == 1


def test_a_snapshot_alone_with_the_cluster_for_the_allocations(tmp_path: Path) -> None:
    used_only = tmp_path / "used.prom"
    used_only.write_text("\n".join(x for x in SNAPSHOT.read_text().splitlines() if "allocated" not in x) + "\n")
    report = advise([used_only], CLUSTER, Options())
    # allocations from the records: b 10240, peak 4500 -> 6144; c 3100 <= 5120 -> 3720 -> 4096
    assert suggested(report) == {"team-a/b": "6144", "team-b/c": "4096"}
    assert report.packing is not None and report.packing.resized_pods == 2
    # without the cluster there is no allocation to compare with: said, not guessed
    alone = advise([used_only], None, Options())
    assert alone.advice == () and alone.unknown == ("team-a/b on GPU-l4-a-0", "team-b/c on GPU-l4-b-0")


def test_the_command_prints_the_table_and_json() -> None:
    runner = CliRunner()
    done = runner.invoke(app, ["advise", str(RANGE), "--cluster", str(CLUSTER)])
    assert done.exit_code == 0, done.output
    assert "team-c/e      a100  0    mig           40960          8000      1g.10gb" in done.output
    assert "3 GPUs as they are, 2 with 4 pods resized: freed 1 (GPUs in use now: 3)" in done.output
    done = runner.invoke(app, ["advise", str(RANGE), "--cluster", str(CLUSTER), "-o", "json"])
    body = json.loads(done.output)
    assert body["packing"]["freedGpus"] == 1 and len(body["advice"]) == 5
    assert body["advice"][0] == {
        "pod": "team-a/a",
        "uuid": "GPU-l4-a-0",
        "node": "l4-a",
        "gpu": "0",
        "mode": "time-slicing",
        "allocatedMiB": 10240,
        "peakMiB": 2000,
        "suggestedMiB": 3072,
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--threshold-pct", "0"], "--threshold-pct: 0; accepted: a percent in (0, 100]"),
        (["--threshold-pct", "150"], "--threshold-pct '150': accepted: a percent in (0, 100]"),
        (["--headroom-pct", "-5"], "--headroom-pct '-5': accepted: a percent in [0, 1000]"),
        (["--granularity-mib", "0"], "--granularity-mib '0': accepted: a whole number of MiB >= 1"),
        (["--policy", "best"], "--policy: 'best'; accepted: "),
        (["-o", "yaml"], "--output 'yaml': accepted: table, json"),
    ],
)
def test_a_bad_option_is_one_line(args: list[str], message: str) -> None:
    done = CliRunner().invoke(app, ["advise", str(RANGE), *args])
    assert done.exit_code == 2
    (line,) = done.output.strip().splitlines()
    assert line.startswith("gpuslice advise: ") and message in line


def write(tmp: Path, name: str, text: str) -> Path:
    path = tmp / name
    path.write_text(text)
    return path


SERIES = {"metric": {"__name__": "gpuslice_share_memory_used_mib", "namespace": "a", "pod": "p", "uuid": "GPU-1"}}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "m.txt: is not valid JSON"),
        (json.dumps({"status": "error", "error": "bad query"}), "is not a Prometheus API response"),
        (json.dumps({"status": "error", "data": {}, "error": "bad_data"}), "the query did not succeed: 'bad_data'"),
        (json.dumps({"status": "success", "data": {"resultType": "scalar"}}), "data.resultType: 'scalar'; accepted"),
        (
            json.dumps(
                {"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {}, "values": []}]}}
            ),
            "data.result[0]: has no __name__",
        ),
        (
            json.dumps(
                {"status": "success", "data": {"resultType": "matrix", "result": [{**SERIES, "values": [[1, "x"]]}]}}
            ),
            "data.result[0]: value 'x' is not a number",
        ),
        (
            json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [{**SERIES, "values": 5}]}}),
            "data.result[0]: values must be [time, value] pairs",
        ),
        ('gpuslice_share_memory_used_mib{namespace="a",uuid="GPU-1"} 5\n', "without the label 'pod'"),
        ("gpuslice_other 1\n", "has no gpuslice_share_memory_used_mib or gpuslice_share_memory_allocated_mib series"),
        ("this is { not metrics\n", "is neither a Prometheus API response (JSON) nor metrics text"),
    ],
)
def test_a_bad_metrics_file_is_named(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(TraceError) as caught:
        advise([write(tmp_path, "m.txt", text)], None, Options())
    assert message in str(caught.value) and str(caught.value).startswith("m.txt")


def test_missing_files_and_no_files_are_one_line(tmp_path: Path) -> None:
    runner = CliRunner()
    for args, message in (
        ([str(tmp_path / "none.json")], "none.json': no such file"),
        ([], "give at least one metrics file"),
        ([str(RANGE), "--cluster", str(tmp_path / "none.yaml")], "none.yaml': no such file"),
        (
            [str(RANGE), "--cluster", str(write(tmp_path, "s.yaml", "nodes: []\n"))],
            "s.yaml: is not a Kubernetes v1 List",
        ),
    ):
        done = runner.invoke(app, ["advise", *args])
        assert done.exit_code != 0 and "Traceback" not in done.output
        (line,) = done.output.strip().splitlines()
        assert line.startswith("gpuslice advise: ") and message in line, line
    binary = write(tmp_path, "b.bin", "")
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TraceError, match="is not UTF-8 text"):
        advise([binary], None, Options())
    with pytest.raises(UsageError):
        advise([RANGE], None, Options(granularity_mib=0))


def test_the_default_policy_is_the_extenders() -> None:
    from scheduler.extender.config import PolicyConfig

    assert PolicyConfig().name == DEFAULT_POLICY
