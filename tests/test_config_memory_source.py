"""The pool's memory source is one setting where a flag wins over the file (QA: a flag could
not override the file's sizing source; `--kv-cache-memory-bytes 1GiB` over a file with
num_gpu_blocks was refused as the file's conflict). The sources: num_gpu_blocks,
kv_cache_memory_bytes, and GPU memory (gpu_memory_bytes or the local GPU, with
gpu_memory_utilization, weights_bytes, activation_reserve_bytes). Two sources given in
one place, both flags or both keys of the file, are still refused, naming both as given."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvbudget.daemon.config.loading import load_config
from kvbudget.daemon.config.settings import ConfigError, DaemonConfig
from kvbudget.daemon.config.sizing import DEFAULT_GPU_MEMORY_UTILIZATION

MODEL = '[model]\nname = "llama-3.1-8b"\n'
GIB = 2**30


def _file(tmp_path: Path, pool_keys: str) -> Path:
    path = tmp_path / "kvbudget.toml"
    path.write_text(MODEL + "[pool]\n" + pool_keys)
    return path


def _sizing(config: DaemonConfig) -> dict[str, object]:
    """The memory-source settings of a config, those left at their defaults left out."""
    values = {name: getattr(config, name) for name in ("num_gpu_blocks", "kv_cache_memory_bytes",
                                                       "gpu_memory_bytes", "weights_bytes", "activation_reserve_bytes")}
    values["gpu_memory_utilization"] = config.gpu_memory_utilization
    return {name: value for name, value in values.items()
            if value is not None and not (name == "gpu_memory_utilization" and value == DEFAULT_GPU_MEMORY_UTILIZATION)}


# ----------------------------------------------------------------------- a flag's source replaces the file's
@pytest.mark.parametrize(
    ("file_keys", "flags", "sizing"),
    [
        # the QA's three
        ("num_gpu_blocks = 256\n", {"kv_cache_memory_bytes": GIB}, {"kv_cache_memory_bytes": GIB}),
        ("num_gpu_blocks = 256\n", {"gpu_memory_bytes": 80 * GIB}, {"gpu_memory_bytes": 80 * GIB}),
        ('kv_cache_memory_bytes = "1GiB"\n', {"num_gpu_blocks": 100}, {"num_gpu_blocks": 100}),
        # the file's GPU arithmetic goes with its source: none of it is left to conflict
        ('gpu_memory_bytes = "80GiB"\nweights_bytes = "16GiB"\ngpu_memory_utilization = 0.8\n'
         'activation_reserve_bytes = "1GiB"\n', {"num_gpu_blocks": 100}, {"num_gpu_blocks": 100}),
        # a utilization alone asks for the local GPU's memory: a GPU source, as in `kvbudget estimate`
        ("num_gpu_blocks = 256\n", {"gpu_memory_utilization": 0.8}, {"gpu_memory_utilization": 0.8}),
        # a setting of the file's own source overrides that setting only
        ('gpu_memory_bytes = "80GiB"\nweights_bytes = "16GiB"\n', {"weights_bytes": 10 * GIB},
         {"gpu_memory_bytes": 80 * GIB, "weights_bytes": 10 * GIB}),
        ('gpu_memory_bytes = "80GiB"\n', {"gpu_memory_utilization": 0.5},
         {"gpu_memory_bytes": 80 * GIB, "gpu_memory_utilization": 0.5}),
        ("num_gpu_blocks = 256\n", {"num_gpu_blocks": 100}, {"num_gpu_blocks": 100}),
    ],
    ids=["blocks<-kv_bytes", "blocks<-gpu_bytes", "kv_bytes<-blocks", "gpu_group<-blocks", "blocks<-utilization",
         "gpu<-weights", "gpu<-utilization", "blocks<-blocks"],
)
def test_a_memory_source_flag_replaces_the_files(
    tmp_path: Path, file_keys: str, flags: dict[str, object], sizing: dict[str, object]
) -> None:
    assert _sizing(load_config(_file(tmp_path, file_keys), flags)) == sizing


def test_what_is_valid_stays_valid(tmp_path: Path) -> None:
    # The shipped file writes gpu_memory_utilization = 0.9 (the default) beside a count.
    path = _file(tmp_path, "gpu_memory_utilization = 0.9\nnum_gpu_blocks = 256\n")
    assert _sizing(load_config(path)) == {"num_gpu_blocks": 256}
    assert _sizing(load_config(path, {"kv_cache_memory_bytes": GIB})) == {"kv_cache_memory_bytes": GIB}
    # Flags not given (argparse's None) and flags of other settings replace nothing.
    assert _sizing(load_config(path, {"kv_cache_memory_bytes": None, "block_size": 32})) == {"num_gpu_blocks": 256}


# ----------------------------------------------------------------------- two sources in one place
def test_two_sources_in_the_file_are_refused_naming_both_keys(tmp_path: Path) -> None:
    path = _file(tmp_path, 'kv_cache_memory_bytes = "1GiB"\nnum_gpu_blocks = 100\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == (
        f"{path}: pool.num_gpu_blocks: give one memory source, not pool.kv_cache_memory_bytes and pool.num_gpu_blocks")
    with pytest.raises(ConfigError) as caught:  # (a flag of another setting changes nothing)
        load_config(path, {"block_size": 32})
    assert caught.value.key == "pool.num_gpu_blocks"
    path = _file(tmp_path, 'num_gpu_blocks = 100\ngpu_memory_bytes = "80GiB"\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == (
        f"{path}: pool.gpu_memory_bytes: give one memory source, not pool.num_gpu_blocks and pool.gpu_memory_bytes")
    path = _file(tmp_path, 'num_gpu_blocks = 100\nweights_bytes = "16GiB"\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == (
        f"{path}: pool.weights_bytes: pool.weights_bytes only applies with pool.gpu_memory_bytes or the local GPU")


def test_two_sources_in_the_flags_are_refused_naming_both_flags(tmp_path: Path) -> None:
    # Over a file with a source of its own, which the flags replace: the conflict is theirs.
    path = _file(tmp_path, 'gpu_memory_bytes = "80GiB"\nweights_bytes = "16GiB"\n')
    for file in (None, path):
        with pytest.raises(ConfigError) as caught:
            load_config(file, {"model": "llama-3.1-8b", "kv_cache_memory_bytes": GIB, "num_gpu_blocks": 100})
        assert str(caught.value) == (
            "num_gpu_blocks: give one memory source, not --kv-cache-memory-bytes and --num-gpu-blocks")
        with pytest.raises(ConfigError) as caught:
            load_config(file, {"model": "llama-3.1-8b", "num_gpu_blocks": 100, "weights_bytes": GIB})
        assert str(caught.value) == (
            "weights_bytes: --weights-bytes only applies with --gpu-memory-bytes or the local GPU")


# ----------------------------------------------------------------------- as the operator runs it
def _check_config(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvbudget", "daemon", "--check-config", "--memory-mode", "accounting",
         "--device", "cpu", *args],
        capture_output=True, text=True, timeout=60,
    )


def test_check_config_takes_the_flags_source_over_the_files(tmp_path: Path) -> None:
    db, sock = tmp_path / "decisions.db", tmp_path / "kvbudget.sock"
    where = ("--db-path", str(db), "--listen", f"unix://{sock}")
    blocks = _file(tmp_path, "num_gpu_blocks = 256\n")
    checked = _check_config("--config", str(blocks), *where, "--kv-cache-memory-bytes", "1GiB")
    assert checked.returncode == 0, checked.stderr
    assert "(511 usable + the null block; from kv_cache_memory_bytes)" in checked.stdout
    checked = _check_config("--config", str(blocks), *where, "--gpu-memory-bytes", "80GiB")
    assert checked.returncode == 0, checked.stderr
    assert "from gpu_memory)" in checked.stdout
    both = tmp_path / "both.toml"
    both.write_text(MODEL + '[pool]\nnum_gpu_blocks = 256\nkv_cache_memory_bytes = "1GiB"\n')
    checked = _check_config("--config", str(both), *where)
    assert (checked.returncode, checked.stdout) == (2, "")
    assert checked.stderr == (f"kvbudget daemon: error: {both}: pool.num_gpu_blocks: give one memory source, "
                              "not pool.kv_cache_memory_bytes and pool.num_gpu_blocks\n")
    assert not db.exists() and not sock.exists()
