"""A config with several mistakes is reported whole in one run: every key the file could
not take and every value the checks refuse, in the file's and the checks' order, each as
the one-mistake message it would get alone; `kvbudget daemon --check-config` prints each
on a line of its own and exits 2. One mistake reads exactly as before.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbudget.cli.main import main
from kvbudget.daemon.config.checks import ConfigErrors
from kvbudget.daemon.config.loading import load_config
from kvbudget.daemon.config.settings import ConfigError

THREE_MISTAKES = """\
[model]
name = "llama-3.1-8b"
max_model_len = "long"
[pool]
memory_mode = "shared"
num_gpu_blocks = 1
colour = "red"
[admission]
policy = "greedy"
watermark = 2.0
"""
EXPECTED = [  # (key, message): the file's two it could not read, then the checks' four
    ("model.max_model_len", "must be an integer, got 'long'"),
    ("pool.colour", "unknown key 'colour' in [pool] (expected: device, memory_mode, gpu_memory_utilization, "
                    "kv_cache_memory_bytes, num_gpu_blocks, gpu_memory_bytes, weights_bytes, "
                    "activation_reserve_bytes, gpu_probe_interval_s)"),
    ("pool.memory_mode", "must be one of owned, accounting, got 'shared'"),
    ("pool.num_gpu_blocks", "must be at least 2 (one is the null block), got 1"),
    ("admission.policy", "unknown policy 'greedy' (expected one of optimistic, guaranteed, predictive, naive)"),
    ("admission.watermark", "must be in [0, 1), got 2.0"),
]


def test_every_mistake_of_the_file_in_one_error(tmp_path: Path) -> None:
    path = tmp_path / "kvbudget.toml"
    path.write_text(THREE_MISTAKES)
    with pytest.raises(ConfigErrors) as info:
        load_config(path)
    assert [(p.key, p.message, p.source) for p in info.value.problems] == [(k, m, str(path)) for k, m in EXPECTED]
    # as one ConfigError (a reload's journal line): the first, and all of them in its text
    assert (info.value.key, info.value.message) == EXPECTED[0]
    assert str(info.value) == "; ".join(f"{path}: {k}: {m}" for k, m in EXPECTED)


def test_flags_and_file_mistakes_together(tmp_path: Path) -> None:
    path = tmp_path / "kvbudget.toml"
    path.write_text('[model]\nname = "llama-3.1-8b"\n[admission]\nwatermark = 2.0\n')
    with pytest.raises(ConfigErrors) as info:
        load_config(path, {"lease_ttl_s": -1.0, "retention_max_bytes": 5})
    assert [(p.key, p.source) for p in info.value.problems] == [
        ("lease_ttl_s", ""), ("admission.watermark", str(path)), ("retention_max_bytes", "")]


def test_one_mistake_is_a_plain_config_error(tmp_path: Path) -> None:
    path = tmp_path / "kvbudget.toml"
    path.write_text('[model]\nname = "llama-3.1-8b"\n[admission]\nwatermark = 2.0\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert type(info.value) is ConfigError
    assert str(info.value) == f"{path}: admission.watermark: must be in [0, 1), got 2.0"


def test_check_config_prints_each_mistake_on_its_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "kvbudget.toml"
    path.write_text(THREE_MISTAKES)
    assert main(["daemon", "--config", str(path), "--check-config"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [f"kvbudget daemon: error: {path}: {k}: {m}" for k, m in EXPECTED]
