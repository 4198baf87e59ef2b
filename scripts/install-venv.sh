#!/usr/bin/env bash
# Create a virtual environment and install gpuslice into it: the one install step shared by
# the container image (Dockerfile) and CI (.ci/run), so a broken install fails CI.
#
# usage: scripts/install-venv.sh VENV_DIR [EXTRAS]
#   VENV_DIR  where the environment goes (created if absent, reused if present)
#   EXTRAS    optional extras of the project, comma-separated (for instance "test")
# Run it from the repository root. pip's own settings (PIP_INDEX_URL, ...) apply as usual.
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 || -z "$1" ]]; then
    echo "usage: $0 VENV_DIR [EXTRAS]  (for instance: $0 .venv test)" >&2
    exit 2
fi
venv=$1
extras=${2:-}
if [[ ! -f pyproject.toml ]]; then
    echo "$0: run it from the repository root (no pyproject.toml in $(pwd))" >&2
    exit 2
fi
if [[ -n "$extras" && ! "$extras" =~ ^[A-Za-z0-9_,-]+$ ]]; then
    echo "$0: EXTRAS must be extra names joined by commas, such as 'test'; got '$extras'" >&2
    exit 2
fi

python3 -m venv "$venv"
"$venv/bin/python" -m pip install --no-cache-dir --disable-pip-version-check ".${extras:+[$extras]}"
"$venv/bin/gpuslice" --help >/dev/null
