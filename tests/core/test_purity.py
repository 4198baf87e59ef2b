"""The core stays pure: no module of scheduler.core imports web, Kubernetes, network or process modules.

(The import-linter contracts in pyproject.toml say the same about the source; this test checks it at run
time, including imports made inside functions at import time. Third-party libraries the core uses, such as
networkx, may import what they like.)"""

from __future__ import annotations

import subprocess
import sys

BLOCK = """
import builtins, sys
blocked = {"fastapi", "uvicorn", "kubernetes", "starlette", "httpx", "requests", "urllib3", "socket", "subprocess"}
real_import = builtins.__import__
def guarded(name, globals=None, locals=None, fromlist=(), level=0):
    importer = (globals or {}).get("__name__", "")
    if importer.startswith("scheduler.") and level == 0 and name.split(".")[0] in blocked:
        raise ImportError(f"{importer} imported {name}")
    return real_import(name, globals, locals, fromlist, level)
builtins.__import__ = guarded
import scheduler.core
import scheduler.core.policies
import scheduler.core.k8s
print("ok")
"""


def test_core_imports_without_web_kubernetes_or_network_modules() -> None:
    result = subprocess.run([sys.executable, "-c", BLOCK], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
