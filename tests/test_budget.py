"""Budget formulas: hand-computed cases (arithmetic in comments) and properties."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvbudget.daemon.core import budget
from kvbudget.daemon.core.pool import NULL_BLOCK, BlockPool
from kvbudget.daemon.core.spec import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    CappedAttentionSpec,
    CrossAttentionSpec,
    MambaSpec,
    MLASpec,
    SlidingWindowSpec,
    group_layers,
    kv_dtype,
)

FP16 = kv_dtype("fp16")
B = 16


def full(heads: int = 8, head: int = 128) -> AttentionSpec:
    return AttentionSpec(block_size=B, num_kv_heads=heads, head_size=head, dtype=FP16)


def swa(window: int, heads: int = 8, head: int = 128) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=B, num_kv_heads=heads, head_size=head, dtype=FP16, sliding_window=window
    )


# ------------------------------------------------------------------ worst case per group


def test_full_attention_worst_case_is_cdiv_of_length() -> None:
    # cdiv(16384, 16) = 1024; cdiv(16385, 16) = 1025; cdiv(1, 16) = 1
    assert budget.worst_case_blocks(full(), 16384, 1024) == 1024
    assert budget.worst_case_blocks(full(), 16385, 1024) == 1025
    assert budget.worst_case_blocks(full(), 1, 1024) == 1
    assert budget.worst_case_blocks(full(), 0, 1024) == 0


def test_sliding_window_worst_case_matches_vllm() -> None:
    # W=4096, F=1024, L=16384: cdiv(min(4095 + 1024, 16384), 16) + 1 = cdiv(5119, 16) + 1
    #   = 320 + 1 = 321
    assert budget.worst_case_blocks(swa(4096), 16384, 1024) == 321
    # A request shorter than the window holds all its blocks and never more:
    # L=100: cdiv(100, 16) = 7 (vLLM's formula would say 8; 7 is the most 100 tokens can hold)
    assert budget.worst_case_blocks(swa(4096), 100, 1024) == 7


def test_chunked_local_worst_case() -> None:
    spec = ChunkedLocalAttentionSpec(
        block_size=B, num_kv_heads=8, head_size=128, dtype=FP16, attention_chunk_size=8192
    )
    # C=8192, F=2048, L=100000: cdiv(min(8192 + 2048, 100000), 16) = cdiv(10240, 16) = 640
    assert budget.worst_case_blocks(spec, 100_000, 2048) == 640
    # L=5000 < C + F: cdiv(5000, 16) = 313
    assert budget.worst_case_blocks(spec, 5000, 2048) == 313


def test_capped_cross_and_mamba_worst_case() -> None:
    capped = CappedAttentionSpec(B, 8, 128, FP16, token_cap=2048)
    # min(100000, 2048) = 2048 tokens -> 2048 / 16 = 128 blocks; short request 1000 -> 63
    assert budget.worst_case_blocks(capped, 100_000, 8192) == 128
    assert budget.worst_case_blocks(capped, 1000, 8192) == 63
    cross = CrossAttentionSpec(B, 8, 128, FP16, max_encoder_tokens=1500)
    # cdiv(1500, 16) = 94, whatever the decoder length
    assert budget.worst_case_blocks(cross, 10, 8192) == 94
    mamba = MambaSpec(block_size=B, state_bytes=1 << 20)
    assert budget.worst_case_blocks(mamba, 100_000, 8192) == 1


# --------------------------------------------------------------- max concurrency cases
# max_model_len 16384, F 1024, block 16, 32 layers, 8 KV heads, head 128, fp16.
# Page = 16 * 8 * (128 + 128) * 2 = 65536 bytes per layer and block.


def test_max_concurrency_full_attention() -> None:
    layout = group_layers([full()] * 32)
    # one group of 32 layers; a request needs cdiv(16384, 16) = 1024 blocks.
    # 10240 blocks / 1024 = 10.0 concurrent requests.
    assert layout.group_size == 32 and layout.num_groups == 1
    assert layout.bytes_per_block == 65536 * 32
    assert budget.max_concurrency(10240, layout, 16384, 1024) == 10.0
    assert budget.naive_max_concurrency(10240, layout, 16384) == 10.0


def test_max_concurrency_all_sliding_window() -> None:
    layout = group_layers([swa(4096)] * 32)
    # one group; a request needs cdiv(min(4095 + 1024, 16384), 16) + 1 = 321 blocks.
    # 10240 / 321 = 31.900...; naive charges 1024 -> 10.0
    assert budget.max_concurrency(10240, layout, 16384, 1024) == 10240 / 321
    assert int(budget.max_concurrency(10240, layout, 16384, 1024)) == 31
    assert budget.naive_max_concurrency(10240, layout, 16384) == 10.0


def test_max_concurrency_half_and_half_hybrid() -> None:
    # 16 SWA + 16 full layers alternating: two types of 16 layers -> group size 16, two groups.
    layers = [swa(4096) if i % 2 == 0 else full() for i in range(32)]
    layout = group_layers(layers)
    assert layout.group_size == 16 and layout.num_groups == 2
    # A pool block now spans 16 layers: bytes per block = 65536 * 16 = 1 MiB.
    assert layout.bytes_per_block == 1 << 20
    # Per request: SWA group 321 + full group 1024 = 1345 blocks.
    # With the same 20 GiB as 10240 full-model blocks: 20 GiB / 1 MiB = 20480 blocks.
    # 20480 / 1345 = 15.226...; naive: 20480 / (1024 + 1024) = 10.0
    per_request = budget.request_worst_case(layout, 16384, 1024)
    assert per_request.per_group == (321, 1024) and per_request.total == 1345
    assert budget.max_concurrency(20480, layout, 16384, 1024) == 20480 / 1345
    assert budget.naive_max_concurrency(20480, layout, 16384) == 10.0


def test_gemma3_style_grouping() -> None:
    # 62 layers, every 6th full: 10 full + 52 sliding. min 10, max 52 (not under 1.5x)
    # -> group size 10: cdiv(52, 10) = 6 sliding groups, the 52 layers dealt round-robin
    # (as vLLM deals them) -> 9, 9, 9, 9, 8, 8; + 1 full group of 10.
    layers = [full() if (i + 1) % 6 == 0 else swa(1024) for i in range(62)]
    layout = group_layers(layers)
    kinds = [g.kind.value for g in layout.groups]
    assert layout.group_size == 10
    assert kinds.count("sliding_window") == 6 and kinds.count("full_attention") == 1
    assert sorted(len(g.layer_ids) for g in layout.groups) == [8, 8, 9, 9, 9, 9, 10]


def test_max_model_len_auto_in_8_gib() -> None:
    # 32 layers, 32 KV heads, head 128, fp16: page = 16 * 32 * 256 * 2 = 262144 (256 KiB),
    # block = 32 layers * 256 KiB = 8 MiB; 8 GiB / 8 MiB = 1024 blocks = 16384 tokens.
    layout = group_layers([full(heads=32)] * 32)
    assert layout.page_size_bytes == 262144
    num_blocks = (8 << 30) // layout.bytes_per_block
    assert num_blocks == 1024
    assert budget.max_model_len_that_fits(num_blocks, layout, 2048, upper=131072) == 16384


def test_mla_and_fp8_page_sizes() -> None:
    # DeepSeek-V3 MLA: 16 * (512 + 64) * 2 bytes = 18432
    assert MLASpec(B, 512, 64, FP16).page_size_bytes == 18432
    # fp8: 16 * (512 + 64) * 1 = 9216
    assert MLASpec(B, 512, 64, kv_dtype("fp8")).page_size_bytes == 9216
    # Llama-3.1-8B attention in fp8: 16 * 8 * (128 + 128) * 1 = 32768
    assert AttentionSpec(B, 8, 128, kv_dtype("fp8")).page_size_bytes == 32768
    # int4 with per-vector fp16 scale + zero: each K or V vector = 128 * 4 / 8 + 4 = 68 bytes;
    # 16 * 8 * (68 + 68) = 17408
    assert AttentionSpec(B, 8, 128, kv_dtype("int4")).page_size_bytes == 17408
    # int2: 128 * 2 / 8 + 4 = 36 bytes per vector; 16 * 8 * 72 = 9216
    assert AttentionSpec(B, 8, 128, kv_dtype("int2")).page_size_bytes == 9216


# -------------------------------------------------------------- sliding-window schedule


def test_sliding_window_freeing_schedule_block_2_window_4() -> None:
    # Block size 2, window 4: after `computed` tokens the first max(0, computed - 3) tokens are
    # out of the window, so (computed - 3) // 2 leading blocks can go.
    spec = SlidingWindowSpec(block_size=2, num_kv_heads=1, head_size=8, dtype=FP16, sliding_window=4)
    schedule = {c: budget.blocks_out_of_window(spec, c) for c in range(0, 11)}
    assert schedule == {0: 0, 1: 0, 2: 0, 3: 0, 4: 0, 5: 1, 6: 1, 7: 2, 8: 2, 9: 3, 10: 3}
    # Holding 11 slots (cdiv(11, 2) = 6 blocks) after 10 computed: 6 - 3 = 3 blocks held.
    assert budget.blocks_held(spec, 11, 10) == 3


def test_chunked_freeing() -> None:
    spec = ChunkedLocalAttentionSpec(
        block_size=4, num_kv_heads=1, head_size=8, dtype=FP16, attention_chunk_size=8
    )
    # Chunk 8, block 4: once 8 tokens are computed, the first chunk (2 blocks) is out of view.
    assert [budget.blocks_out_of_window(spec, c) for c in (0, 7, 8, 15, 16)] == [0, 0, 2, 2, 4]


def test_cache_hit_never_covers_whole_prompt() -> None:
    layout = group_layers([full()] * 4)
    # 64-token prompt = 4 full blocks all cached: at most (64 - 1) // 16 = 3 blocks = 48 tokens
    # may be skipped, the last block is recomputed for the logits.
    assert budget.cache_hit_tokens(layout.groups, [4], 64) == 48
    assert budget.cache_hit_tokens(layout.groups, [2], 64) == 32


# ---------------------------------------------------------------------------- properties


spec_strategy = st.one_of(
    st.builds(lambda: AttentionSpec(4, 1, 8, FP16)),
    st.integers(1, 40).map(lambda w: SlidingWindowSpec(4, 1, 8, FP16, sliding_window=w)),
    st.integers(1, 10).map(
        lambda k: ChunkedLocalAttentionSpec(4, 1, 8, FP16, attention_chunk_size=4 * k)
    ),
    st.integers(1, 40).map(lambda cap: CappedAttentionSpec(4, 1, 8, FP16, token_cap=cap)),
)


@given(
    spec=spec_strategy,
    prompt=st.integers(1, 120),
    output=st.integers(0, 60),
    F=st.integers(1, 32),
)
def test_budget_never_undercounts_a_real_allocation(spec, prompt, output, F) -> None:
    """Drive one request through chunked prefill and decode on a real pool; the most blocks it
    ever holds never exceeds the worst-case formula."""
    L = prompt + output
    pool = BlockPool(1000)
    table: list[int] = []
    computed = 0
    peak = 0
    while computed < L:
        # Next step: up to F prompt tokens during prefill, then one token per step.
        step = min(F, prompt - computed) if computed < prompt else 1
        num_tokens = computed + step
        # Grow the table to the slots needed, then count what is actually held.
        slots = budget.block_slots(spec, num_tokens)
        if slots > len(table):
            table.extend(pool.allocate(slots - len(table)))
        held_now = sum(1 for b in table if b != NULL_BLOCK)
        assert held_now == budget.blocks_held(spec, num_tokens, computed)
        peak = max(peak, held_now)
        computed = num_tokens
        # After the step: release what left the window into the null block.
        gone = budget.blocks_out_of_window(spec, computed)
        for i in range(min(gone, len(table))):
            if table[i] != NULL_BLOCK:
                pool.free([table[i]])
                table[i] = NULL_BLOCK
    assert peak <= budget.worst_case_blocks(spec, L, F)
    pool.free(reversed(table))
    pool.check_integrity()
    assert pool.num_free_blocks == pool.capacity
