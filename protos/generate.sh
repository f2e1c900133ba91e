#!/usr/bin/env bash
# Regenerate the Python code for the kvbudget.v1 contract (messages, type stubs, gRPC stubs).
# Usage: protos/generate.sh [OUT_DIR]   (default: protos, next to the .proto files)
# The generated imports read `from kvbudget.v1 import ...`, matching the installed package.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-protos}
python=${PYTHON:-python}
"$python" -m grpc_tools.protoc -I protos \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  protos/kvbudget/v1/*.proto
