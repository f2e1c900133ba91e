"""The committed generated code (and the descriptor set reflection serves) is exactly what
protos/generate.sh produces from the .proto files.

If this fails, run `protos/generate.sh` and commit the result (or the .proto edit was not
regenerated). Needs grpcio-tools at the version pinned in pyproject's test extras.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "protos" / "kvbudget" / "v1"
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
DESCRIPTOR_SET = "descriptor_set.binpb"  # see daemon/server/reflection.py


def test_generated_code_matches_the_protos(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    env = dict(os.environ, PYTHON=sys.executable)
    subprocess.run([str(ROOT / "protos" / "generate.sh"), str(tmp_path)], check=True, env=env)
    protos = sorted(PROTO_DIR.glob("*.proto"))
    assert protos, "no .proto files found"
    for proto in protos:
        for suffix in SUFFIXES:
            name = proto.stem + suffix
            fresh = (tmp_path / "kvbudget" / "v1" / name).read_text()
            committed = (PROTO_DIR / name).read_text()
            assert fresh == committed, f"{name} is stale: run protos/generate.sh"
    # the descriptor set reflection serves (the same files, with their comments)
    fresh_set = (tmp_path / "kvbudget" / "v1" / DESCRIPTOR_SET).read_bytes()
    assert fresh_set == (PROTO_DIR / DESCRIPTOR_SET).read_bytes(), f"{DESCRIPTOR_SET} is stale: run protos/generate.sh"


def test_every_generated_module_imports() -> None:
    import importlib

    for proto in sorted(PROTO_DIR.glob("*.proto")):
        importlib.import_module(f"kvbudget.v1.{proto.stem}_pb2")
        importlib.import_module(f"kvbudget.v1.{proto.stem}_pb2_grpc")
