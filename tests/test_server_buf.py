"""A client not written in Python reaches the daemon: `buf curl` (Go) over the unix socket,
and reads a refusal's google.rpc.Status details; the contract itself passes `buf lint`
(protos/buf.yaml: the STANDARD and COMMENTS rules) and `buf format`.

Health check, the reflection listing, and one real call described only by reflection.
Skips, saying why, when neither `$BUF` nor `npx` can run buf (e.g. offline without a cache).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from google.rpc import code_pb2, error_details_pb2

from daemon_harness import DaemonProcess

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def _buf_command() -> list[str]:
    if os.environ.get("BUF"):
        return [os.environ["BUF"]]
    if shutil.which("buf"):
        return ["buf"]
    if shutil.which("npx") is None:
        pytest.skip("neither buf nor npx is installed (set BUF=/path/to/buf to run this test)")
    command = ["npx", "--yes", "@bufbuild/buf"]
    try:
        probe = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        pytest.skip("npx could not fetch @bufbuild/buf within 180 s")
    if probe.returncode != 0:
        pytest.skip(f"npx could not run @bufbuild/buf: {probe.stderr.strip()[:200]}")
    return command


def _curl(buf: list[str], daemon: DaemonProcess, *args: str) -> str:
    result = subprocess.run(
        [*buf, "curl", "--protocol", "grpc", "--http2-prior-knowledge", "--unix-socket", str(daemon.socket_path),
         *args],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_buf_curl_health_reflection_and_a_call(tmp_path) -> None:
    buf = _buf_command()
    with DaemonProcess(tmp_path) as daemon:
        health = json.loads(_curl(buf, daemon, "http://localhost/grpc.health.v1.Health/Check"))
        assert health == {"status": "SERVING"}
        services = _curl(buf, daemon, "--list-services", "http://localhost").split()
        assert {"kvbudget.v1.EngineService", "kvbudget.v1.ObserverService", "kvbudget.v1.AdminService",
                "grpc.health.v1.Health"} <= set(services)
        # cdiv(1024, 16) = 64 blocks per request on a 64-block pool: one at a time.
        estimate = json.loads(_curl(buf, daemon, "-d", '{"tokens_per_request": 1024}',
                                    "http://localhost/kvbudget.v1.ObserverService/Estimate"))
        assert estimate == {"maxConcurrency": 1, "naiveMaxConcurrency": 1, "blocksPerRequest": [64]}


def test_buf_lint_of_the_protos_is_clean() -> None:
    buf = _buf_command()
    listed = subprocess.run([*buf, "ls-files", "protos"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    # the module buf lints is the whole contract, not an empty folder
    assert {f"protos/kvbudget/v1/{name}.proto" for name in ("admin", "common", "engine", "observer")} <= set(
        listed.stdout.split()
    )
    lint = subprocess.run([*buf, "lint", "protos"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (lint.returncode, lint.stdout + lint.stderr) == (0, "")


def test_buf_format_of_the_protos_is_clean() -> None:
    buf = _buf_command()
    formatted = subprocess.run([*buf, "format", "--diff", "--exit-code", "protos"], cwd=ROOT, capture_output=True,
                               text=True, timeout=120)
    assert (formatted.returncode, formatted.stdout + formatted.stderr) == (0, "")


def test_buf_curl_reads_a_refusals_details(tmp_path) -> None:
    """The google.rpc.Status in the trailer, from the descriptor set the project ships."""
    buf = _buf_command()
    schema = ROOT / "protos" / "kvbudget" / "v1" / "descriptor_set.binpb"
    with DaemonProcess(tmp_path) as daemon:
        result = subprocess.run(
            [*buf, "curl", "--protocol", "grpc", "--http2-prior-knowledge", "--unix-socket", str(daemon.socket_path),
             "--schema", str(schema), "-d", '{"sessionId": "nope"}', "http://localhost/kvbudget.v1.EngineService/Step"],
            capture_output=True, text=True, timeout=120,
        )
    assert result.returncode == 63 + code_pb2.FAILED_PRECONDITION, result.stderr  # buf curl: 63 + the code
    error = json.loads(result.stderr)
    assert (error["code"], error["message"]) == (
        "failed_precondition", "session_id: unknown session (expired, closed, or the daemon restarted): open a new one")
    assert [d["type"] for d in error["details"]] == ["google.rpc.ErrorInfo", "google.rpc.PreconditionFailure"]
    info = error_details_pb2.ErrorInfo.FromString(base64.b64decode(error["details"][0]["value"] + "=="))
    assert (info.reason, info.domain, dict(info.metadata)) == ("SESSION_UNKNOWN", "kvbudget", {"field": "session_id"})
