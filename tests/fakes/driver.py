"""benchmarks/extender_driver.py loaded as a module, once, for the tests that play kube-scheduler
with it (the benchmarks folder is not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    found = sys.modules.get("extender_driver")
    if found is not None:
        return found
    spec = importlib.util.spec_from_file_location("extender_driver", ROOT / "benchmarks" / "extender_driver.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["extender_driver"] = module
    spec.loader.exec_module(module)
    return module


driver = _load()
