"""A sweep description (``gpuslice sweep FILE.yaml``) and its plan: one run per
(input, policy with options, seed, inflation, replay mode), each with a stable id.

The file::

    name: fgd-paper                 # optional, shown in the progress
    data: .                         # folder the inputs (and the reference) are relative to;
                                    # relative to this file; --data DIR overrides it
    out: .                          # the results folder, relative to this file; --out overrides it
    inputs:                         # openb pod lists (.csv), scenarios or Kubernetes Lists
      - openb/openb_pod_list_default.csv
      - {path: my-cluster.csv, nodes: my-nodes.csv}
    policies:                       # names, or a name with options and a label for the tables
      - fgd
      - {name: fgd-cpu, label: fgd-cpu-w50, options: {balance_weight: 50}}
    seeds: 42-51                    # 42, [42, 43] or "42-51"
    inflate: 1.3                    # optional, one value or a list (then an axis of the grid)
    replay: arrivals                # optional, one mode or a list
    shuffle: true                   # optional
    reference: fgd_expected_results # optional: the paper's curves, relative to data

A run's id is the first 16 hex digits of the SHA-256 of the canonical JSON of: the SHA-256 of
the input's bytes (for an openb pod list, of its node list's bytes too), the policy's name, its
options, the seed, and the inflation, replay mode and shuffle as the description gives them
(unset: the input's own, which its content fixes). Content, not path or mtime: the same trace
under another folder, on another machine or after a copy is the same run, and an edited trace
is a new one even if its time stamp was kept. The label is not part of the id: renaming one
relabels the stored runs instead of running them again. Neither is the gpuslice version: a run
records the version that made it (a store made by an older simulator should be started afresh).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from scheduler.core.errors import ConfigError, GpusliceError
from scheduler.core.policies import REGISTRY, make_policy

from .model import REPLAY_MODES
from .openb import default_node_list

ID_FORMAT = 1  # bump when what enters the id changes
KEYS = ("name", "data", "out", "inputs", "policies", "seeds", "inflate", "replay", "shuffle", "reference")


class SweepError(GpusliceError, ValueError):
    """A sweep description is wrong: the message names the file, the field and what is accepted."""


@dataclass(frozen=True)
class Input:
    """One input file; ``nodes`` is the node list of an openb pod list (None: the one beside it)."""

    path: Path
    nodes: Path | None = None

    @property
    def node_list(self) -> Path | None:
        if self.path.suffix.lower() != ".csv":
            return None
        return self.nodes or default_node_list(self.path)

    def content_hash(self) -> str:
        """SHA-256 of the input's bytes (and of its node list's); OSError if one cannot be read."""
        digest = hashlib.sha256(self.path.read_bytes())
        node_list = self.node_list
        if node_list is not None and node_list.exists():
            digest.update(b"\0nodes\0")
            digest.update(node_list.read_bytes())
        return digest.hexdigest()

    @property
    def trace_name(self) -> str:
        """The name a trace of this file gets before it is read (openb: the stem less its prefix)."""
        return self.path.stem.removeprefix("openb_pod_list_")


@dataclass(frozen=True)
class PolicyChoice:
    name: str
    label: str
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Sweep:
    name: str
    source: Path
    data: Path
    out: Path | None
    inputs: tuple[Input, ...]
    policies: tuple[PolicyChoice, ...]
    seeds: tuple[int, ...]
    inflate: tuple[float | None, ...] = (None,)
    replay: tuple[str | None, ...] = (None,)
    shuffle: bool | None = None
    reference: Path | None = None


@dataclass(frozen=True)
class PlannedRun:
    """One run of a sweep: what to run, under which labels, and its id."""

    run_id: str
    input_index: int
    trace: str  # the label of the trace in the tables (its name, plus the axes that vary)
    policy: PolicyChoice
    seed: int
    inflate: float | None
    replay: str | None
    shuffle: bool | None

    @property
    def label(self) -> str:
        return f"{self.trace} {self.policy.label} seed {self.seed}"


def run_id(
    input_hash: str,
    policy: PolicyChoice,
    seed: int,
    inflate: float | None,
    replay: str | None,
    shuffle: bool | None,
) -> str:
    """The stable id of a run (see the module docstring for what enters it)."""
    key = {
        "format": ID_FORMAT,
        "input": input_hash,
        "policy": policy.name,
        "options": dict(policy.options),
        "seed": seed,
        "inflate": inflate,
        "replay": replay,
        "shuffle": shuffle,
    }
    text = json.dumps(key, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def plan(sweep: Sweep, hashes: list[str]) -> list[PlannedRun]:
    """Every run of ``sweep`` in the description's order (input, policy, seed, inflate, replay);
    ``hashes`` are the inputs' content hashes, in order. A trace is named by its file (an openb
    pod list without its ``openb_pod_list_`` prefix), known before the file is read."""
    for n, digest in enumerate(hashes):
        if digest in hashes[:n]:
            first = hashes.index(digest)
            raise SweepError(f"{sweep.source.name}: inputs[{n}]: the same content as inputs[{first}] (list it once)")
    runs = []
    for index, (item, digest) in enumerate(zip(sweep.inputs, hashes, strict=True)):
        for policy in sweep.policies:
            for seed in sweep.seeds:
                for inflate in sweep.inflate:
                    for replay in sweep.replay:
                        trace = item.trace_name
                        if len(sweep.inflate) > 1:
                            trace += f" inflate={'input' if inflate is None else f'{inflate:g}'}"
                        if len(sweep.replay) > 1:
                            trace += f" {replay or 'input'}"
                        key = run_id(digest, policy, seed, inflate, replay, sweep.shuffle)
                        runs.append(PlannedRun(key, index, trace, policy, seed, inflate, replay, sweep.shuffle))
    return runs


# ------------------------------------------------------------------ reading the file


def load_sweep(path: Path, data: Path | None = None, out: Path | None = None, reference: Path | None = None) -> Sweep:
    """Read and check a sweep file; ``data``, ``out`` and ``reference`` override its keys."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SweepError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise SweepError(f"{path.name}{where}: is not valid YAML") from None
    return parse_sweep(doc, path, data, out, reference)


