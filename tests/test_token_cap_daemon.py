"""The engine-side compression cap outside `estimate`: `[model] token_cap` / `--token-cap`
for the daemon, `--token-cap` for offline `kvbudget replay`. An engine that compresses every
attention layer to at most N tokens (Ada-KV, SnapKV) is admitted, grown and released by the
capped formula, cdiv(min(tokens, N), block_size) blocks per group, the one `estimate` uses.

By hand, llama-3.1-8b (32 full-attention layers, one KV-cache group), blocks of 16 tokens,
cap 512: any request holds at most cdiv(512, 16) = 32 blocks. Uncapped, a 1,000-token
prompt needs cdiv(1000, 16) = 63 blocks and a 400-token one cdiv(400, 16) = 25; the
harness's pool has 64 usable blocks.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvbudget.client import EngineClient, ObserverClient
from kvbudget.daemon.config.loading import load_config
from kvbudget.daemon.config.pool_setup import PoolSetupError, setup_pool
from kvbudget.daemon.config.settings import ConfigError
from kvbudget.daemon.core.budget import request_worst_case
from kvbudget.daemon.core.records import DecisionKind, Reason, RequestSpec
from kvbudget.tui.panels import layer_rows

from daemon_harness import DaemonProcess

MODEL = '[model]\nname = "{name}"\nmax_model_len = 2048\n{extra}\n[pool]\nnum_gpu_blocks = 65\n'


def config(tmp_path: Path, extra: str, name: str = "llama-3.1-8b"):
    path = tmp_path / "kvbudget.toml"
    path.write_text(MODEL.format(name=name, extra=extra))
    return path


def test_the_file_key_makes_every_layer_capped_in_the_daemons_layout(tmp_path: Path) -> None:
    setup = setup_pool(load_config(config(tmp_path, "token_cap = 512")), gpu=None)
    [group] = setup.model.layout.groups
    assert (group.spec.describe(), len(group.layer_ids)) == ("capped cap=512", 32)
    # a 1,000-token request: 32 blocks capped, 63 uncapped; 2,048 tokens: still 32 (128 uncapped)
    assert request_worst_case(setup.model.layout, 1000, 8192).total == 32
    assert request_worst_case(setup.model.layout, 2048, 8192).total == 32
    plain = setup_pool(load_config(config(tmp_path, "")), gpu=None)
    assert request_worst_case(plain.model.layout, 1000, 8192).total == 63
    assert request_worst_case(plain.model.layout, 2048, 8192).total == 128
    # the cap changes what a request needs, not the pool: 65 blocks of 2,097,152 B either way
    assert (setup.num_blocks, setup.sizing.bytes_per_block) == (plain.num_blocks, plain.sizing.bytes_per_block)
    assert "every attention layer capped at 512 tokens" in setup.model.layout.notes


def test_the_flag_overrides_the_file(tmp_path: Path) -> None:
    loaded = load_config(config(tmp_path, "token_cap = 512"), {"token_cap": 1024})
    [group] = setup_pool(loaded, gpu=None).model.layout.groups
    assert group.spec.token_cap == 1024


def test_a_reload_keeps_the_running_cap_until_a_restart(tmp_path: Path) -> None:
    from kvbudget.daemon.server.reload import plan_reload

    running = load_config(config(tmp_path, ""))
    plan = plan_reload(running, load_config(config(tmp_path, "token_cap = 512")))
    # the pool's plan (its groups) was built at start: engines hold it; a cap waits for a restart
    assert (plan.at_restart, plan.config.token_cap) == (("token_cap",), None)


@pytest.mark.parametrize("extra, message", [
    ("token_cap = 0", "model.token_cap: must be positive, got 0"),
    ("token_cap = 4294967296", "model.token_cap: must be at most 4294967295, got 4294967296"),
    ('token_cap = "512"', "model.token_cap: must be an integer, got '512'"),
])
def test_a_bad_cap_is_refused_naming_the_key(tmp_path: Path, extra: str, message: str) -> None:
    path = config(tmp_path, extra)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == f"{path}: {message}"


def test_an_mla_model_cannot_be_capped(tmp_path: Path) -> None:
    with pytest.raises(PoolSetupError) as caught:
        setup_pool(load_config(config(tmp_path, "token_cap = 512", name="deepseek-v3")), gpu=None)
    assert str(caught.value) == "token_cap applies to K/V attention layers, not MLA latents"


def test_check_config_refuses_a_capped_mla_model_in_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kvbudget", "daemon", "--model", "deepseek-v3", "--token-cap", "512",
         "--num-gpu-blocks", "100", "--memory-mode", "accounting", "--db-path", str(tmp_path / "d.db"),
         "--listen", f"unix://{tmp_path}/s.sock", "--check-config"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "kvbudget daemon: error: token_cap applies to K/V attention layers, not MLA latents"
    ]


# ------------------------------------------------------------------ the offline replayer
ONE_LONG_REQUEST = "arrival_s,prompt_tokens,output_tokens\n0,1500,16\n"


def replay(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    trace = tmp_path / "one.csv"
    trace.write_text(ONE_LONG_REQUEST)
    return subprocess.run(
        [sys.executable, "-m", "kvbudget", "replay", str(trace), *args],
        capture_output=True, text=True, timeout=120,
    )


def test_replay_admits_by_the_capped_formula(tmp_path: Path) -> None:
    pool = ("--offline", "--num-gpu-blocks", "65", "--max-model-len", "2048", "--json")
    # 1,500 + 16 tokens: cdiv(1516, 16) = 95 blocks > 64 usable, rejected (never fits)
    plain = json.loads(replay(tmp_path, *pool).stdout)
    assert (plain["rejected"], plain["finished"]) == (1, 0)
    # capped at 512: 32 blocks, half the pool, all the time it runs
    capped = json.loads(replay(tmp_path, *pool, "--token-cap", "512").stdout)
    assert (capped["rejected"], capped["finished"], capped["mean_kv_usage"]) == (0, 1, 0.5)
    assert "every attention layer capped at 512 tokens" in capped["notes"]


@pytest.mark.parametrize("args, line", [
    (("--offline", "--token-cap", "0"), "kvbudget replay: error: --token-cap must be >= 1, got '0'"),
    (("--offline", "--model", "deepseek-v3", "--token-cap", "512"),
     "kvbudget replay: error: --token-cap applies to K/V attention layers, not MLA latents"),
])
def test_replay_refuses_a_bad_cap_in_one_line(tmp_path: Path, args: tuple[str, ...], line: str) -> None:
    result = replay(tmp_path, *args)
    assert result.returncode != 0 and result.stderr.splitlines() == [line]


def test_the_cap_is_offline_only_for_replay(tmp_path: Path) -> None:
    result = replay(tmp_path, "--token-cap", "512")
    assert result.returncode != 0 and "--token-cap: offline only" in result.stderr
    assert "Traceback" not in result.stderr


# ------------------------------------------------------------------ a running daemon
async def _second_request_after_a_long_one(daemon: DaemonProcess):
    """The second request's (kind, reason), and a snapshot taken while both are live."""
    async with EngineClient(daemon.target, "engine") as engine, ObserverClient(daemon.target) as observer:
        [long] = await engine.step(submits=[RequestSpec("long", 1000, 16)])
        assert (long.kind, long.reason) == (DecisionKind.ADMIT, Reason.FITS)
        [short] = await engine.step(submits=[RequestSpec("short", 400, 16)])
        return (short.kind.value, short.reason.value), await observer.snapshot()


