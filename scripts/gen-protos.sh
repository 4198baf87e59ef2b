#!/usr/bin/env bash
# Regenerate the Python modules of the kubelet APIs the node agent speaks (device plugin
# v1beta1, pod resources v1) from the .proto files in scheduler/agent/proto/.
#
# usage: scripts/gen-protos.sh [PYTHON]   (default .venv/bin/python; needs grpcio-tools)
# The generated *_pb2.py / *_pb2_grpc.py / *_pb2.pyi files are committed: installing gpuslice
# needs no code generator. They check the protobuf runtime at import: keep the protobuf lower
# bound in pyproject.toml at the version this prints, or above.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-.venv/bin/python}
"$python" -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. \
    scheduler/agent/proto/deviceplugin.proto scheduler/agent/proto/podresources.proto
grep -h "ValidateProtobufRuntimeVersion" -A 6 scheduler/agent/proto/*_pb2.py | head -8
