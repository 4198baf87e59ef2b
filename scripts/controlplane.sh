#!/usr/bin/env bash
# Build the test control plane (e2e/controlplane: etcd, kube-apiserver, kube-controller-manager and
# kube-scheduler v1.37 in one binary) into .cache/controlplane/, and print the binary's path.
# It is rebuilt only when its sources, go.mod or go.sum change; Go's build cache makes a rebuild
# after a source change take seconds once the Kubernetes packages are compiled.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
source_dir="$root/e2e/controlplane"
cache_dir="${GPUSLICE_CONTROLPLANE_CACHE:-$root/.cache/controlplane}"
binary="$cache_dir/controlplane"
if ! command -v go >/dev/null 2>&1; then
    echo "controlplane.sh: no Go toolchain (go) on PATH" >&2
    exit 3
fi
stamp="$(cd "$source_dir" && cat go.mod go.sum ./*.go | sha256sum | cut -d' ' -f1)-$(go env GOVERSION)"
if [[ -x "$binary" && -f "$binary.stamp" && "$(cat "$binary.stamp")" == "$stamp" ]]; then
    echo "$binary"
    exit 0
fi
mkdir -p "$cache_dir"
started=$SECONDS
(cd "$source_dir" && go build -mod=readonly -trimpath -ldflags='-s -w' -o "$binary.new" .) >&2
mv "$binary.new" "$binary"
echo "$stamp" >"$binary.stamp"
echo "controlplane.sh: built $binary in $((SECONDS - started))s" >&2
echo "$binary"
