"""The documents hold: every command, flag, endpoint, annotation, setting and recorded figure
that README.md, docs/ and simulations/ quote is checked against the code (or the recorded CSV
files), so that they cannot drift apart again. test_commands.py runs the cheap commands."""

from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml

from scheduler.agent.config import DEFAULT_RESOURCE, DEFAULT_UNITS_RESOURCE
from scheduler.cli import app
from scheduler.cli.serving import service_mounts
from scheduler.core.quota import VERSION as QUOTA_VERSION  # gpuslice.io/v1alpha1: the GPUQuota API
from scheduler.core.request import OUTPUT_KEYS, REQUEST_KEYS, SELECTOR_KEYS
from scheduler.extender import config_errors
from scheduler.extender.app import create_app
from scheduler.extender.config import ENV_FIELDS, ENV_PREFIX, ServeConfig, load_config
from scheduler.extender.service import Extender
from scheduler.filebackend import FileBackend, example_path
from scheduler.sim import defragtable
from scheduler.sim.datasets import OPENB_ENV, OPENB_IN_CHECKOUT, RESULTS_ENV, RESULTS_IN_CHECKOUT
from scheduler.sim.report import rows_from_files
from tests.deploy.manifests import find
from tests.reliability.test_security import route_table

from .reading import DOCUMENTS, REPO, blocks, gpuslice_commands, name, prose, spans, table_after

GROUP = typer.main.get_command(app)
SIMULATIONS = REPO / "simulations"


def options(command: str) -> set[str]:
    found = {"--help"}
    for param in GROUP.commands[command].params:  # type: ignore[attr-defined]
        found.update(param.opts)
        found.update(param.secondary_opts)
    return found


# ------------------------------------------------------------ commands and flags


@pytest.mark.parametrize("path", DOCUMENTS, ids=name)
def test_every_quoted_command_and_flag_exists(path: Path) -> None:
    for words in gpuslice_commands(path):
        if not words or words[0].startswith("-"):
            assert set(words) <= {"--help", "--version"}, (name(path), words)
            continue
        command, *rest = words
        assert command in GROUP.commands, f"{name(path)}: no command gpuslice {command}"  # type: ignore[attr-defined]
        flags = {w.split("=", 1)[0] for w in rest if w.startswith("-") and not re.fullmatch(r"-\d.*", w)}
        assert flags <= options(command), f"{name(path)}: gpuslice {command} has no {flags - options(command)}"


def test_the_simulate_commands_read_where_the_fetch_commands_write() -> None:
    readme = REPO / "README.md"
    text = "\n".join(b.text for b in blocks(readme))
    assert f"sparse-checkout set {OPENB_IN_CHECKOUT.parent.name}" in text
    assert f"sparse-checkout set {RESULTS_IN_CHECKOUT.relative_to('data/fgd')}" in text
    for words in gpuslice_commands(readme) + gpuslice_commands(SIMULATIONS / "README.md"):
        for word in words:
            if word.startswith("data/"):
                assert word.startswith((str(OPENB_IN_CHECKOUT), str(RESULTS_IN_CHECKOUT))), word
    described = prose(readme)
    assert "alibaba/clusterdata" in described and "cluster-trace-gpu-v2023" in described
    assert "hkust-adsl/kubernetes-scheduler-simulator" in described and "data/csv" in described


# ------------------------------------------------------------ endpoints


def routes() -> list[re.Pattern[str]]:
    config = load_config(env={}, flags={"port": 0})
    served = create_app(Extender(config, FileBackend(example_path(), config.prefix)), service_mounts(config))
    return [re.compile(re.sub(r"\{[^}]+\}", "[^/]+", path) + "$") for _, path in route_table(served.routes)]


ENDPOINT = re.compile(r"\b(?:GET|POST) (?:\{urlPrefix\})?(/[\w/{}.-]*)|127\.0\.0\.1:8686(/[\w/{}.-]*)")
# First path segments of the files and folders the documents quote (and of the url_prefix example)
NOT_ROUTES = {"etc", "tmp", "dev", "opt", "proc", "var", "run", "models", "workspace", "gpuslice"}


