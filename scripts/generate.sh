#!/usr/bin/env bash
# Regenerates the client code for every proto under proto/:
# - Python stubs (+ .pyi) into OUT_DIR/fencepost/v1
# - TypeScript (ts-proto, grpc-js services) into OUT_DIR/typescript/src/gen,
#   with protoc from grpcio-tools and the google/rpc protos (Status,
#   ErrorInfo, BadRequest) from the pinned googleapis-common-protos;
#   Timestamps stay {seconds, nanos} (useDate=false: a Date keeps only
#   milliseconds), their JSON helpers made exact by scripts/ts_timestamps.py.
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

ts=client/typescript
scripts/npm_ci.sh "$ts"
rpc=$(mktemp -d)
trap 'rm -rf "$rpc"' EXIT
mkdir -p "$rpc/google/rpc"
rpc_src=$("$PY" -c 'import os, google.rpc.status_pb2 as m; print(os.path.dirname(m.__file__))')
cp "$rpc_src/status.proto" "$rpc_src/error_details.proto" "$rpc/google/rpc/"
rm -rf "$out/typescript/src/gen"
mkdir -p "$out/typescript/src/gen"
"$PY" -m grpc_tools.protoc -Iproto -I"$rpc" \
  --plugin=protoc-gen-ts_proto="$ts/node_modules/.bin/protoc-gen-ts_proto" \
  --ts_proto_out="$out/typescript/src/gen" \
  --ts_proto_opt=outputServices=grpc-js,esModuleInterop=true,forceLong=string,removeEnumPrefix=true,env=node,useDate=false \
  proto/fencepost/v1/*.proto google/rpc/status.proto google/rpc/error_details.proto
"$PY" scripts/ts_timestamps.py "$out/typescript/src/gen"
