"""QA: the worst-case formulas bound what a request really holds for ANY step pattern
within the engine contract (each step's slots at most F past what is computed), not only
aligned chunks of F: partial chunks (the token budget shared with other requests), decode,
and growth F ahead. Windows and chunks of any size, multiples of the block size or not."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvbudget.daemon.core import budget
from kvbudget.daemon.core.spec import (
    KV_DTYPES,
    AttentionSpec,
    CappedAttentionSpec,
    ChunkedLocalAttentionSpec,
    SlidingWindowSpec,
)

FP16 = KV_DTYPES["fp16"]


@st.composite
def specs(draw):
    B = draw(st.sampled_from([1, 4, 8, 16]))
    n = draw(st.integers(1, 48))
    return draw(st.sampled_from([
        AttentionSpec(B, 1, 8, FP16),
        SlidingWindowSpec(B, 1, 8, FP16, sliding_window=n),
        ChunkedLocalAttentionSpec(B, 1, 8, FP16, attention_chunk_size=n),
        CappedAttentionSpec(B, 1, 8, FP16, token_cap=n),
    ]))


@settings(max_examples=400, deadline=None)
@given(spec=specs(), L=st.integers(1, 150), F=st.integers(1, 24), data=st.data())
def test_held_never_exceeds_the_worst_case_for_any_step_pattern(spec, L, F, data):
    worst = budget.worst_case_blocks(spec, L, F)
    computed = 0
    while computed < L:
        slots = data.draw(st.integers(computed + 1, min(L, computed + F)), label="slots")
        held = budget.blocks_held(spec, slots, computed)
        assert held <= worst, (spec.describe(), spec.block_size, computed, slots, held, worst)
        computed = data.draw(st.integers(computed + 1, slots), label="computed")


def test_chunked_worst_case_is_reached_when_the_chunk_starts_mid_block():
    # C = 12, B = 8, F = 10: 23 computed (chunk [12, 24) starts in block 1), 33 slots:
    # blocks 1..4 held = cdiv(33, 8) - 12 // 8 = 5 - 1 = 4 = the worst case, no more.
    spec = ChunkedLocalAttentionSpec(8, 1, 8, FP16, attention_chunk_size=12)
    assert budget.blocks_held(spec, 33, 23) == 4 == budget.worst_case_blocks(spec, 1000, 10)