def parse_sweep(
    doc: object, path: Path, data: Path | None = None, out: Path | None = None, reference: Path | None = None
) -> Sweep:
    here = path.parent

    def fail(where: str, problem: str) -> SweepError:
        return SweepError(f"{path.name}: {where}: {problem}")

    if not isinstance(doc, dict):
        raise SweepError(f"{path.name}: is not a mapping (accepted keys: {', '.join(KEYS)})")
    unknown = [str(k) for k in doc if k not in KEYS]
    if unknown:
        raise fail(unknown[0], f"unknown key (accepted: {', '.join(KEYS)})")
    base = data if data is not None else here / _text(doc, "data", fail, ".")
    out_dir = out if out is not None else (here / doc["out"] if doc.get("out") is not None else None)
    if doc.get("out") is not None:
        _text(doc, "out", fail, ".")
    inputs = _inputs(doc.get("inputs"), base, fail)
    policies = _policies(doc.get("policies"), fail)
    seeds = _seeds(doc.get("seeds", 42), fail)
    inflate = tuple(_inflate(v, fail) for v in _axis(doc.get("inflate")))
    replay = tuple(_replay(v, fail) for v in _axis(doc.get("replay")))
    shuffle = doc.get("shuffle")
    if shuffle is not None and not isinstance(shuffle, bool):
        raise fail("shuffle", f"{shuffle!r} (accepted: true or false)")
    ref = reference
    if ref is None and doc.get("reference") is not None:
        ref = base / _text(doc, "reference", fail, "")
    name = _text(doc, "name", fail, path.stem)
    return Sweep(name, path, base, out_dir, inputs, policies, seeds, inflate, replay, shuffle, ref)


def _text(doc: Mapping[str, object], key: str, fail: Any, default: str) -> str:
    value = doc.get(key, default)
    if value is None:
        return default
    if not isinstance(value, str) or not value.strip():
        raise fail(key, f"{value!r} (accepted: a non-empty string)")
    return value


def _axis(value: object) -> list[object]:
    return list(value) if isinstance(value, list) else [value]


