#!/usr/bin/env bash
# Set up a virtual environment (.venv, with the test extras) and run every check CI runs:
# lint, format, types, import contracts, then the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-venv.sh .venv test
.venv/bin/ruff check scheduler tests benchmarks
.venv/bin/ruff format --check scheduler tests benchmarks
.venv/bin/mypy
.venv/bin/lint-imports
.venv/bin/pytest
