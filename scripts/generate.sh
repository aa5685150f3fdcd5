#!/usr/bin/env bash
# Regenerates the Python stubs (+ .pyi) for every proto under proto/.
# Usage: scripts/generate.sh [OUT_DIR]   (default: client)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
out=${1:-client}
bin=$(dirname "$PY")
mkdir -p "$out/fencepost/v1"
rm -f "$out"/fencepost/v1/*_pb2*.py "$out"/fencepost/v1/*_pb2*.pyi
"$PY" -m grpc_tools.protoc -Iproto \
  --python_out="$out" --grpc_python_out="$out" \
  --plugin=protoc-gen-mypy="$bin/protoc-gen-mypy" \
  --plugin=protoc-gen-mypy_grpc="$bin/protoc-gen-mypy_grpc" \
  --mypy_out="$out" --mypy_grpc_out="$out" \
  proto/fencepost/v1/*.proto 2> >(grep -v "^Writing mypy" >&2)
