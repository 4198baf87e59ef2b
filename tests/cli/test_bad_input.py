"""Every option of every command: a bad value is refused before any work starts, with one line
on stderr (``gpuslice <command>: <option> <value>: accepted: ...``) and exit status 2 (1 for a
service that cannot be reached), never a traceback.

The tables below name every option that takes a value; a test checks that a new option gets a
row, so that no option goes unchecked.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from scheduler.cli import app

runner = CliRunner()
HERE = Path(__file__).resolve().parent
POLICIES = "bestfit, binpack, dotprod, fgd, fgd-cpu, fgd-reserve, gpuclustering, gpupacking, random, spread"
HOSTNAME = "/etc/hostname"  # a file every Linux machine has: readable, and not a PEM, not a folder
NUMBER = "a whole number from 0 to 65535"
INFLATE = "0 (as given) or a ratio up to 10, such as 1.3"
COMPRESS = "a factor from 0.01 to 1000 (1: times as recorded), such as 4"
SEEDS = "a seed (42), a list (42,43) or a range (42-51), at most 1000 seeds"
ARMS = "off (the plain replay), wait (budget 0: pods wait for the planner, no move) or a number of evictions"
EVERY = "minutes of simulated time from 0.1 to 525600, such as 10"
URL = "a URL such as http://127.0.0.1:8686 (http or https, a host, an optional port)"

SERVE = [
    (["--port", "abc"], f"--port 'abc': accepted: {NUMBER}"),
    (["--port", "70000"], f"--port '70000': accepted: {NUMBER}"),
    (["--port", "-1"], f"--port '-1': accepted: {NUMBER}"),
    (["--max-body-bytes", "1k"], "--max-body-bytes '1k': accepted: a whole number from 1024 to 1073741824"),
    (["--mps-compute-oversub-pct", "50"], "--mps-compute-oversub-pct '50': accepted: a whole number from 100 to 1000"),
    (["--ts-memory-oversub-pct", "nan"], "--ts-memory-oversub-pct 'nan': accepted: a whole number from 100 to 1000"),
    (["--log-level", "loud"], "--log-level 'loud': accepted: debug, info, warning or error"),
    (["--log-format", "xml"], "--log-format 'xml': accepted: text or json"),
    (["--policy", "tetris"], f"--policy: unknown policy 'tetris'; accepted: {POLICIES}"),
    (["--prefix", "Bad"], "--prefix: must be a DNS subdomain followed by '/', such as gpuslice.io/, got 'Bad'"),
    (["--url-prefix", "x y"], "--url-prefix: must be empty or a path such as /gpuslice, got 'x y'"),
    (
        ["--host", "no such host!"],
        "--host: 'no such host!' is not an address to listen on; accepted: an IP address such as 127.0.0.1, "
        "0.0.0.0 or ::, or a host name",
    ),
    (["--tls-cert", "/nonexistent.pem", "--tls-key", HOSTNAME], "--tls-cert: no such file: /nonexistent.pem"),
    (["--tls-key", "/nonexistent.key", "--tls-cert", HOSTNAME], "--tls-key: no such file: /nonexistent.key"),
    (["--tls-cert", HOSTNAME], "tls_cert and tls_key (--tls-cert, --tls-key) go together: give both or neither"),
    (["--cluster-file", "/nonexistent.yaml"], "--cluster-file '/nonexistent.yaml': no such file"),
    (["--config", "/nonexistent.yaml"], "--config '/nonexistent.yaml': no such file"),
    (["--kubeconfig", "/nonexistent"], "--kubeconfig '/nonexistent': no such file"),
    (
        ["--kubeconfig", HOSTNAME, "--cluster-file", "example"],
        "--kubeconfig with --cluster-file: a cluster file needs no cluster; give one of them",
    ),
    (["--demo"], "--demo needs --cluster-file (try --cluster-file example)"),
    (["--demo-exit"], "--demo needs --cluster-file (try --cluster-file example)"),
]
INSPECT = [
    (["--url", "notaurl"], f"--url 'notaurl': accepted: {URL}"),
    (["--url", "ftp://host"], f"--url 'ftp://host': accepted: {URL}"),
    (["--url", "http://127.0.0.1:99999"], f"--url 'http://127.0.0.1:99999': accepted: {URL}"),
    (["--url", "http://127.0.0.1:8686/debug"], f"--url 'http://127.0.0.1:8686/debug': accepted: {URL}, without a path"),
    (["-o", "xml"], "--output 'xml': accepted: table, wide, json, yaml"),
    (["--output", "box"], "--output 'box': accepted: table, wide, json, yaml"),
]
SIMULATE = [
    (["--inflate", "inf"], f"--inflate 'inf': accepted: {INFLATE}"),
    (["--inflate", "nan"], f"--inflate 'nan': accepted: {INFLATE}"),
    (["--inflate", "-1"], f"--inflate '-1': accepted: {INFLATE}"),
    (["--inflate", "11"], f"--inflate '11': accepted: {INFLATE}"),
    (["--inflate", "x"], f"--inflate 'x': accepted: {INFLATE}"),
    (["--compress", "0"], f"--compress '0': accepted: {COMPRESS}"),
    (["--compress", "inf"], f"--compress 'inf': accepted: {COMPRESS}"),
    (["--compress", "fast"], f"--compress 'fast': accepted: {COMPRESS}"),
    (["--workers", "0"], "--workers '0': accepted: 1 or more"),
    (["--workers", "two"], "--workers 'two': accepted: 1 or more"),
    (["--seeds", ""], f"--seeds '': accepted: {SEEDS}"),
    (["--seeds", "1-100000"], f"--seeds '1-100000': accepted: {SEEDS}"),
    (["--seeds", "5-1"], f"--seeds '5-1': accepted: {SEEDS}"),
    (["--policy", ""], f"--policy '': accepted: one or more of {POLICIES}"),
    (["-p", "tetris"], f"--policy 'tetris': accepted: {POLICIES}"),
    (["--replay", "backwards"], "--replay 'backwards': accepted: arrivals, timed"),
    (["--out", HOSTNAME], f"--out '{HOSTNAME}': exists and is not a folder"),
    (["--out", "/proc/gpuslice"], "--out '/proc/gpuslice': cannot write there: No such file or directory"),
    (["--reference", "/nonexistent"], "--reference '/nonexistent': no such folder"),
    (["--nodes", "/nonexistent.csv", HOSTNAME], "--nodes '/nonexistent.csv': no such file"),
    (["/nonexistent.csv"], "input '/nonexistent.csv': no such file"),
    (
        ["--bound", "--replay", "timed"],
        "--bound with --replay timed: the LP bound covers arrivals only; drop one of them",
    ),
    (["--defrag-budget", "some"], f"--defrag-budget 'some': accepted: a comma-separated list of {ARMS}"),
    (["--defrag-budget", "4,-1"], f"--defrag-budget '4,-1': accepted: a comma-separated list of {ARMS}"),
    (["--defrag-budget", "4", "--defrag-every", "0"], f"--defrag-every '0': accepted: {EVERY}"),
    (["--defrag-budget", "4", "--defrag-every", "nan"], f"--defrag-every 'nan': accepted: {EVERY}"),
    (
        ["--defrag-budget", "4", "--defrag-min-fall", "-1"],
        "--defrag-min-fall '-1': accepted: milli-GPU, 0 or more, such as 500",
    ),
    (["--defrag-every", "5"], "--defrag-every needs --defrag-budget (the arms to run, such as off,wait,4)"),
    (["--defrag-min-fall", "5"], "--defrag-min-fall needs --defrag-budget (the arms to run, such as off,wait,4)"),
    (
        ["--defrag-budget", "4", "--replay", "arrivals"],
        "--defrag-budget with --replay arrivals: the planner needs simulated time; give --replay timed",
    ),
    (
        ["--defrag-budget", "4", "--reference", "/"],
        "--reference with --defrag-budget: the defragmentation table has no paper curves; drop one",
    ),
    (
        ["--defrag-budget", "4"],
        "--defrag-budget needs simulated time: small-mixed replays arrivals; give --replay timed",
    ),
]
BOUND = [
    (["--at", "0"], "--at '0': accepted: a whole percent from 1 to 1000 (arrivals reach 100 x the inflation)"),
    (["--at", "abc"], "--at 'abc': accepted: a whole percent from 1 to 1000 (arrivals reach 100 x the inflation)"),
    (["--inflate", "inf"], f"--inflate 'inf': accepted: {INFLATE}"),
    (["--seeds", "x"], f"--seeds 'x': accepted: {SEEDS}"),
    (["--out", "/proc/gpuslice"], "--out '/proc/gpuslice': cannot write there: No such file or directory"),
    (["--nodes", "/x.csv", HOSTNAME], "--nodes '/x.csv': no such file"),
    (["/nonexistent.yaml"], "input '/nonexistent.yaml': no such file"),
]
DEMO = [
    (["--policy", "tetris"], f"--policy: unknown policy 'tetris'; accepted: {POLICIES}"),
]
NO_FILE = "[Errno 2] No such file or directory"
AGENT = [
    (["--config", "/nonexistent.yaml"], f"agent config /nonexistent.yaml: cannot read: {NO_FILE}: '/nonexistent.yaml'"),
    (["--node", "Bad_Name!"], "--node 'Bad_Name!': accepted: a node name (lower-case letters, digits, '-' and '.')"),
    (
        ["--node", "n", "--fake-gpus", "/nonexistent.yaml", "--dry-run"],
        f"fake GPUs /nonexistent.yaml: cannot read: {NO_FILE}: '/nonexistent.yaml'",
    ),
    (
        ["--node", "n", "--api-url", "notaurl", "--fake-gpus", "example"],
        "API server URL 'notaurl' must start with http:// or https://",
    ),
    (
        ["--node", "n", "--kubeconfig", "/nonexistent", "--fake-gpus", "example"],
        "cannot load /nonexistent: Invalid kube-config file. No configuration found.",
    ),
]
ADVISE = [
    (["--threshold-pct", "abc"], "--threshold-pct 'abc': accepted: a percent in (0, 100]"),
    (["--threshold-pct", "inf"], "--threshold-pct 'inf': accepted: a percent in (0, 100]"),
    (["--threshold-pct", "0", HOSTNAME], "--threshold-pct: 0; accepted: a percent in (0, 100]"),
    (["--headroom-pct", "-1"], "--headroom-pct '-1': accepted: a percent in [0, 1000]"),
    (["--granularity-mib", "0"], "--granularity-mib '0': accepted: a whole number of MiB >= 1"),
    (["--policy", "tetris", HOSTNAME], f"--policy: 'tetris'; accepted: {POLICIES}"),
    (["-o", "xml"], "--output 'xml': accepted: table, json"),
    (["/nonexistent.json"], "input '/nonexistent.json': no such file"),
    (["--cluster", "/nonexistent.yaml", HOSTNAME], "--cluster '/nonexistent.yaml': no such file"),
]
SWEEP = [
    (["/nonexistent.yaml"], "input '/nonexistent.yaml': no such file"),
    (
        [HOSTNAME, "--executor", "bogus"],
        "--executor 'bogus': accepted: local, local:N, dask-local:N or dask://HOST:PORT",
    ),
    ([HOSTNAME, "--executor", "local:0"], "--executor 'local:0': the number of workers must be 1 or more"),
    ([HOSTNAME, "--out", HOSTNAME], f"--out '{HOSTNAME}': exists and is not a folder"),
    ([HOSTNAME, "--data", "/nonexistent"], "--data '/nonexistent': no such folder"),
    ([HOSTNAME, "--reference", "/nonexistent"], "--reference '/nonexistent': no such folder"),
]
NAMESPACE = "a namespace name (lower-case letters, digits and '-')"
DEFRAG = [
    (["--cluster-file", "/nonexistent.yaml"], "--cluster-file '/nonexistent.yaml': no such file"),
    (["--config", "/nonexistent.yaml"], "--config '/nonexistent.yaml': no such file"),
    (["--kubeconfig", "/nonexistent"], "--kubeconfig '/nonexistent': no such file"),
    (
        ["--kubeconfig", HOSTNAME, "--cluster-file", "example"],
        "--kubeconfig with --cluster-file: a cluster file needs no cluster; give one of them",
    ),
    (
        ["--api-url", "http://127.0.0.1:9", "--cluster-file", "example"],
        "--api-url with --cluster-file: a cluster file needs no cluster; give one of them",
    ),
    (
        ["--api-url", "http://127.0.0.1:9", "--kubeconfig", HOSTNAME],
        "--kubeconfig with --api-url: both name the cluster; give one of them",
    ),
    (["--api-url", "notaurl"], "API server URL 'notaurl' must start with http:// or https://"),
    (["--namespace", "Bad_NS"], f"--namespace 'Bad_NS': accepted: {NAMESPACE}"),
    (["--max-evictions", "abc"], "--max-evictions 'abc': accepted: a whole number from 0 to 1000"),
    (["--max-evictions", "1001"], "--max-evictions '1001': accepted: a whole number from 0 to 1000"),
    (["--policy", "tetris", "--cluster-file", "example"], f"--policy: unknown policy 'tetris'; accepted: {POLICIES}"),
    (
        ["--apply", "--cluster-file", "example"],
        "--apply evicts pods of the live cluster; --cluster-file is a snapshot: give one or the other",
    ),
]
REPORT = [
    (["/nonexistent"], "input '/nonexistent': no such folder"),
    (["/", "--reference", "/nonexistent"], "--reference '/nonexistent': no such folder"),
]
TABLES = {
    "sweep": SWEEP,
    "report": REPORT,
    "serve": SERVE,
    "inspect": INSPECT,
    "simulate": SIMULATE,
    "bound": BOUND,
    "demo": DEMO,
    "agent": AGENT,
    "advise": ADVISE,
    "defrag": DEFRAG,
}
CASES = [(command, args, message) for command, table in TABLES.items() for args, message in table]


@pytest.mark.parametrize(("command", "args", "message"), CASES, ids=[f"{c} {' '.join(a)}" for c, a, _ in CASES])
def test_a_bad_value_is_one_line_and_exit_2(command: str, args: list[str], message: str, restore_logging: None) -> None:
    result = runner.invoke(app, [command, *args])
    assert (result.exit_code, result.stderr) == (2, f"gpuslice {command}: {message}\n")
    assert result.stdout == ""  # nothing started: no table, no log


def test_a_service_that_cannot_be_reached_is_one_line_and_exit_1() -> None:
    result = runner.invoke(app, ["inspect", "--url", "http://127.0.0.1:9"])
    assert result.exit_code == 1
    assert result.stderr.startswith("gpuslice inspect: cannot reach gpuslice at http://127.0.0.1:9: ")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_a_cluster_that_cannot_be_reached_is_one_line_and_exit_1() -> None:
    result = runner.invoke(app, ["defrag", "--api-url", "http://127.0.0.1:9"])
    assert result.exit_code == 1
    assert result.stderr.startswith("gpuslice defrag: cannot reach the cluster: list configmaps: ")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr and result.stdout == ""


def test_every_option_that_takes_a_value_has_a_row() -> None:
    group = typer.main.get_command(app)
    assert set(group.commands) == set(TABLES)  # type: ignore[attr-defined]
    for name, table in TABLES.items():
        command = group.commands[name]  # type: ignore[attr-defined]
        options = {p.opts[0] for p in command.params if p.param_type_name == "option" and not p.is_flag}
        covered = {arg for args, _ in table for arg in args if arg.startswith("-")}
        long = {"-o": "--output", "-p": "--policy"}
        assert options <= {long.get(a, a) for a in covered}, f"{name}: no row for {options - covered}"


def test_an_unknown_option_says_so_without_a_box_or_a_traceback() -> None:
    result = runner.invoke(app, ["serve", "--prot", "8686"])
    assert result.exit_code == 2
    assert "No such option: --prot" in result.stderr
    assert "Traceback" not in result.output and "╭" not in result.output


def test_a_port_in_use_is_one_line_before_anything_starts(restore_logging: None) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = runner.invoke(app, ["serve", "--cluster-file", "example", "--port", str(port), "--log-level", "error"])
    assert result.exit_code == 2
    assert result.stderr == (
        f"gpuslice serve: cannot listen on 127.0.0.1:{port}: Address already in use; accepted: a free port "
        "(--port), 0 for any\n"
    )