@pytest.mark.slow
async def test_a_capped_request_is_admitted_where_an_uncapped_one_queues(tmp_path: Path) -> None:
    # Uncapped: the 1,000-token prompt takes 63 of the 64 blocks; the 400-token one needs
    # 25 and queues. Capped at 512: the first takes 32, the second 25 of the 32 left.
    (tmp_path / "plain").mkdir()
    with DaemonProcess(tmp_path / "plain") as daemon:
        second, snapshot = await _second_request_after_a_long_one(daemon)
    assert second == ("queue", "pool_full")
    assert (snapshot.num_held_blocks, snapshot.num_free_blocks) == (63, 1)
    [row] = layer_rows(snapshot.groups)
    assert row.label == "full"
    (tmp_path / "capped").mkdir()
    with DaemonProcess(tmp_path / "capped", "--token-cap", "512") as daemon:
        second, snapshot = await _second_request_after_a_long_one(daemon)
    assert second == ("admit", "fits")
    assert (snapshot.num_held_blocks, snapshot.num_free_blocks) == (57, 7)  # 32 + 25
    # the plan engines receive, and the dashboard's layer panel, say the cap
    assert [g.token_cap for g in snapshot.plan.groups] == [512]
    [row] = layer_rows(snapshot.groups)
    assert (row.label, row.layers, row.held) == ("capped 512", 32, 57)
