#!/usr/bin/env bash
# Set up a virtual environment (.venv, with the test extras) and run every check CI runs:
# lint, format, types, import contracts, then the test suite, with its control plane tier
# (tests/e2e, marker controlplane: a real Kubernetes v1.37 built from Go modules by
# scripts/controlplane.sh) and the Helm chart's test (marker go: tools/render-manifests), where a
# Go toolchain is on PATH. Without one, one line says they were not run; with
# GPUSLICE_E2E_REQUIRED=1 (CI) its absence fails instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-venv.sh .venv test
.venv/bin/ruff check scheduler tests benchmarks
.venv/bin/ruff format --check scheduler tests benchmarks
.venv/bin/mypy
.venv/bin/lint-imports
pytest_args=()
if command -v go >/dev/null 2>&1; then
    bash scripts/controlplane.sh >/dev/null
elif [[ "${GPUSLICE_E2E_REQUIRED:-}" == 1 ]]; then
    echo "test.sh: GPUSLICE_E2E_REQUIRED=1 but no Go toolchain (go) on PATH: the control plane tier and the chart test cannot run" >&2
    exit 1
else
    echo "test.sh: control plane tier and chart test (pytest -m 'controlplane or go') not run: no Go toolchain (go) on PATH"
    pytest_args=(-m "not controlplane and not go")
fi
.venv/bin/pytest "${pytest_args[@]}"
