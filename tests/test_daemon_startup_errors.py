"""A daemon that cannot start says why in one line, exits 2, and touches nothing."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.daemon_harness import DEFAULT_ARGS


def run_daemon(tmp_path: Path, db_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvbudget", "daemon", *DEFAULT_ARGS,
         "--listen", f"unix://{tmp_path / 'kvbudget.sock'}", "--db-path", str(db_path)],
        capture_output=True, text=True, timeout=60,
    )


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error" in line.lower() or "Traceback" in line]


@pytest.mark.parametrize("kind", ["junk file", "foreign database", "directory"])
def test_unusable_database_is_one_line_and_left_alone(tmp_path: Path, kind: str) -> None:
    db_path = tmp_path / "decisions.db"
    if kind == "junk file":
        db_path.write_bytes(b"not a database at all\n" * 100)
    elif kind == "foreign database":
        with sqlite3.connect(db_path) as conn:
            conn.execute("create table invoices (id integer primary key, total real)")
            conn.execute("insert into invoices (total) values (12.5)")
    else:
        db_path.mkdir()
    before = db_path.read_bytes() if db_path.is_file() else None

    result = run_daemon(tmp_path, db_path)

    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and "db_path" in lines[0], result.stderr
    if before is not None:
        assert db_path.read_bytes() == before  # nothing migrated, nothing overwritten
    assert not (tmp_path / "kvbudget.sock").exists()


def test_a_tls_key_that_does_not_match_its_certificate_is_one_line(tmp_path: Path) -> None:
    """gRPC alone would fail the port with "Failed to bind to address", naming neither file."""
    from tests.certificates import make_pair

    cert, _ = make_pair(tmp_path, "a")
    _, other_key = make_pair(tmp_path, "b")
    result = subprocess.run(
        [sys.executable, "-m", "kvbudget", "daemon", *DEFAULT_ARGS, "--listen", "localhost:0",
         "--tls-cert-file", str(cert), "--tls-key-file", str(other_key), "--db-path", str(tmp_path / "d.db")],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert error_lines(result.stderr) == [
        f"kvbudget daemon: error: tls_key_file: {other_key}: the key does not match the certificate in {cert}"]
    assert not (tmp_path / "d.db").exists()


def test_a_tenant_share_of_less_than_one_block_is_one_line(tmp_path: Path) -> None:
    # 64 usable blocks x 0.01 = 0 blocks: a quota that refuses every request of the tenant.
    result = subprocess.run(
        [sys.executable, "-m", "kvbudget", "daemon", *DEFAULT_ARGS, "--tenant", "batch=0.01",
         "--listen", f"unix://{tmp_path}/d.sock", "--db-path", str(tmp_path / "d.db")],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert error_lines(result.stderr) == [
        "kvbudget daemon: error: tenants.batch.max_share: 0.01 of the 64 blocks is less than one block"]


# `kvbudget` under a 4 GiB address space: the daemon itself runs in far less (accounting
# mode, no torch), and a billion blocks' free list alone (8 bytes a block) cannot fit. Set
# by the child's own first statement, not a preexec_fn: Python code between fork and exec
# can deadlock when the test process has other threads (gRPC's, from earlier tests).
KVBUDGET_IN_4_GIB = (
    "import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30)); "
    "sys.argv[0] = 'kvbudget'; runpy.run_module('kvbudget', run_name='__main__', alter_sys=True)"
)


def test_a_pool_too_large_to_track_is_one_line(tmp_path: Path) -> None:
    """A typo of a few zeros in num_gpu_blocks (within the wire's bound) ran the process out
    of memory building the block tables: a MemoryError traceback, exit 1."""
    args = [arg if arg != "65" else "1000000000" for arg in DEFAULT_ARGS]  # --num-gpu-blocks
    result = subprocess.run(
        [sys.executable, "-c", KVBUDGET_IN_4_GIB, "daemon", *args,
         "--listen", f"unix://{tmp_path}/d.sock", "--db-path", str(tmp_path / "d.db")],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert error_lines(result.stderr) == [
        "kvbudget daemon: error: 1000000000 blocks (num_gpu_blocks): this host has not the memory to track "
        "that many blocks; lower num_gpu_blocks or kv_cache_memory_bytes"]
    assert not (tmp_path / "d.sock").exists()
