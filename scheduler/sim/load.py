"""Any input to a :class:`Trace`: an openb pod CSV, a scenario YAML or a Kubernetes List."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import yaml

from . import kubelist, openb, scenario
from .errors import TraceError
from .model import Trace

EMBEDDED = "sim-small.yaml"


def embedded_scenario() -> Trace:
    """The small scenario shipped inside the package (``scheduler/examples/sim-small.yaml``)."""
    text = resources.files("scheduler").joinpath("examples", EMBEDDED).read_text(encoding="utf-8")
    return scenario.load_text(text, EMBEDDED)


def load_trace(path: str | Path, nodes: str | Path | None = None) -> Trace:
    """Read ``path`` by its kind: ``.csv`` is an openb pod list (on ``nodes``, by default the GPU
    node list beside it); YAML or JSON is a Kubernetes List or else a scenario."""
    path = Path(path)
    if not path.exists():
        raise TraceError(path, "", "does not exist")
    if path.suffix.lower() == ".csv":
        return openb.read_trace(path, nodes)
    if nodes is not None:
        raise TraceError(path, "", "--nodes applies to openb pod lists (.csv) only")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(path, "", f"cannot be read: {exc.strerror or exc}") from exc
    try:
        head = yaml.safe_load(text)
    except yaml.YAMLError:
        head = None  # the scenario reader reports the syntax error with its line
    if kubelist.is_kube_list(head):
        return kubelist.read_kube_list(path)
    return scenario.load_text(text, path)
