"""A Mamba hybrid under tensor parallel: each rank holds its share of every state layer,
and the attention block is sized on the rank's figures, as vLLM sizes them
(MambaStateShapeCalculator, and the platform's hybrid block alignment).

Jamba-v0.1 (the preset): hidden_size 4096, mamba_expand 2 -> d_inner 8192; mamba_d_conv 4,
mamba_d_state 16; 8 KV heads of 128 (4096 / 32 query heads); bf16; 32 layers, attention at
i % 8 == 4 (4 layers), the other 28 Mamba: 7 Mamba groups + 1 attention group of 4 layers.
On one of tp ranks:
  state       (3 conv + 16 SSM) x 8192 / tp x 2 B = 311,296 / tp B
  token page  (8 / tp) heads x (128 + 128) x 2 B  = 4,096 / tp B
  block       16 x cdiv(state, 16 x token page) = 16 x cdiv(4.75) = 80 tokens (tp <= 8)
  page        80 x token page = 327,680 / tp B; a block 4 pages = 1,310,720 / tp B
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvbudget.daemon.config.hf_config import load_model, model_from_config
from kvbudget.daemon.config.loading import load_config
from kvbudget.daemon.config.mamba_state import mamba_state_bytes
from kvbudget.daemon.config.pool_setup import PoolSetupError, setup_pool
from kvbudget.daemon.core.budget import request_worst_case

from test_estimate_cli import run, run_json
from test_formulas_vllm import granite_4_h_tiny, nemotron_h

JAMBA = {
    # tp: (state bytes, page bytes, bytes per block, blocks in 20e9 B)
    1: (311_296, 327_680, 1_310_720, 15_258),  # 20e9 // 1,310,720
    2: (155_648, 163_840, 655_360, 30_517),  # 20e9 // 655,360
    4: (77_824, 81_920, 327_680, 61_035),  # 20e9 // 327,680
    8: (38_912, 40_960, 163_840, 122_070),  # 20e9 // 163,840
}


@pytest.mark.parametrize("tp", sorted(JAMBA))
def test_jamba_state_and_pages_per_rank(tp: int) -> None:
    state, page, block, _ = JAMBA[tp]
    layout = load_model("jamba-v0.1", tensor_parallel_size=tp).layout
    assert layout.block_size == 80 and layout.group_size == 4
    assert layout.groups[0].spec.state_bytes == state
    assert layout.page_size_bytes == page and layout.bytes_per_block == block
    assert layout.groups[-1].spec.num_kv_heads == 8 // tp


def test_estimate_jamba_at_tp_2_4_8() -> None:
    single = run_json("--model", "jamba-v0.1", "--kv-cache-memory-bytes", "20e9", "--max-model-len", "100000")
    for tp in (2, 4, 8):
        out = run_json(
            "--model", "jamba-v0.1", "--tensor-parallel-size", str(tp), "--kv-cache-memory-bytes", "20e9",
            "--max-model-len", "100000",
        )  # fmt: skip
        _, page, block, blocks = JAMBA[tp]
        assert (out["page_size_bytes"], out["bytes_per_block"], out["num_blocks"]) == (page, block, blocks)
        # one engine's block over its tp GPUs is one GPU's block: 1,310,720 B
        assert out["parallel"]["bytes_per_block_per_engine"] == 1_310_720
        # a request's blocks: 7 Mamba pages + cdiv(100,000, 80) = 1,250 attention blocks
        assert out["blocks_per_request"] == single["blocks_per_request"] == 1_257


def test_past_8_ranks_the_replicated_head_makes_a_smaller_block() -> None:
    # tp 16: 8 KV heads replicated, one a rank: 512 B a token; state 19 x 8192 / 16 x 2 B
    # = 19,456 B; block 16 x cdiv(19,456, 16 x 512 = 8,192) = 16 x 3 = 48 tokens (80 on
    # fewer ranks); page 48 x 512 = 24,576 B, the state padded up to it.
    layout = load_model("jamba-v0.1", tensor_parallel_size=16).layout
    assert layout.block_size == 48 and layout.page_size_bytes == 24_576
    assert "mamba page padded from 19456 to 24576 bytes" in layout.notes
    # so a request's attention blocks change with it: cdiv(100,000, 48) = 2,084
    assert request_worst_case(layout, 100_000, 8192).per_group == (1,) * 7 + (2_084,)


def test_a_given_block_size_aligns_the_raised_block() -> None:
    # vLLM raises in steps of max(16, the block size given): given 32, 32 x cdiv(311,296,
    # 32 x 4,096 = 131,072) = 32 x 3 = 96 tokens (not 80); given 64, 64 x cdiv(311,296,
    # 262,144) = 128; given 128, its page 524,288 B already holds the state: kept.
    for given, block in ((16, 80), (32, 96), (64, 128), (128, 128)):
        assert load_model("jamba-v0.1", block_size=given).layout.block_size == block


def test_mamba2_state_per_rank_copies_a_single_group() -> None:
    # granite-4.0-h-tiny: d_inner 2 x 1536 = 3072, 48 SSM heads of 64, 1 group, d_state
    # 128, d_conv 4. tp 2: the one group is copied to each rank (counts as 2), conv
    # 3 x (3072 + 2 x 2 x 128) / 2 = 5,376; SSM 48 / 2 x 64 x 128 = 196,608; x 2 B = 403,968.
    assert mamba_state_bytes(granite_4_h_tiny(), 2, tp=2) == 403_968
    # Nemotron-H: 128 heads of 64, 8 groups, d_state 128, SSM state float32. tp 4: conv
    # 3 x (8192 + 2 x 8 x 128) / 4 = 7,680 x 2 B = 15,360; SSM 32 x 64 x 128 x 4 B = 1,048,576.
    assert mamba_state_bytes(nemotron_h(), 2, tp=4) == 1_063_936


def test_a_split_vllm_refuses_is_refused_naming_the_setting() -> None:
    with pytest.raises(ValueError, match=r"^tensor_parallel_size 16 does not divide the mamba layer's 8 groups"):
        mamba_state_bytes(nemotron_h(), 2, tp=16)  # 8 groups over 16 ranks
    cfg = {"hidden_size": 1000, "mamba_expand": 1, "mamba_d_conv": 4, "mamba_d_state": 16}
    with pytest.raises(ValueError, match=r"^tensor_parallel_size 16 does not divide the mamba layer's d_inner"):
        mamba_state_bytes(cfg, 2, tp=16)  # 1000 % 16 = 8
    # granite-tiny's 12 query heads, 4 KV heads: tp 8 replicates the KV heads, but vLLM
    # also needs the query heads split evenly, and 12 % 8 = 4
    with pytest.raises(ValueError, match=r"^tensor_parallel_size 8 does not divide the model's 12 attention heads"):
        model_from_config(granite_4_h_tiny(), tensor_parallel_size=8)
    # 48 SSM heads over 32 ranks (with 32 query heads and 8 KV heads that would split)
    cfg = {**granite_4_h_tiny(), "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64}
    with pytest.raises(ValueError, match=r"^tensor_parallel_size 32 does not divide the mamba layer's SSM heads \(48\)"):
        model_from_config(cfg, tensor_parallel_size=32)


def test_estimate_and_replay_refuse_tp_3_in_one_line() -> None:
    result = run("--model", "jamba-v0.1", "--tensor-parallel-size", "3", "--kv-cache-memory-bytes", "20e9")
    assert result.returncode != 0 and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "--tensor-parallel-size 3 neither divides the model's 8 KV heads" in result.stderr
    replay = subprocess.run(
        [sys.executable, "-m", "kvbudget", "replay", "azure", "--offline", "--model", "jamba-v0.1",
         "--kv-cache-memory-bytes", "20e9", "--limit", "5", "--tensor-parallel-size", "3"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert replay.returncode != 0 and replay.stderr.count("\n") == 1
    assert "--tensor-parallel-size 3 neither divides" in replay.stderr


def _config(tmp_path: Path, parallel: str):
    path = tmp_path / "kvbudget.toml"
    path.write_text(
        '[model]\nname = "jamba-v0.1"\nmax_model_len = 100000\n[pool]\nmemory_mode = "accounting"\n'
        f"kv_cache_memory_bytes = 20e9\n[parallel]\n{parallel}\n"
    )
    return load_config(path)


def test_daemon_sizes_one_rank_and_pipeline_stages(tmp_path: Path) -> None:
    setup = setup_pool(_config(tmp_path, "tensor_parallel_size = 4"), gpu=None)
    assert (setup.model.layout.block_size, setup.sizing.bytes_per_block, setup.num_blocks) == (80, 327_680, 61_035)
    # tp 2 x pp 2: stages 0-15 and 16-31; each group's 4 layers are dealt 2 and 2 (the
    # Mamba groups take every 7th Mamba layer, attention is 4, 12 | 20, 28), so a block
    # is 2 pages of 163,840 B = 327,680 B: 61,035 blocks again
    both = setup_pool(_config(tmp_path, "tensor_parallel_size = 2\npipeline_parallel_size = 2"), gpu=None)
    assert (both.sizing.bytes_per_block, both.num_blocks) == (327_680, 61_035)
    with pytest.raises(PoolSetupError, match=r"^tensor_parallel_size 3 neither divides"):
        setup_pool(_config(tmp_path, "tensor_parallel_size = 3"), gpu=None)


def test_daemon_check_config_and_offline_replay_accept_it(tmp_path: Path) -> None:
    check = subprocess.run(
        [sys.executable, "-m", "kvbudget", "daemon", "--model", "jamba-v0.1", "--db-path", str(tmp_path / "d.db"),
         "--listen", f"unix://{tmp_path}/s.sock", "--check-config", "--tensor-parallel-size", "8",
         "--memory-mode", "accounting", "--kv-cache-memory-bytes", "20e9"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr
    assert "122070 blocks of 80 tokens" in check.stdout
    replay = subprocess.run(
        [sys.executable, "-m", "kvbudget", "replay", "azure", "--offline", "--model", "jamba-v0.1",
         "--kv-cache-memory-bytes", "20e9", "--limit", "5", "--tensor-parallel-size", "4", "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert replay.returncode == 0, replay.stderr
    assert '"num_blocks": 61034' in replay.stdout  # 61,035 less the null block
