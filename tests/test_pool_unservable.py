"""A pool where no request of max_model_len fits is said, not found out from rejections
(issue 32): at start (the journal), in `--check-config`, and by `doctor`
(tests/test_doctor_config.py). It is a warning: such a pool still serves short requests.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from daemon_harness import DaemonProcess


def check_config(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvbudget", "daemon", "--check-config", "--db-path", str(tmp_path / "log.db"),
         "--listen", f"unix://{tmp_path}/kvbudget.sock", *flags],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_check_config_warns_of_a_pool_that_serves_no_request_of_max_model_len(tmp_path: Path) -> None:
    # The case: gemma-3-27b on 8 blocks ("7 usable") was "config OK" and nothing more.
    run = check_config(tmp_path, "--model", "gemma-3-27b", "--num-gpu-blocks", "8")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("config OK: gemma-3-27b, 8 blocks")
    # on stderr, as the daemon's start logs it
    (warning,) = [line for line in run.stderr.splitlines() if "max_model_len fits" in line]
    assert warning.startswith("kvbudget daemon: WARNING: no request of max_model_len fits this pool: "
                              "131072 tokens need ")
    assert "the pool has 7 usable; such requests are rejected (never_fits)" in warning


def test_check_config_says_nothing_of_a_pool_that_fits(tmp_path: Path) -> None:
    # 2048 tokens in 16-token blocks: 128 blocks; 200 usable hold one
    run = check_config(tmp_path, "--model", "llama-3.1-8b", "--num-gpu-blocks", "201", "--max-model-len", "2048")
    assert run.returncode == 0, run.stderr
    assert "max_model_len fits" not in run.stdout + run.stderr


@pytest.mark.slow
def test_the_daemon_warns_at_start(tmp_path: Path) -> None:
    # The harness's pool: 64 usable blocks of 16 tokens, max_model_len 2048 = 128 blocks.
    with DaemonProcess(tmp_path) as daemon:
        journal = daemon.stderr()
    assert ("WARNING: no request of max_model_len fits this pool: 2048 tokens need 128 blocks, "
            "the pool has 64 usable") in journal