@pytest.mark.parametrize("path", DOCUMENTS, ids=name)
def test_every_quoted_endpoint_is_served(path: Path) -> None:
    served = routes()
    families = {r.pattern.rsplit("/", 1)[0] for r in served}  # "/debug" for /debug/nodes
    text = path.read_text(encoding="utf-8")
    quoted = {m.group(1) or m.group(2) for m in ENDPOINT.finditer(text)}
    quoted |= {s.split()[0] for s in spans(path) if re.fullmatch(r"/[a-z][\w/{}-]*(, /[\w/{}-]+)*", s)}
    quoted |= {p.strip() for s in spans(path) if "," in s and s.startswith("/") for p in s.split(",")}
    for endpoint in sorted(q for q in quoted if q and q.split("/")[1] not in NOT_ROUTES):
        ok = any(r.match(endpoint) for r in served) or endpoint in families
        assert ok, f"{name(path)}: {endpoint} is not served"


# ------------------------------------------------------------ annotations


def gpuslice_names() -> set[str]:
    """The ``gpuslice.io/`` names the code reads or writes: the request and output annotations,
    the namespace label the webhooks select by, the node agent's extended resources."""
    webhook = find("MutatingWebhookConfiguration", "gpuslice")["webhooks"][0]["namespaceSelector"]
    labels = {e["key"].removeprefix("gpuslice.io/") for e in webhook["matchExpressions"]}
    resources = {r.removeprefix("gpuslice.io/") for r in (DEFAULT_RESOURCE, DEFAULT_UNITS_RESOURCE)}
    names = set(REQUEST_KEYS) | set(SELECTOR_KEYS) | set(OUTPUT_KEYS) | labels | resources | {QUOTA_VERSION}
    for source in (REPO / "scheduler").rglob("*.py"):  # and every prefix + "name" the code reads or writes
        names |= set(re.findall(r"prefix \+ \"([a-z][a-z0-9-]*)\"", source.read_text(encoding="utf-8")))
    return names


@pytest.mark.parametrize("path", DOCUMENTS, ids=name)
def test_every_quoted_annotation_is_one_gpuslice_reads_or_writes(path: Path) -> None:
    known = gpuslice_names()
    text = path.read_text(encoding="utf-8")
    for key in set(re.findall(r"gpuslice\.io/([a-z][a-z0-9-]*)", text)):
        assert key in known, f"{name(path)}: gpuslice.io/{key} is neither read nor written by gpuslice"


def test_the_readme_request_table_names_the_parser_keys() -> None:
    table = table_after(REPO / "README.md", "annotation | meaning")
    quoted = {k for row in table[1:] for k in re.findall(r"`([a-z-]+): ", row[0])}
    assert quoted == set(REQUEST_KEYS) | set(SELECTOR_KEYS)


# ------------------------------------------------------------ settings


def test_the_configuration_table_matches_the_settings_flags_and_environment() -> None:
    table = table_after(REPO / "docs" / "serving.md", "setting | flag | environment | default")
    documented: set[str] = set()
    for setting, flag, env, _ in table[1:]:
        for key in re.findall(r"`([\w.]+)`", setting):
            _, info = config_errors.section(ServeConfig, tuple(key.split(".")))
            assert info is not None, f"docs/serving.md: no setting {key}"
            documented.add(key)
        for option in re.findall(r"`(--[\w-]+)`", flag):
            assert option in options("serve"), f"docs/serving.md: gpuslice serve has no {option}"
        for variable in re.findall(r"`(GPUSLICE_\w+)`", env):
            assert variable.removeprefix(ENV_PREFIX) in ENV_FIELDS, f"docs/serving.md: {variable} is not read"
    top = {key.split(".")[0] for key in documented}
    assert top == set(ServeConfig.model_fields), f"undocumented settings: {set(ServeConfig.model_fields) - top}"
    assert {f for f in ENV_FIELDS.values()} <= {k.split(".")[0] for k in documented}


