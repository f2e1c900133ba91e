"""QA: exact block counts computed by hand, per layer type, through the controller.

B = 8 tokens a block throughout. Each test writes its arithmetic next to the assertion.
"""

from __future__ import annotations

from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController
from kvbudget.daemon.core.budget import blocks_held, worst_case_blocks
from kvbudget.daemon.core.records import DecisionKind, Reason, RequestSpec
from kvbudget.daemon.core.spec import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    MambaSpec,
    MLASpec,
    SlidingWindowSpec,
    group_layers,
)

from test_admission_support import B, BF16

FULL = AttentionSpec(B, 1, 8, BF16)


def ctrl_for(specs, num_blocks, *, policy="optimistic", F=64, max_model_len=200, caching=True):
    config = AdmissionConfig(
        max_model_len=max_model_len, max_num_batched_tokens=F, policy=policy,
        enable_prefix_caching=caching, watermark=0.0,
    )
    return AdmissionController(group_layers(specs), num_blocks, config)


def one(decisions, kind):
    found = [d for d in decisions if d.kind is kind]
    assert len(found) == 1, decisions
    return found[0]


# ------------------------------------------------------------------ worst case, per kind


def test_worst_case_per_kind_by_hand():
    F = 64
    # full / MLA, L = 50: cdiv(50, 8) = 7
    assert worst_case_blocks(FULL, 50, F) == 7
    assert worst_case_blocks(MLASpec(B, 16, 8, BF16), 50, F) == 7
    # sliding W = 12, L = 200, F = 16: cdiv(min(11 + 16, 200), 8) + 1 = cdiv(27, 8) + 1 = 4 + 1 = 5
    assert worst_case_blocks(SlidingWindowSpec(B, 1, 8, BF16, sliding_window=12), 200, 16) == 5
    # ... capped at cdiv(L, 8): L = 50, F = 64: min(cdiv(min(75, 50), 8) + 1, cdiv(50, 8)) = min(8, 7) = 7
    assert worst_case_blocks(SlidingWindowSpec(B, 1, 8, BF16, sliding_window=12), 50, 64) == 7
    # chunked C = 16, L = 200, F = 16: cdiv(min(16 + 16, 200), 8) = 4
    assert worst_case_blocks(ChunkedLocalAttentionSpec(B, 1, 8, BF16, attention_chunk_size=16), 200, 16) == 4
    # cross attention, 20 encoder tokens: cdiv(20, 8) = 3, whatever L
    assert worst_case_blocks(CrossAttentionSpec(B, 1, 8, BF16, max_encoder_tokens=20), 1000, F) == 3
    # Mamba, 2 pages a request, whatever L
    assert worst_case_blocks(MambaSpec(B, 64, pages_per_request=2), 1000, F) == 2


def test_sliding_window_hybrid_admit_reclaim_grow_by_hand():
    """gpt-oss-like: one sliding group W = 12 and one full group, F = 64, prompt 40, L = 50."""
    ctrl = ctrl_for([SlidingWindowSpec(B, 1, 8, BF16, sliding_window=12), FULL], 30, policy="guaranteed")
    d = one(ctrl.submit(RequestSpec("r", 40, 10), 0.0), DecisionKind.ADMIT)
    # first chunk min(40, 0 + 64) = 40 slots: cdiv(40, 8) = 5 blocks in each group
    assert d.blocks_held == (5, 5)
    # guaranteed base at L = 50: sliding min(cdiv(min(11 + 64, 50), 8) + 1, cdiv(50, 8)) = 7; full 7
    assert d.blocks_reserved == (7, 7)
    assert ctrl.pool.num_free_blocks == 30 - 10
    # 40 computed: tokens before 40 - 12 + 1 = 29 are out of view: 29 // 8 = 3 leading blocks go
    d = one(ctrl.progress("r", 40, 1.0), DecisionKind.RECLAIM)
    assert d.freed_blocks == 3 and d.blocks_held == (2, 5)
    assert ctrl.pool.num_free_blocks == 30 - 7
    # grow to 41: sliding cdiv(41, 8) - 3 = 3, full cdiv(41, 8) = 6
    d = one(ctrl.grow("r", 41, 2.0), DecisionKind.GROW)
    assert d.blocks_held == (3, 6) and ctrl.request("r").tables[0][:3] == [0, 0, 0]
    ctrl.check_integrity()
    one(ctrl.finish("r", 3.0), DecisionKind.RELEASE)
    assert ctrl.pool.num_held_blocks == 0 and ctrl.pool.num_free_blocks == 30


