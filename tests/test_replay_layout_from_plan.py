"""A live replay's simulated engine rebuilds the daemon's layout from its pool plan
(`layout.layout_from_plan`, for live replay and the doctor): every group must count blocks as the daemon's does.

plan_to_proto(layout) -> layout_from_plan -> the same kind per group, and the same
worst-case (and held) blocks per group as the original layout, for every shipped preset,
a capped model and a cross-attention one.
"""

from __future__ import annotations

import pytest

from kvbudget.daemon.wire.layout import layout_from_plan
from kvbudget.daemon.core import budget
from kvbudget.daemon.wire.convert import plan_to_proto
from kvbudget.daemon.config.hf_config import PRESETS_DIR, load_model
from kvbudget.daemon.core.spec import AttentionSpec, CrossAttentionSpec, KVCacheLayout, group_layers, kv_dtype
from kvbudget.v1 import common_pb2

PRESETS = sorted(p.stem for p in PRESETS_DIR.glob("*.json"))
BATCHED_TOKENS = (512, 8192)


def _round_trip(layout: KVCacheLayout) -> KVCacheLayout:
    plan = plan_to_proto(layout, 1000, max_model_len=131072, max_num_batched_tokens=8192)
    return layout_from_plan(plan)


def _cross_attention_layout() -> KVCacheLayout:
    """An encoder-decoder model: 2 self-attention layers, 2 cross-attention layers over a
    1,500-token encoder output (Whisper's)."""
    bf16 = kv_dtype("bf16")
    self_attention = AttentionSpec(16, 8, 128, bf16)
    cross = CrossAttentionSpec(16, 8, 128, bf16, max_encoder_tokens=1500)
    return group_layers([self_attention, self_attention, cross, cross], model_name="encoder-decoder")


def _layouts() -> list[tuple[str, KVCacheLayout]]:
    layouts = [(name, load_model(name).layout) for name in PRESETS]
    layouts.append(("llama-3.1-8b capped", load_model("llama-3.1-8b", token_cap=1000).layout))
    layouts.append(("encoder-decoder", _cross_attention_layout()))
    return layouts


def test_every_preset_counts_the_same_blocks_per_group_after_the_plan():
    # One test over all of them (not parametrised): Jamba's Mamba groups, DeepSeek's MLA
    # group, the capped and the cross-attention groups are what the old rebuild got wrong.
    assert "jamba-v0.1" in PRESETS and "llama-4-scout" in PRESETS and "deepseek-v3" in PRESETS
    for name, layout in _layouts():
        rebuilt = _round_trip(layout)
        B = layout.block_size
        assert rebuilt.block_size == B, name
        assert [g.kind for g in rebuilt.groups] == [g.kind for g in layout.groups], name
        assert [g.layer_ids for g in rebuilt.groups] == [g.layer_ids for g in layout.groups], name
        # Block edges, the windows' and chunks' edges, past the cap and the encoder length.
        for num_tokens in (1, B - 1, B, B + 1, 127, 129, 1000, 1501, 4097, 8193, 16385, 100_000, 131072):
            for F in BATCHED_TOKENS:
                expected = budget.request_worst_case(layout, num_tokens, F).per_group
                assert budget.request_worst_case(rebuilt, num_tokens, F).per_group == expected, (name, num_tokens, F)
            for num_computed in (0, num_tokens // 2, num_tokens - 1):
                expected = _held(layout, num_tokens, num_computed)
                assert _held(rebuilt, num_tokens, num_computed) == expected, name


def _held(layout: KVCacheLayout, num_tokens: int, num_computed: int) -> tuple[int, ...]:
    """budget.blocks_held per group."""
    return tuple(budget.blocks_held(g.spec, num_tokens, num_computed) for g in layout.groups)


def test_hybrid_worst_cases_after_the_plan_by_hand():
    # Jamba: block size 80 (raised so a page holds a Mamba state), 7 Mamba groups of one
    # state page each, 1 full-attention group: 100,000 tokens -> 7 x 1 + cdiv(100000, 80) = 1250.
    jamba = _round_trip(load_model("jamba-v0.1").layout)
    assert budget.request_worst_case(jamba, 100_000, 8192).per_group == (1,) * 7 + (1250,)
    # Llama 4 Scout: 3 chunked groups, C = 8192, B = 16, F = 8192: cdiv(min(8192 + 8192,
    # 100000), 16) = 1024 each; the full-attention group cdiv(100000, 16) = 6250.
    scout = _round_trip(load_model("llama-4-scout").layout)
    assert budget.request_worst_case(scout, 100_000, 8192).per_group == (1024, 1024, 1024, 6250)
    # Capped at 1,000 tokens: a 5,000-token request holds cdiv(1000, 16) = 63, not 313.
    capped = _round_trip(load_model("llama-3.1-8b", token_cap=1000).layout)
    assert budget.request_worst_case(capped, 5000, 8192).per_group == (63,)
    # Cross attention over 1,500 encoder tokens: cdiv(1500, 16) = 94 whatever the request's
    # length; self-attention cdiv(5000, 16) = 313.
    cross = _round_trip(_cross_attention_layout())
    assert budget.request_worst_case(cross, 5000, 8192).per_group == (313, 94)


def test_a_cross_attention_group_without_its_encoder_length_is_refused_naming_it():
    plan = common_pb2.PoolPlan(block_size_tokens=16, groups=[
        common_pb2.KVCacheGroup(group_index=0, layer_type="full_attention", layer_ids=[0]),
        common_pb2.KVCacheGroup(group_index=1, layer_type="cross_attention", description="cross_attention",
                                layer_ids=[1]),
    ])  # fmt: skip
    with pytest.raises(ValueError, match=r"group 1 \(cross_attention\) does not say its encoder length"):
        layout_from_plan(plan)