@pytest.mark.parametrize("path", DOCUMENTS, ids=name)
def test_every_environment_variable_quoted_is_read(path: Path) -> None:
    read = {ENV_PREFIX + k for k in ENV_FIELDS} | {OPENB_ENV, RESULTS_ENV}
    # and those the code names itself (the webhook's, what the node agent sets in a container)
    for source in (REPO / "scheduler").rglob("*.py"):
        read |= set(re.findall(r"\"(GPUSLICE_[A-Z_]+)\"", source.read_text(encoding="utf-8")))
    # and those the scripts read (scripts/test.sh's GPUSLICE_E2E_REQUIRED, ...)
    for script in (REPO / "scripts").glob("*.sh"):
        read |= set(re.findall(r"\$\{?(GPUSLICE_[A-Z0-9_]+)", script.read_text(encoding="utf-8")))
    for variable in set(re.findall(r"GPUSLICE_[A-Z0-9_]+", path.read_text(encoding="utf-8"))):
        assert variable in read, f"{name(path)}: {variable} is not read by gpuslice"


def service_settings(path: Path) -> list[dict[str, Any]]:
    """The YAML blocks of a document that are gpuslice serve settings (their keys are settings)."""
    found = []
    for block in blocks(path):
        if block.language not in ("yaml", "yml"):
            continue
        doc = yaml.safe_load(block.text)
        if isinstance(doc, dict) and doc and set(doc) <= set(ServeConfig.model_fields):
            found.append(doc)
    return found


def test_the_settings_files_quoted_are_accepted(tmp_path: Path) -> None:
    quoted = [doc for path in DOCUMENTS for doc in service_settings(path)]
    assert len(quoted) >= 2  # the fgd workload and the trusted networks of docs/serving.md
    for i, doc in enumerate(quoted):
        file = tmp_path / f"{i}.yaml"
        file.write_text(yaml.safe_dump(doc))
        load_config(file, {})


def test_the_kube_scheduler_entry_quoted_is_the_deployed_one() -> None:
    deployed = yaml.safe_load(find("ConfigMap", "gpuslice-config")["data"]["scheduler-config.yaml"])
    quoted = [
        yaml.safe_load(b.text)
        for b in blocks(REPO / "docs" / "serving.md")
        if b.language == "yaml" and "extenders:" in b.text
    ]
    assert quoted == [{"extenders": deployed["extenders"]}]


# ------------------------------------------------------------ recorded figures


def summary(folder: str) -> dict[str, dict[str, object]]:
    """Per policy, the figures of a recorded run (mean ± sd over seeds, as the documents print them)."""
    path = SIMULATIONS / folder
    out = {}
    for row in rows_from_files(path / "summary.csv", path / "bound.csv"):
        out[str(row["policy"])] = {
            "unallocated": f"{row['unallocated_mean']:.2f} ± {row['unallocated_sd']:.2f}",
            "mean": f"{row['unallocated_mean']:.2f}",
            "frag": f"{row['frag_rate']:.2f}",
            "failed": f"{row['failed']:.0f}",
            "bound": f"{row['bound_unallocated']:.2f}",
        }
    return out


def bound_mean(folder: str) -> str:
    import csv

    with (SIMULATIONS / folder / "bound.csv").open() as handle:
        values = [float(r["bound_unallocated_gpu_pct"]) for r in csv.DictReader(handle)]
    return f"{statistics.fmean(values):.2f}"


PAPER_ORDER = ("random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd")


def plain(cell: str) -> str:
    return cell.replace("*", "").strip()


def test_the_readme_figures_are_the_recorded_ones() -> None:
    readme = REPO / "README.md"
    table = table_after(readme, " | Random | DotProd | Clustering | Packing | BestFit | FGD")
    ours = next(row for row in table if row[0] == "gpuslice")
    recorded = summary("openb/default")
    assert ours[1:] == [recorded[p]["mean"] for p in PAPER_ORDER]
    text = prose(readme)
    fgd_cpu = summary("fgd-cpu/default")["fgd-cpu"]["unallocated"]
    assert f"`fgd-cpu` leaves {fgd_cpu.replace(' ± ', '% ± ')} unallocated on the default trace" in text
    assert f"The LP bound for the same arrivals is {bound_mean('fgd-cpu/default')}%" in " ".join(text.split())
    assert f"FGD port's {recorded['fgd']['mean']}%" in text