def test_chunked_local_admit_reclaim_by_hand():
    """llama-4-like: a chunked group C = 16 and a full group, prompt 40."""
    ctrl = ctrl_for([ChunkedLocalAttentionSpec(B, 1, 8, BF16, attention_chunk_size=16), FULL], 30)
    d = one(ctrl.submit(RequestSpec("r", 40, 10), 0.0), DecisionKind.ADMIT)
    assert d.blocks_held == (5, 5)  # cdiv(40, 8) each
    # 40 computed: the current chunk starts at (40 // 16) * 16 = 32: 32 // 8 = 4 blocks out
    d = one(ctrl.progress("r", 40, 1.0), DecisionKind.RECLAIM)
    assert d.freed_blocks == 4 and d.blocks_held == (1, 5)
    ctrl.check_integrity()


def test_mamba_holds_a_constant_per_request_by_hand():
    """jamba-like: three Mamba groups of 2 pages each and one full group, prompt 40, L = 200."""
    ctrl = ctrl_for([MambaSpec(B, 64, pages_per_request=2)] * 3 + [FULL], 60)
    d = one(ctrl.submit(RequestSpec("r", 40, None), 0.0), DecisionKind.ADMIT)
    assert d.blocks_held == (2, 2, 2, 5)  # 2 pages per Mamba group; cdiv(40, 8) = 5
    ctrl.progress("r", 40, 1.0)
    d = one(ctrl.grow("r", 100, 2.0), DecisionKind.GROW)
    assert d.blocks_held == (2, 2, 2, 13)  # cdiv(100, 8) = 13; the state does not grow
    ctrl.check_integrity()


def test_mla_counts_like_full_attention_by_hand():
    ctrl = ctrl_for([MLASpec(B, 16, 8, BF16)], 20, policy="guaranteed")
    d = one(ctrl.submit(RequestSpec("r", 17, 30), 0.0), DecisionKind.ADMIT)
    assert d.blocks_held == (3,) and d.blocks_reserved == (6,)  # cdiv(17, 8) = 3, cdiv(47, 8) = 6


# ------------------------------------------------------------------ chunk not a multiple of B


def test_chunk_not_a_multiple_of_the_block_size_stays_within_the_worst_case():
    """C = 12, B = 8: the current chunk may start mid-block, so the held span reaches back to
    the block boundary before it. After 23 tokens (chunk [12, 24)), growing F = 10 ahead to
    33 slots holds blocks 1..4 (tokens 8..32): cdiv(33, 8) - (23 // 12) * 12 // 8 = 5 - 1 = 4.
    vLLM's cdiv(min(C + F, L), B) = cdiv(22, 8) = 3 misses it; the worst case must be 4:
    the span is at most (B - gcd(C, B)) + (C - 1) + F = 4 + 11 + 10 = 25 tokens -> 4 blocks.
    A guaranteed request whose pool is exactly its worst case must never be denied."""
    chunked = ChunkedLocalAttentionSpec(B, 1, 8, BF16, attention_chunk_size=12)
    F = 10
    assert blocks_held(chunked, 33, 23) == 4
    assert worst_case_blocks(chunked, 43, F) >= 4
    # the same with vLLM's realistic multiples untouched: C = 16 -> cdiv(26, 8) = 4
    assert worst_case_blocks(ChunkedLocalAttentionSpec(B, 1, 8, BF16, attention_chunk_size=16), 43, F) == 4

    layout_specs = [chunked, FULL]
    # L = 23 + 20 = 43: full cdiv(43, 8) = 6
    worst_total = worst_case_blocks(chunked, 43, F) + 6
    ctrl = ctrl_for(layout_specs, worst_total, policy="guaranteed", F=F)
    ctrl.submit(RequestSpec("r", 23, 20), 0.0)
    for now, (computed, slots) in enumerate([(10, 20), (20, 23), (23, 33)], start=1):
        ctrl.progress("r", computed, float(now))
        decisions = ctrl.grow("r", slots, float(now))
        assert [d.kind for d in decisions] == [DecisionKind.GROW], decisions
        ctrl.check_integrity()
    assert ctrl.request("r").held == [4, 5]


# ------------------------------------------------------------------ prefix cache, by hand


