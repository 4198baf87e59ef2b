"""Where the public data sets behind the recorded simulations are, once fetched as the README
says (into ``data/`` of a checkout, which git ignores; they are research data, never part of
the repository):

* the Alibaba GPU trace ("openb"): GitHub ``alibaba/clusterdata``, folder
  ``cluster-trace-gpu-v2023/csv`` (the FGD paper's simulator, ``hkust-adsl/kubernetes-scheduler-simulator``,
  has the same CSV files under ``data/csv``);
* the FGD authors' result curves: ``hkust-adsl/kubernetes-scheduler-simulator``, folder
  ``experiments/analysis/expected_results``.

``$GPUSLICE_OPENB`` and ``$GPUSLICE_FGD_RESULTS`` name other folders holding the same files.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

OPENB_ENV = "GPUSLICE_OPENB"
RESULTS_ENV = "GPUSLICE_FGD_RESULTS"
OPENB_IN_CHECKOUT = Path("data/clusterdata/cluster-trace-gpu-v2023/csv")
RESULTS_IN_CHECKOUT = Path("data/fgd/experiments/analysis/expected_results")


def openb_dir(repo: Path, env: Mapping[str, str] | None = None) -> Path:
    """The folder of ``openb_pod_list_*.csv`` and ``openb_node_list_*.csv``."""
    found = (os.environ if env is None else env).get(OPENB_ENV)
    return Path(found) if found else repo / OPENB_IN_CHECKOUT


def results_dir(repo: Path, env: Mapping[str, str] | None = None) -> Path:
    """The folder of ``analysis_allo_discrete.csv`` and the other reference curves."""
    found = (os.environ if env is None else env).get(RESULTS_ENV)
    return Path(found) if found else repo / RESULTS_IN_CHECKOUT