def _inputs(value: object, base: Path, fail: Any) -> tuple[Input, ...]:
    if not isinstance(value, list) or not value:
        raise fail("inputs", "missing or empty (accepted: a list of trace files, or {path:, nodes:} entries)")
    out: list[Input] = []
    for i, item in enumerate(value):
        where = f"inputs[{i}]"
        if isinstance(item, str) and item.strip():
            out.append(Input(base / item))
        elif isinstance(item, dict) and isinstance(item.get("path"), str) and set(item) <= {"path", "nodes"}:
            nodes = item.get("nodes")
            if nodes is not None and not isinstance(nodes, str):
                raise fail(f"{where}.nodes", f"{nodes!r} (accepted: a path)")
            out.append(Input(base / item["path"], base / nodes if nodes else None))
        else:
            raise fail(where, f"{item!r} (accepted: a path, or {{path: ..., nodes: ...}})")
    names = [i.trace_name for i in out]
    for n, name in enumerate(names):
        if name in names[:n]:
            raise fail(f"inputs[{n}]", f"a second input named {name!r} (every input needs its own file name)")
    return tuple(out)


def _policies(value: object, fail: Any) -> tuple[PolicyChoice, ...]:
    if not isinstance(value, list) or not value:
        raise fail("policies", "missing or empty (accepted: a list of policy names or {name:, label:, options:})")
    out: list[PolicyChoice] = []
    for i, item in enumerate(value):
        where = f"policies[{i}]"
        if isinstance(item, str):
            item = {"name": item}
        if not isinstance(item, dict) or not set(item) <= {"name", "label", "options"}:
            raise fail(where, f"{item!r} (accepted: a name, or {{name:, label:, options:}})")
        name = str(item.get("name", "")).strip().lower()
        if name not in REGISTRY:
            raise fail(f"{where}.name", f"{item.get('name')!r} (accepted: {', '.join(sorted(REGISTRY))})")
        options = item.get("options") or {}
        if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
            raise fail(f"{where}.options", f"{options!r} (accepted: a mapping of option names to values)")
        try:
            json.dumps(options, allow_nan=False)
        except (TypeError, ValueError):
            raise fail(f"{where}.options", "holds a value JSON cannot carry (accepted: numbers, text, lists)") from None
        try:  # misspelt or mistyped options stop the sweep before any run
            make_policy(name, options)
        except ConfigError as exc:
            raise fail(f"{where}.options", str(exc)) from None
        label = item.get("label", name)
        if not isinstance(label, str) or not label.strip():
            raise fail(f"{where}.label", f"{label!r} (accepted: a non-empty string)")
        out.append(PolicyChoice(name, label.strip(), options))
    for n, policy in enumerate(out):
        for m, other in enumerate(out[:n]):
            if policy.label == other.label:
                raise fail(f"policies[{n}]", f"a second policy labelled {policy.label!r} (give each its own label)")
            if (policy.name, json.dumps(policy.options, sort_keys=True)) == (
                other.name,
                json.dumps(other.options, sort_keys=True),
            ):
                raise fail(f"policies[{n}]", f"the same policy and options as policies[{m}]")
    return tuple(out)


def _seeds(value: object, fail: Any) -> tuple[int, ...]:
    accepted = "accepted: a seed (42), a list ([42, 43]) or a range ('42-51')"
    if isinstance(value, bool):
        raise fail("seeds", f"{value!r} ({accepted})")
    if isinstance(value, int):
        return (value,)
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(dict.fromkeys(value))
    if isinstance(value, str):
        low, sep, high = value.strip().partition("-")
        try:
            a, b = int(low), int(high) if sep else int(low)
        except ValueError:
            raise fail("seeds", f"{value!r} ({accepted})") from None
        if b >= a:
            return tuple(range(a, b + 1))
    raise fail("seeds", f"{value!r} ({accepted})")


def _inflate(value: object, fail: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise fail("inflate", f"{value!r} (accepted: 0 (as given) or a positive ratio such as 1.3, or a list)")
    return float(value)


def _replay(value: object, fail: Any) -> str | None:
    if value is None:
        return None
    if value not in REPLAY_MODES:
        raise fail("replay", f"{value!r} (accepted: {', '.join(REPLAY_MODES)}, or a list)")
    return str(value)