def test_the_simulation_tables_are_the_recorded_ones() -> None:
    doc = SIMULATIONS / "README.md"
    table = table_after(doc, "policy | ours | paper")
    recorded = summary("openb/default")
    for row, policy in zip(table[1:], PAPER_ORDER, strict=True):
        figures = recorded[policy]
        assert [plain(row[1]), row[4], row[5], row[6]] == [
            figures["unallocated"],
            figures["frag"],
            figures["failed"],
            figures["bound"],
        ], row
    for row in table_after(doc, "trace | Random | DotProd")[1:]:
        recorded = summary(f"openb/{row[0]}")
        assert [cell.split(" / ")[0] for cell in row[1:]] == [recorded[p]["mean"] for p in PAPER_ORDER], row
    for path in (doc, SIMULATIONS / "fgd-cpu" / "README.md"):
        for row in table_after(path, "trace | fgd-cpu | fgd (ours)")[1:]:
            recorded = summary(f"fgd-cpu/{row[0]}")
            cells = [plain(row[1]), plain(row[2]), row[5]]
            assert cells == [
                recorded["fgd-cpu"]["unallocated"],
                recorded["fgd"]["unallocated"],
                bound_mean(f"fgd-cpu/{row[0]}"),
            ], row


def test_the_scenario_tables_are_the_recorded_ones() -> None:
    doc = SIMULATIONS / "README.md"
    recorded = summary("scenarios/h100-mig-fractions")
    table = table_after(doc, "policy | unallocated % | frag rate % | failed pods")
    for row in table[1:]:
        if plain(row[0]) == "LP bound":
            assert plain(row[1]) == bound_mean("scenarios/h100-mig-fractions")
            continue
        figures = recorded[plain(row[0])]
        assert [plain(row[1]), row[2], row[3]] == [figures["unallocated"], figures["frag"], figures["failed"]], row
    recorded = summary("scenarios/inference-mps-timeslicing")
    for row in table_after(doc, "policy | failed pods | frag rate % | unallocated %")[1:]:
        figures = recorded[plain(row[0])]
        assert [plain(row[1]), plain(row[2]), plain(row[3])] == [
            figures["failed"],
            figures["frag"],
            figures["unallocated"],
        ], row
    fgd_cpu = SIMULATIONS / "fgd-cpu" / "README.md"
    rows = {row[0]: row for row in table_after(fgd_cpu, "scenario | fgd-cpu | fgd | binpack")[1:]}
    for scenario in ("h100-mig-fractions", "inference-mps-timeslicing"):
        recorded = summary(f"fgd-cpu/scenarios/{scenario}")
        unallocated = next(r for k, r in rows.items() if k.startswith(f"{scenario}: unallocated"))
        failed = next(r for k, r in rows.items() if k.startswith(f"{scenario}: pods turned away"))
        assert [plain(c) for c in unallocated[1:]] == [
            recorded[p]["unallocated"] for p in ("fgd-cpu", "fgd", "binpack")
        ]
        assert [plain(c) for c in failed[1:]] == [recorded[p]["failed"] for p in ("fgd-cpu", "fgd", "binpack")]


def defrag_summary() -> dict[tuple[str, str, str], dict[str, object]]:
    recorded = [row for path in sorted((SIMULATIONS / "defrag").glob("*.csv")) for row in defragtable.read(path)]
    return {(str(r["trace"]), str(r["policy"]), str(r["arm"])): r for r in defragtable.summary(recorded)}


def test_the_defragmentation_table_is_the_recorded_one() -> None:
    table = defragtable.markdown(list(defrag_summary().values()))
    assert table in (SIMULATIONS / "README.md").read_text(encoding="utf-8")


