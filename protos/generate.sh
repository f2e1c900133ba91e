#!/usr/bin/env bash
# Regenerate the Python code for the kvbudget.v1 contract (messages, type stubs, gRPC stubs),
# and the descriptor set the daemon serves over reflection: the same descriptors with their
# comments (source info), which the generated *_pb2.py leave out, so that
# `grpcurl describe kvbudget.v1.StepRequest` shows the documentation written in the .proto.
# With its imports, the set is self-contained: `grpcurl -protoset` / `buf curl --schema` read it.
# Usage: protos/generate.sh [OUT_DIR]   (default: protos, next to the .proto files)
# The generated imports read `from kvbudget.v1 import ...`, matching the installed package.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-protos}
python=${PYTHON:-python}
# (file names are relative to -I protos, as in the generated code: no machine path gets in)
"$python" -m grpc_tools.protoc -I protos \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  --descriptor_set_out="$out/kvbudget/v1/descriptor_set.binpb" --include_source_info --include_imports \
  protos/kvbudget/v1/*.proto
