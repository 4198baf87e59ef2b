"""benchmarks/extender_driver.py loaded as a module, once, for the tests that play kube-scheduler
with it (the benchmarks folder is not a package); :func:`benchmark` loads another script so."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def benchmark(name: str) -> ModuleType:
    """benchmarks/``name``.py as the module ``name`` (loaded once)."""
    found = sys.modules.get(name)
    if found is not None:
        return found
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


driver = benchmark("extender_driver")