def test_the_readme_defragmentation_figures_are_the_recorded_ones() -> None:
    """The README's sentence on the planner (4 evictions a run against waiting alone) from the recorded runs."""
    rows = defrag_summary()
    scenarios = ("h100-mig-departures", "inference-mps-ts")

    def fewer(trace: str, policy: str) -> str:
        waited = float(str(rows[(trace, policy, "wait")]["turned_away"]))
        planned = float(str(rows[(trace, policy, "4")]["turned_away"]))
        return f"{100 * (waited - planned) / waited:.0f}%"

    def figure(trace: str, policy: str, key: str) -> float:
        return float(str(rows[(trace, policy, "4")][key]))

    more = [
        100 * (figure(t, p, "gpu_hours") / float(str(rows[(t, p, "wait")]["gpu_hours"])) - 1)
        for t in scenarios
        for p in ("binpack", "fgd")
    ]
    spent = [figure(t, p, "evictions") for t in scenarios for p in ("binpack", "fgd")]
    mig, mps = scenarios
    expected = (
        f"the planner turns away {fewer(mig, 'binpack')} (MIG) and {fewer(mps, 'binpack')} (MPS/time-slicing) "
        f"fewer pods than waiting alone under binpack, {fewer(mig, 'fgd')} and {fewer(mps, 'fgd')} under FGD, and "
        f"allocates {min(more):.0f}-{max(more):.0f}% more GPU-hours, for {min(spent):.0f} to {max(spent):.0f} "
        "evictions per 2,000 pods"
    )
    assert expected in " ".join(prose(REPO / "README.md").split())


def test_the_paper_grid_readme_is_its_report() -> None:
    doc = SIMULATIONS / "paper-grid" / "README.md"
    grid = SIMULATIONS / "paper-grid" / "summary.csv"
    rows = {str(r["policy"]): r for r in rows_from_files(grid) if r["trace"] == "default"}
    table = table_after(doc, "policy | this grid | simulations/openb | paper")
    for row in table[1:]:
        found = rows[row[0]]
        assert row[1] == f"{found['unallocated_mean']:.2f} ± {found['unallocated_sd']:.2f}", row
    with grid.open(encoding="utf-8") as handle:
        runs = sum(1 for _ in handle) - 1
    assert f"**Complete: all {runs:,} runs are stored, none failed**" in prose(doc)


def test_the_fgd_reserve_tables_are_the_recorded_ones() -> None:
    """simulations/fgd-reserve/table.py prints its tables from the recorded runs; the document shows them."""
    import contextlib
    import importlib.util
    import io

    spec = importlib.util.spec_from_file_location("fgd_reserve_table", SIMULATIONS / "fgd-reserve" / "table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        module.main()
    text = (SIMULATIONS / "README.md").read_text(encoding="utf-8")
    for table in printed.getvalue().strip().split("\n\n"):
        assert table in text


def test_the_variants_sweep_runs_every_recorded_variant() -> None:
    made = re.findall(r'VariantSpec\("([^"]+)"', (SIMULATIONS / "variants" / "make.py").read_text(encoding="utf-8"))
    inputs = []
    for sweep_file in ("variants.yaml", "variants-s5.yaml"):  # generator seeds 1-4, then seed 5 (made later)
        sweep = yaml.safe_load((SIMULATIONS / "fgd-reserve" / sweep_file).read_text(encoding="utf-8"))
        assert sweep["policies"] == ["fgd-reserve", "fgd", "bestfit"] and sweep["seeds"] == "42-51"
        inputs += sweep["inputs"]
    assert inputs == [f"openb_pod_list_{n}.csv" for n in made]


def test_the_ablation_table_is_the_recorded_one() -> None:
    """simulations/fgd-reserve/ablation.py prints the rules' table from ablation.csv; ablation.md shows it."""
    import contextlib
    import importlib.util
    import io
    import sys

    spec = importlib.util.spec_from_file_location("ablation", SIMULATIONS / "fgd-reserve" / "ablation.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        module.table()
    assert printed.getvalue().strip() in (SIMULATIONS / "fgd-reserve" / "ablation.md").read_text(encoding="utf-8")
