"""The daemon takes sizes (`8GiB`, `80GB`, `80e9`) where `kvbudget estimate` and `replay` do
(QA: `kvbudget daemon --kv-cache-memory-bytes 8GiB` was refused as "invalid int value"):
its byte flags and its TOML byte keys, an integer still accepted; errors name the flag or key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvbudget.cli.cmd_estimate import parse_size as estimate_parse_size
from kvbudget.daemon.config.loading import load_config
from kvbudget.daemon.config.settings import SIZE_FIELDS, ConfigError
from kvbudget.client.errors import CLIError
from kvbudget.units import parse_size

MODEL = '[model]\nname = "llama-3.1-8b"\n[pool]\ndevice = "cpu"\n'
SIZES = [("8GiB", 8 * 2**30), ("8 GiB", 8 * 2**30), ("80GB", 80 * 10**9), ("80e9", 80 * 10**9),
         ("8G", 8 * 2**30), ("8g", 8 * 10**9), ("512MiB", 512 * 2**20), ("1.5GiB", 3 * 2**29),
         ("123", 123), ("2TB", 2 * 10**12), ("1.5KiB", 1536), ("4096b", 4096)]


@pytest.mark.parametrize(("text", "value"), SIZES)
def test_the_same_forms_as_estimate(text: str, value: int) -> None:
    assert parse_size(text) == value
    assert estimate_parse_size(text, "--x") == value


@pytest.mark.parametrize(("text", "why"), [
    ("abc", "expected a size like 80e9, 80GB (10^9) or 8GiB (2^30)"),
    ("8XB", "unknown unit 'XB' (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"),
    ("", "expected a size like 80e9, 80GB (10^9) or 8GiB (2^30)"),
    ("1e30", "too large (at most 8 EiB)"),
    ("-1GB", "must not be negative"),
])
def test_what_is_not_a_size(text: str, why: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_size(text)
    assert str(caught.value) == why
    with pytest.raises(CLIError):  # (estimate refuses each too)
        estimate_parse_size(text, "--x")


def _load(tmp_path: Path, text: str, overrides: dict | None = None):
    path = tmp_path / "kvbudget.toml"
    path.write_text(text)
    return load_config(path, overrides)


def test_the_file_takes_a_size_or_an_integer(tmp_path: Path) -> None:
    assert SIZE_FIELDS == {"kv_cache_memory_bytes", "gpu_memory_bytes", "weights_bytes",
                           "activation_reserve_bytes", "retention_max_bytes"}
    assert _load(tmp_path, MODEL + 'kv_cache_memory_bytes = "8GiB"\n').kv_cache_memory_bytes == 8 * 2**30
    assert _load(tmp_path, MODEL + "kv_cache_memory_bytes = 8589934592\n").kv_cache_memory_bytes == 8 * 2**30
    assert _load(tmp_path, MODEL + "kv_cache_memory_bytes = 8e9\n").kv_cache_memory_bytes == 8 * 10**9  # a TOML float
    gpu = _load(tmp_path, MODEL + 'gpu_memory_bytes = "80GB"\nweights_bytes = "16GiB"\n'
                'activation_reserve_bytes = "0"\n')
    assert (gpu.gpu_memory_bytes, gpu.weights_bytes, gpu.activation_reserve_bytes) == (80 * 10**9, 16 * 2**30, 0)
    assert _load(tmp_path, MODEL + '[log]\nretention_max_bytes = "512MiB"\n').retention_max_bytes == 512 * 2**20
    assert type(_load(tmp_path, MODEL + 'kv_cache_memory_bytes = "8GiB"\n').kv_cache_memory_bytes) is int


@pytest.mark.parametrize(("line", "message"), [
    ('kv_cache_memory_bytes = "8XB"',
     "pool.kv_cache_memory_bytes: unknown unit 'XB' (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), got '8XB'"),
    ('kv_cache_memory_bytes = "lots"',
     "pool.kv_cache_memory_bytes: expected a size like 80e9, 80GB (10^9) or 8GiB (2^30), got 'lots'"),
    ("kv_cache_memory_bytes = 1.5",
     "pool.kv_cache_memory_bytes: must be a whole number of bytes or a size like 80e9, 80GB (10^9) or 8GiB "
     "(2^30), got 1.5"),
    ("kv_cache_memory_bytes = true",
     "pool.kv_cache_memory_bytes: must be a whole number of bytes or a size like 80e9, 80GB (10^9) or 8GiB "
     "(2^30), got True"),
    ('kv_cache_memory_bytes = "0GiB"', "pool.kv_cache_memory_bytes: must be positive, got 0"),
    ('kv_cache_memory_bytes = "-8GiB"', "pool.kv_cache_memory_bytes: must not be negative, got '-8GiB'"),
])
def test_a_bad_size_in_the_file_names_its_key(tmp_path: Path, line: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, MODEL + line + "\n")
    assert caught.value.key == "pool.kv_cache_memory_bytes"
    assert str(caught.value) == f"{tmp_path / 'kvbudget.toml'}: {message}"


def _daemon(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvbudget", "daemon", "--model", "llama-3.1-8b", "--device", "cpu",
                           "--memory-mode", "accounting", "--check-config", *args],
                          capture_output=True, text=True, timeout=60)


def test_the_flag_takes_a_size(tmp_path: Path) -> None:
    # llama-3.1-8b, bf16, 16-token blocks: 2 MiB a block, so 8 GiB is 4096 blocks.
    db = tmp_path / "d.db"
    for given in ("8GiB", "8589934592", "8G"):
        result = _daemon("--kv-cache-memory-bytes", given, "--db-path", str(db))
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(
            "config OK: llama-3.1-8b, 4096 blocks of 16 tokens (4095 usable + the null block; "
            "from kv_cache_memory_bytes)"), (given, result.stdout)
    kept = _daemon("--num-gpu-blocks", "65", "--retention-max-bytes", "512MiB", "--db-path", str(db))
    assert kept.stdout.rstrip().endswith("(kept: 30 days or 512 MiB, whichever comes first)"), kept.stdout


def test_a_bad_size_flag_is_one_line_naming_the_flag(tmp_path: Path) -> None:
    result = _daemon("--kv-cache-memory-bytes", "8XB", "--db-path", str(tmp_path / "d.db"))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "kvbudget daemon: error: argument --kv-cache-memory-bytes: unknown unit 'XB' (use B, KB, MB, GB, TB, KiB, "
        "MiB, GiB, TiB), got '8XB' (see kvbudget daemon --help)"]
