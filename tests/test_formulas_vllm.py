"""Layouts and state sizes checked against vLLM v1's rules, with every figure by hand.

vLLM's rules, in our words (kv_cache_utils / kv_cache_interface / the hybrid-model config
hooks and mamba_utils of vLLM's v1 engine):
- group size: the smallest layer type's count, or the largest's when the largest is
  under 1.5x the smallest; a type of n layers is cdiv(n, group size) groups, its layers
  dealt round-robin over them;
- a state layer (Mamba 1/2, gated delta net) holds conv + recurrent state per request;
  the attention block size is raised to the least multiple of 16 tokens whose page holds
  that state, and the state page is padded to the attention page.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvbudget.daemon.core import budget
from kvbudget.daemon.config.hf_config import mamba_state_bytes, model_from_config
from kvbudget.daemon.core.spec import AttentionSpec, LayerKind, SlidingWindowSpec, group_layers, kv_dtype

BF16 = kv_dtype("bf16")


def full() -> AttentionSpec:
    return AttentionSpec(16, 8, 128, BF16)  # page 16 x 8 x 256 x 2 = 65536 B


def swa(window: int) -> SlidingWindowSpec:
    return SlidingWindowSpec(16, 8, 128, BF16, sliding_window=window)


# ---------------------------------------------------------------- grouping


def test_group_size_is_the_largest_type_under_one_and_a_half_times_the_smallest() -> None:
    # 10 full + 14 sliding (W 1024). 14 < 1.5 x 10 = 15 -> group size 14 (vLLM pads the
    # 10 full layers to 14 rather than cutting the 14 sliding ones into 10 + 4).
    # Groups: 1 sliding of 14 + 1 full of 10 (4 padded slots) = 2 groups.
    # (Under 1.25x it would be group size 10 and 3 groups: 10 sliding, 4 sliding, 10 full.)
    layers = [full() if i % 12 < 5 else swa(1024) for i in range(24)]
    assert sum(isinstance(s, SlidingWindowSpec) for s in layers) == 14
    layout = group_layers(layers)
    assert layout.group_size == 14 and layout.num_groups == 2
    # A block spans 14 pages: 65536 x 14 = 917504 B. 20 GiB = 21474836480 B
    # -> 21474836480 // 917504 = 23405 blocks.
    assert layout.bytes_per_block == 917504
    assert (20 << 30) // layout.bytes_per_block == 23405
    # One request of 16384 tokens, F = 1024: sliding cdiv(min(1023 + 1024, 16384), 16) + 1
    # = cdiv(2047, 16) + 1 = 128 + 1 = 129; full cdiv(16384, 16) = 1024; total 1153.
    assert budget.request_worst_case(layout, 16384, 1024).total == 129 + 1024
    # vLLM's "Maximum concurrency": 23405 / 1153 = 20.299...
    assert budget.max_concurrency(23405, layout, 16384, 1024) == pytest.approx(20.2992, abs=1e-4)


def test_a_type_is_dealt_round_robin_over_its_groups() -> None:
    # 5 full + 12 sliding: 12 >= 7.5 -> group size 5; the sliding type is cdiv(12, 5) = 3
    # groups, dealt round-robin: sliding layers s[0::3], s[1::3], s[2::3] = 4, 4, 4 layers
    # (not 5, 5, 2). The block still spans 5 pages (the full group's 5 layers).
    layers = [full() if i in (3, 7, 10, 13, 16) else swa(512) for i in range(17)]
    layout = group_layers(layers)
    sliding = [i for i in range(17) if i not in (3, 7, 10, 13, 16)]
    assert layout.group_size == 5 and layout.bytes_per_block == 5 * 65536
    assert [g.layer_ids for g in layout.groups] == [
        tuple(sliding[0::3]),
        tuple(sliding[1::3]),
        tuple(sliding[2::3]),
        (3, 7, 10, 13, 16),
    ]
    assert [len(g.layer_ids) for g in layout.groups] == [4, 4, 4, 5]


# ---------------------------------------------------------------- state layers


def qwen3_next_80b(**overrides) -> dict:
    """Qwen/Qwen3-Next-80B-A3B-Instruct config.json, the fields KVBudget reads."""
    cfg = {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "hidden_size": 2048,
        "intermediate_size": 5120,
        "num_hidden_layers": 48,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": 4,
        "num_experts": 512,
        "num_experts_per_tok": 10,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "decoder_sparse_step": 1,
        "max_position_embeddings": 262144,
        "vocab_size": 151936,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    cfg.update(overrides)
    return cfg


def test_qwen3_next_gated_delta_net_layers_are_state_layers() -> None:
    m = model_from_config(qwen3_next_80b(), name="qwen3-next")
    # full_attention_interval 4: layers 3, 7, ..., 47 full (12), the other 36 linear.
    # Gated delta net state per layer and request, bf16:
    #   conv (4 - 1) x (2 x 16 x 128 + 32 x 128) = 3 x 8192 = 24576
    #   recurrent 32 x 128 x 128 = 524288          -> 548864 x 2 B = 1097728 B
    assert mamba_state_bytes(qwen3_next_80b(), 2) == 1_097_728
    # Attention per token: 2 KV heads x (256 + 256) x 2 B = 2048 B. Block size: 16 x
    # cdiv(1097728, 16 x 2048) = 16 x cdiv(1097728, 32768) = 16 x 34 = 544 tokens (the
    # "Setting attention block size to 544 tokens" vLLM logs for this model); page
    # 544 x 2048 = 1114112 B, the state page padded up to it.
    assert m.layout.block_size == 544
    assert m.layout.page_size_bytes == 1_114_112
    # 12 full, 36 state: 36 >= 18 -> group size 12: 3 state groups + 1 full group.
    kinds = [(g.kind, len(g.layer_ids)) for g in m.layout.groups]
    assert kinds == [(LayerKind.MAMBA, 12)] * 3 + [(LayerKind.FULL, 12)]
    assert m.layout.groups[-1].layer_ids == tuple(range(3, 48, 4))
    assert m.layout.bytes_per_block == 1_114_112 * 12
    # One request of 262144 tokens: full cdiv(262144, 544) = 482 (481.88), state 1 x 3.
    assert budget.request_worst_case(m.layout, 262144, 8192).per_group == (1, 1, 1, 482)


def test_qwen3_next_layer_types_spelled_out_read_the_same() -> None:
    types = ["linear_attention"] * 3 + ["full_attention"]
    cfg = qwen3_next_80b(layer_types=types * 12)
    del cfg["full_attention_interval"]
    m = model_from_config(cfg)
    assert m.layout.block_size == 544
    assert [g.kind for g in m.layout.groups].count(LayerKind.MAMBA) == 3


def granite_4_h_tiny(**overrides) -> dict:
    """ibm-granite/granite-4.0-h-tiny config.json (Mamba-2 hybrid), the fields read."""
    cfg = {
        "architectures": ["GraniteMoeHybridForCausalLM"],
        "model_type": "granitemoehybrid",
        "hidden_size": 1536,
        "intermediate_size": 512,
        "num_hidden_layers": 40,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        "layer_types": ["attention" if i in (5, 15, 25, 35) else "mamba" for i in range(40)],
        "mamba_n_heads": 48,
        "mamba_d_head": 64,
        "mamba_n_groups": 1,
        "mamba_d_state": 128,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "num_local_experts": 64,
        "num_experts_per_tok": 6,
        "max_position_embeddings": 131072,
        "vocab_size": 100352,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    }
    cfg.update(overrides)
    return cfg


def test_mamba2_state_counts_the_groups_b_and_c_in_the_conv_state() -> None:
    # Mamba-2, bf16: d_inner = 2 x 1536 = 3072;
    #   conv (4 - 1) x (3072 + 2 x 1 x 128) = 3 x 3328 = 9984
    #   SSM 48 heads x 64 x 128 = 393216          -> 403200 x 2 B = 806400 B
    # (the Mamba-1 formula, 3 x 3072 + 3072 x 128 = 402432 -> 804864 B, misses B and C)
    assert mamba_state_bytes(granite_4_h_tiny(), 2) == 806_400
    m = model_from_config(granite_4_h_tiny())
    # Attention per token: 4 x (128 + 128) x 2 = 2048 B; block 16 x cdiv(806400, 32768)
    # = 16 x 25 = 400 tokens; page 400 x 2048 = 819200 B, the state padded from 806400.
    assert m.layout.block_size == 400 and m.layout.page_size_bytes == 819_200
    assert "mamba page padded from 806400 to 819200 bytes" in m.layout.notes


def test_bamba_attn_layer_indices() -> None:
    cfg = granite_4_h_tiny(
        architectures=["BambaForCausalLM"], model_type="bamba", num_hidden_layers=32,
        hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
        mamba_n_heads=128, attn_layer_indices=[9, 18, 27], layer_types=None,
        num_local_experts=0, intermediate_size=14336,
    )  # fmt: skip
    del cfg["layer_types"]
    m = model_from_config(cfg)
    # State: d_inner 8192; conv 3 x (8192 + 256) = 25344; SSM 128 x 64 x 128 = 1048576
    # -> 1073920 x 2 = 2147840 B. Attention per token 8 x 256 x 2 = 4096 B; block
    # 16 x cdiv(2147840, 65536) = 16 x 33 = 528 tokens.
    assert m.layout.block_size == 528
    # 3 attention layers, 29 state layers: group size 3, cdiv(29, 3) = 10 state groups.
    kinds = [g.kind for g in m.layout.groups]
    assert kinds.count(LayerKind.MAMBA) == 10 and kinds.count(LayerKind.FULL) == 1
    assert m.layout.groups[-1].layer_ids == (9, 18, 27)


def nemotron_h(**overrides) -> dict:
    """nvidia/Nemotron-H-8B's fields, with a 12-layer hybrid_override_pattern."""
    cfg = {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "hidden_size": 4096,
        "intermediate_size": 21504,
        "num_hidden_layers": 12,
        "hybrid_override_pattern": "M-M*-M-M*-E-",
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "mamba_num_heads": 128,
        "mamba_head_dim": 64,
        "n_groups": 8,
        "ssm_state_size": 128,
        "conv_kernel": 4,
        "max_position_embeddings": 8192,
        "vocab_size": 131072,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    cfg.update(overrides)
    return cfg


def test_nemotron_h_pattern_mlp_layers_hold_no_cache() -> None:
    m = model_from_config(nemotron_h())
    # M-M*-M-M*-E-: mamba 0, 2, 5, 7; attention 3, 8; '-' and 'E' (6 layers) no cache.
    assert sorted(i for g in m.layout.groups for i in g.layer_ids) == [0, 2, 3, 5, 7, 8]
    assert m.num_layers == 12
    # 4 mamba, 2 attention: 4 >= 3 -> group size 2: 2 mamba groups + 1 attention group.
    assert [(g.kind, g.layer_ids) for g in m.layout.groups] == [
        (LayerKind.MAMBA, (0, 5)),
        (LayerKind.MAMBA, (2, 7)),
        (LayerKind.FULL, (3, 8)),
    ]
    # State: d_inner 128 x 64 = 8192; conv 3 x (8192 + 2 x 8 x 128) = 30720 x 2 B = 61440;
    # SSM 128 x 64 x 128 = 1048576 in float32 (vLLM's default for Nemotron-H when the
    # config names no mamba_ssm_cache_dtype) x 4 B = 4194304; total 4255744 B.
    assert mamba_state_bytes(nemotron_h(), 2) == 4_255_744
    # Attention per token 8 x 256 x 2 = 4096 B; block 16 x cdiv(4255744, 65536) = 16 x 65
    # = 1040 tokens; page 1040 x 4096 = 4259840 B.
    assert m.layout.block_size == 1040 and m.layout.page_size_bytes == 4_259_840
    # With the SSM state in bf16: 61440 + 2097152 = 2158592 B -> 16 x 33 = 528 tokens.
    assert mamba_state_bytes(nemotron_h(mamba_ssm_cache_dtype="bfloat16"), 2) == 2_158_592
    assert model_from_config(nemotron_h(mamba_ssm_cache_dtype="bfloat16")).layout.block_size == 528


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("M-M*-M-M*-E", "must be a string of 12 letters"),
        ("M-M*-M-M*-X-", "unsupported layer letter 'X'"),
        ("M-M--M-M--E-", "every layer mamba"),
    ],
)
def test_nemotron_h_bad_patterns_are_named(pattern: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        model_from_config(nemotron_h(hybrid_override_pattern=pattern))


def test_estimate_reads_a_local_qwen3_next_config(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(qwen3_next_80b()))
    result = subprocess.run(
        [sys.executable, "-m", "kvbudget", "estimate", "--model", str(path),
         "--num-gpu-blocks", "10000", "--json"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    # 262144 tokens: 482 attention blocks + 3 state blocks = 485; 10000 / 485 = 20.618...
    assert out["block_size"] == 544 and out["blocks_per_request"] == 485
    assert out["max_concurrency"] == pytest.approx(10000 / 485)
    # vLLM's GPU KV cache size: 10000 // 4 groups x 544 = 2500 x 544 = 1360000 tokens.
    assert out["kv_tokens"] == 1_360_000
