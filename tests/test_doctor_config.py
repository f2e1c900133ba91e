"""`kvbudget doctor --config FILE` against a real daemon: the config is compared as what it
means (its own model, block size and memory source), as an operator runs it (issue 32).

The harness's daemon: llama-3.1-8b, 16-token blocks, --num-gpu-blocks 65 (64 usable), on
a host without a GPU (the daemon reports none).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from daemon_harness import DaemonProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with DaemonProcess(tmp_path_factory.mktemp("doctor-config")) as process:
        yield process


def doctor(daemon: DaemonProcess, config: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvbudget", "doctor", "--target", daemon.target, "--samples", "1",
         "--config", str(config), *extra],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def pool_size_line(out: str) -> str:
    return next(line for line in out.splitlines() if " pool size " in line)


def test_a_config_for_another_model_is_a_problem_not_as_the_config_implies(daemon, tmp_path: Path) -> None:
    # Issue 32: a config naming another model with kv_cache_memory_bytes was read with the
    # daemon's model and block size and said "ok ... as the config implies".
    config = tmp_path / "gemma.toml"
    config.write_text('[model]\nname = "gemma-3-27b"\n[pool]\nkv_cache_memory_bytes = "5GiB"\n')
    run = doctor(daemon, config)
    assert run.returncode == 1, run.stdout + run.stderr
    line = pool_size_line(run.stdout)
    assert line.split()[0] == "problem"
    assert "the config names model gemma-3-27b, the daemon runs llama-3.1-8b" in line

    report = json.loads(doctor(daemon, config, "--json").stdout)
    (size,) = [f for f in report["findings"] if f["check"] == "pool size"]
    assert (size["data"]["config_model"], size["data"]["config_source"]) == ("gemma-3-27b", "kv_cache_memory_bytes")


def test_a_config_it_cannot_work_out_is_said_with_why_and_exit_1(daemon, tmp_path: Path) -> None:
    # Sized from GPU memory, no gpu_memory_bytes, and the daemon reports no GPU: it was
    # skipped without a word and doctor said ok.
    config = tmp_path / "deploy.toml"
    config.write_text('[model]\nname = "llama-3.1-8b"\n[pool]\ngpu_memory_utilization = 0.9\n')
    run = doctor(daemon, config)
    assert run.returncode == 1, run.stdout + run.stderr
    line = pool_size_line(run.stdout)
    assert line.split()[0] == "problem"
    assert f"could not compare with the config: {config}: " in line
    assert "num_gpu_blocks, kv_cache_memory_bytes or gpu_memory_bytes" in line  # what would let it


def test_the_matching_config_says_what_it_compared(daemon, tmp_path: Path) -> None:
    config = tmp_path / "kvbudget.toml"
    config.write_text('[model]\nname = "llama-3.1-8b"\n[pool]\nnum_gpu_blocks = 65\n')
    run = doctor(daemon, config)
    line = pool_size_line(run.stdout)
    assert "as the config implies (llama-3.1-8b, 16-token blocks, num_gpu_blocks)" in line
    # The harness's pool serves nothing of max_model_len: cdiv(2048, 16) = 128 blocks > 64.
    # A warning, not a problem (issue 32: such a pool started without a word).
    assert line.split()[0] == "warn", run.stdout
    assert "no request of max_model_len fits: 2048 tokens need 128 blocks, the pool has 64" in line


def test_a_config_with_another_block_size_is_a_problem(daemon, tmp_path: Path) -> None:
    config = tmp_path / "blocks32.toml"
    config.write_text('[model]\nname = "llama-3.1-8b"\nblock_size = 32\n[pool]\nnum_gpu_blocks = 65\n')
    run = doctor(daemon, config)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "the config means 32-token blocks, the daemon runs 16-token blocks" in pool_size_line(run.stdout)