def test_a_prefix_shared_by_three_requests_is_counted_once_and_cached_after_the_last():
    """Full attention, pool 20, F = 64. Prompt 30 = 3 full hashed blocks + 6 tokens; a hit is
    at most (30 - 1) // 8 = 3 blocks."""
    ctrl = ctrl_for([FULL], 20)
    hashes = (101, 102, 103)
    pool = ctrl.pool
    one(ctrl.submit(RequestSpec("a", 30, 0, hashes), 0.0), DecisionKind.ADMIT)
    assert pool.num_free_blocks == 20 - 4  # cdiv(30, 8) = 4
    ctrl.progress("a", 30, 1.0)  # publishes blocks 0..2
    shared = ctrl.request("a").tables[0][:3]
    for rid in ("b", "c"):
        d = one(ctrl.submit(RequestSpec(rid, 30, 0, hashes), 2.0), DecisionKind.ADMIT)
        assert d.cached_hit_blocks == 3 and d.blocks_held == (4,)
        assert ctrl.request(rid).tables[0][:3] == shared
    # each of b and c took 4 - 3 = 1 new block: 20 - 4 - 1 - 1 = 14
    assert pool.num_free_blocks == 14 and pool.num_held_blocks == 6
    assert [pool.ref_count(b) for b in shared] == [3, 3, 3]
    ctrl.check_integrity()
    ctrl.finish("a", 3.0)  # frees its own 4th block only
    ctrl.finish("b", 3.0)
    assert pool.num_free_blocks == 16 and [pool.ref_count(b) for b in shared] == [1, 1, 1]
    assert pool.num_evictable_blocks == 0
    ctrl.finish("c", 4.0)  # the last holder: the 3 shared blocks become cached, evictable
    assert pool.num_free_blocks == 20 and pool.num_evictable_blocks == 3
    assert [pool.lookup(h) for h in hashes] == shared
    # a hit on evictable blocks costs them once: 3 taken from the LRU + 1 new block
    d = one(ctrl.submit(RequestSpec("d", 30, 0, hashes), 5.0), DecisionKind.ADMIT)
    assert d.cached_hit_blocks == 3 and pool.num_free_blocks == 16 and pool.num_evictable_blocks == 0
    ctrl.check_integrity()


def test_cached_blocks_are_evicted_lru_before_anything_is_refused_pool_full():
    """Pool 10, full attention. Two finished requests leave 4 + 4 cached blocks (x released
    before y): 2 on the free stack, 8 evictable. A 10-block request is admitted, not refused,
    by evicting all of them; a 3-block one takes the 2 free then x's oldest block first."""
    ctrl = ctrl_for([FULL], 10, F=128)
    pool = ctrl.pool
    for rid, base, now in (("x", 10, 0.0), ("y", 20, 1.0)):
        ctrl.submit(RequestSpec(rid, 33, 0, tuple(range(base, base + 4))), now)
        ctrl.progress(rid, 33, now)  # 33 tokens: 5 blocks, 4 full ones published
        ctrl.finish(rid, now)
    x_blocks = [pool.lookup(h) for h in range(10, 14)]
    assert pool.num_evictable_blocks == 8 and pool.num_unhashed_free_blocks == 2
    d = one(ctrl.submit(RequestSpec("z", 24, 0), 2.0), DecisionKind.ADMIT)  # 3 blocks
    assert d.reason is Reason.FITS
    # 2 from the free stack, then the least recently released cached block: x's tail first
    # (a request's blocks are released tail first), so x's last full block goes
    assert pool.num_evictable_blocks == 7 and pool.lookup(13) is None and pool.lookup(10) == x_blocks[0]
    ctrl.finish("z", 3.0)
    d = one(ctrl.submit(RequestSpec("w", 80, 0), 4.0), DecisionKind.ADMIT)  # cdiv(80, 8) = 10 (F = 128: one chunk)
    assert pool.num_evictable_blocks == 0 and pool.num_free_blocks == 0
    ctrl.check_integrity()


def test_sliding_window_hit_shared_by_two_requests_keeps_one_share_reserve_block():
    """Sliding W = 16 + full, pool 40, F = 64. Prompt 34: 4 hashed blocks, hit at most
    (34 - 1) // 8 = 4 blocks = 32 tokens; out of the window after 32: (32 - 16 + 1) // 8 = 2,
    so the sliding table's hit is [null, null, b2, b3] and the full one's [b0..b3]."""
    ctrl = ctrl_for([SlidingWindowSpec(B, 1, 8, BF16, sliding_window=16), FULL], 40)
    hashes = (1, 2, 3, 4)
    ctrl.submit(RequestSpec("a", 34, 0, hashes), 0.0)
    ctrl.hold_queue()
    ctrl.progress("a", 34, 1.0)  # publishes 4 blocks per group; then (34-15)//8 = 2 sliding go
    ctrl.release_queue(1.0)
    a = ctrl.request("a")
    assert a.held == [3, 5]  # sliding cdiv(34, 8) - 2 = 3; full cdiv(34, 8) = 5
    d = one(ctrl.submit(RequestSpec("b", 34, 0, hashes), 2.0), DecisionKind.ADMIT)
    b = ctrl.request("b")
    assert d.cached_hit_blocks == 4
    assert b.tables[0][:4] == [0, 0, *a.tables[0][2:4]] and b.tables[1][:4] == a.tables[1][:4]
    # b holds sliding: 2 shared + 1 new (slot 4); full: 4 shared + 1 new
    assert d.blocks_held == (3, 5)
    # 2 shared sliding blocks -> 2 share-reserve blocks; full hits need none
    assert ctrl.ledger.window_share_reserve == 2
    assert ctrl.pool.num_free_blocks == 40 - 8 - 2
    ctrl.check_integrity()
