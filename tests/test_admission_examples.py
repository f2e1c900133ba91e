"""Worked examples with the arithmetic done by hand: layer-aware vs naive admission on a
Gemma-3-style model, prefix sharing charged once, reclamation, and the cross-group
eviction case a stateful run found."""

from __future__ import annotations

from kvbudget.daemon.core import budget
from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController
from kvbudget.daemon.core.pool import NULL_BLOCK
from kvbudget.daemon.core.records import DecisionKind, Reason, RequestSpec
from kvbudget.daemon.core.spec import group_layers

from test_admission_support import SMALL_LAYOUTS, by_kind, full_spec, sliding_spec


# ----------------------------------------------------------------- Gemma-3 5:1
def gemma3_like():
    # 12 layers, five sliding (W=1024) then one full, twice; block size 16.
    # group_layers: 10 sliding + 2 full layers -> group size 2 -> 5 sliding groups + 1 full.
    pattern = [sliding_spec(1024, block_size=16)] * 5 + [full_spec(block_size=16)]
    return group_layers(pattern * 2, model_name="gemma3-like")


def _submit_many(policy: str, n: int):
    layout = gemma3_like()
    config = AdmissionConfig(max_model_len=8192, max_num_batched_tokens=512, policy=policy)
    ctrl = AdmissionController(layout, 6144, config)
    decisions = []
    for i in range(n):
        decisions += ctrl.submit(RequestSpec(f"r{i}", 7000, 1192), now=0.0)
    ctrl.check_integrity()
    return ctrl, decisions


def test_gemma3_layer_aware_admits_what_the_formula_says():
    layout = gemma3_like()
    assert [g.kind.value for g in layout.groups] == ["sliding_window"] * 5 + ["full_attention"]
    # L = 7000 + 1192 = 8192, F = 512, B = 16.
    # sliding: min(cdiv(min(1023 + 512, 8192), 16) + 1, cdiv(8192, 16)) = min(96 + 1, 512) = 97
    # full:    cdiv(8192, 16) = 512;  total = 5 * 97 + 512 = 997 blocks per request.
    worst = budget.request_worst_case(layout, 8192, 512)
    assert worst.per_group == (97,) * 5 + (512,) and worst.total == 997
    # 6144 // 997 = 6 (6 * 997 = 5982, 162 left): the 7th and 8th wait.
    assert int(budget.max_concurrency(6144, layout, 8192, 512)) == 6
    ctrl, decisions = _submit_many("guaranteed", 8)
    assert [d.kind for d in decisions] == [DecisionKind.ADMIT] * 6 + [DecisionKind.QUEUE] * 2
    # The pool is mostly free (each holds only its first 512-token chunk: 32 blocks x 6
    # groups = 192), but the blocks are promised: budget_full, not pool_full.
    assert decisions[6].reason is Reason.BUDGET_FULL
    snap = ctrl.snapshot(0.0)
    assert snap.num_held_blocks == 6 * 192 == 1152
    assert snap.num_reserved_blocks == 6 * (997 - 192) == 4830


def test_gemma3_naive_admits_the_smaller_number():
    # naive: every one of the 6 groups charged cdiv(8192, 16) = 512 -> 3072 per request;
    # 6144 // 3072 = 2.
    layout = gemma3_like()
    assert budget.request_naive(layout, 8192).total == 3072
    assert budget.naive_max_concurrency(6144, layout, 8192) == 2.0
    ctrl, decisions = _submit_many("naive", 8)
    assert [d.kind for d in decisions] == [DecisionKind.ADMIT] * 2 + [DecisionKind.QUEUE] * 6
    assert decisions[2].reason is Reason.BUDGET_FULL


def test_gemma3_request_runs_to_its_end_within_its_worst_case():
    ctrl, _ = _submit_many("guaranteed", 1)
    r = ctrl.request("r0")
    peak = [0] * 6
    while True:
        assert not by_kind(ctrl.progress("r0", r.num_tokens, 1.0), DecisionKind.DENY)
        if r.num_tokens == 8192:
            break
        target = min(r.num_tokens + (512 if r.num_tokens < 7000 else 1), 7000 if r.num_tokens < 7000 else 8192)
        assert [d.kind for d in ctrl.grow("r0", target, 1.0)] == [DecisionKind.GROW]
        peak = [max(p, h) for p, h in zip(peak, r.held)]
    ctrl.check_integrity()
    assert all(p <= 97 for p in peak[:5]) and peak[5] == 512
    # At the end, 8192 computed: a sliding group keeps cdiv(8192, 16) - (8192 - 1024 + 1) // 16
    # = 512 - 448 = 64 blocks; the rest went back as RECLAIM decisions.
    assert r.held == [64] * 5 + [512]
    assert ctrl.snapshot(1.0).groups[0].blocks_reclaimed == 448


# ------------------------------------------------------------- prefix sharing
def _prefix_ctrl(policy: str = "optimistic") -> AdmissionController:
    # One group of two full-attention layers, B = 8; 20 usable blocks.
    config = AdmissionConfig(max_model_len=64, max_num_batched_tokens=64, policy=policy, watermark=0.0)
    return AdmissionController(SMALL_LAYOUTS["full"], 20, config)


PROMPT = 33  # 4 full blocks + 1 token
HASHES = (11, 12, 13, 14)


def test_prefix_pair_held_by_other_is_charged_once():
    ctrl = _prefix_ctrl()
    [a] = ctrl.submit(RequestSpec("a", PROMPT, 0, HASHES), 0.0)
    # cdiv(33, 8) = 5 blocks: 20 - 5 = 15 free.
    assert a.new_block_ids == ((1, 2, 3, 4, 5),) and a.num_free_blocks == 15
    ctrl.progress("a", PROMPT, 0.0)  # the 4 full prompt blocks enter the cache
    [b] = ctrl.submit(RequestSpec("b", PROMPT, 0, HASHES), 0.0)
    # k = min(4 hashes, (33 - 1) // 8 = 4) = 4 hits held by a: they cost nothing; b takes
    # one new block for the last token: 15 - 1 = 14 free, 6 distinct blocks held.
    assert b.reason is Reason.PREFIX_HIT and b.cached_hit_blocks == 4
    assert b.new_block_ids == ((1, 2, 3, 4, 6),) and b.num_free_blocks == 14
    assert ctrl.pool.num_held_blocks == 6 and ctrl.pool.ref_count(1) == 2
    snap = ctrl.snapshot(0.0)
    assert (snap.prefix_hit_blocks, snap.prefix_query_blocks) == (4, 8)
    ctrl.check_integrity()


def test_prefix_pair_evictable_hit_is_charged_once_when_taken():
    ctrl = _prefix_ctrl()
    ctrl.submit(RequestSpec("a", PROMPT, 0, HASHES), 0.0)
    ctrl.progress("a", PROMPT, 0.0)
    ctrl.finish("a", 0.0)
    # a's 4 cached blocks are evictable (they count as free), its 5th went back: 20 free.
    assert (ctrl.pool.num_free_blocks, ctrl.pool.num_evictable_blocks) == (20, 4)
    [c] = ctrl.submit(RequestSpec("c", PROMPT, 0, HASHES), 0.0)
    # 4 evictable hits leave the LRU (1 each) + 1 new block: 20 - 5 = 15.
    assert c.cached_hit_blocks == 4 and c.num_free_blocks == 15
    assert ctrl.pool.num_evictable_blocks == 0
    [d] = ctrl.submit(RequestSpec("d", PROMPT, 0, HASHES), 0.0)
    # The same 4 blocks are now held by c: d pays only its last block, 15 - 1 = 14.
    assert d.cached_hit_blocks == 4 and d.num_free_blocks == 14
    ctrl.check_integrity()


def test_prefix_pair_guaranteed_reservation_counts_shared_blocks_once():
    ctrl = _prefix_ctrl("guaranteed")
    # L = 33 + 8 = 41: worst case cdiv(41, 8) = 6 per request.
    ctrl.submit(RequestSpec("a", PROMPT, 8, HASHES), 0.0)
    ctrl.progress("a", PROMPT, 0.0)
    [b] = ctrl.submit(RequestSpec("b", PROMPT, 8, HASHES), 0.0)
    assert b.blocks_reserved == (6,) and b.blocks_held == (5,)
    snap = ctrl.snapshot(0.0)
    # Promised in all: a 6 + b 6 - 4 shared = 8 = held 6 + reserved-not-held 2 (1 each).
    assert snap.num_held_blocks + snap.num_reserved_blocks == 8
    ctrl.check_integrity()


def test_last_prompt_block_is_always_recomputed():
    ctrl = _prefix_ctrl()
    ctrl.submit(RequestSpec("a", 33, 0, HASHES), 0.0)
    ctrl.progress("a", 33, 0.0)
    # prompt 32 = exactly 4 blocks: at most (32 - 1) // 8 = 3 may be hits.
    [b] = ctrl.submit(RequestSpec("b", 32, 0, HASHES), 0.0)
    assert b.cached_hit_blocks == 3 and b.num_computed == 24
    ctrl.check_integrity()


# ---------------------------------------------------------- sliding windows
def test_sliding_window_blocks_are_reclaimed_and_nulled():
    # hybrid: two sliding groups (W = 16) and one full group, B = 8.
    config = AdmissionConfig(max_model_len=64, max_num_batched_tokens=8, policy="guaranteed")
    ctrl = AdmissionController(SMALL_LAYOUTS["hybrid"], 30, config)
    ctrl.submit(RequestSpec("a", 8, 32), 0.0)
    reclaims = []
    for n in range(9, 34):
        reclaims += [(n - 1, d.freed_blocks) for d in ctrl.progress("a", n - 1, 0.0)]
        if n <= 32:
            ctrl.grow("a", n, 0.0)
    # After c computed tokens, (c - 16 + 1) // 8 leading blocks are out of the window:
    # c = 23 -> 1, c = 31 -> 2. Each time one block per sliding group (2 groups) went back.
    assert reclaims == [(23, 2), (31, 2)]
    # 32 slots, 32 computed: sliding groups hold cdiv(32, 8) - 2 = 2, the full group 4.
    assert ctrl.request("a").held == [2, 2, 4]
    r = ctrl.request("a")
    assert r.tables[0][:2] == [NULL_BLOCK, NULL_BLOCK] and NULL_BLOCK not in r.tables[2]
    assert [g.blocks_reclaimed for g in ctrl.snapshot(0.0).groups] == [2, 2, 0]
    ctrl.check_integrity()


def test_hits_of_one_group_are_not_evicted_by_another_groups_allocation():
    # Found by the stateful test: allocating group 0's new blocks evicted group 2's hits.
    config = AdmissionConfig(max_model_len=32, max_num_batched_tokens=64, watermark=0.0)
    ctrl = AdmissionController(SMALL_LAYOUTS["hybrid"], 12, config)
    ctrl.submit(RequestSpec("a", 17, 0, (1, 2)), 0.0)  # 3 slots x 3 groups = 9 blocks
    ctrl.submit(RequestSpec("d", 8, 0, (9,)), 0.0)  # 1 slot x 3 groups = the last 3
    ctrl.progress("a", 17, 0.0)
    ctrl.progress("d", 8, 0.0)
    ctrl.finish("a", 0.0)  # 6 cached blocks evictable (LRU order g0, g1, g2), 3 free
    ctrl.finish("d", 0.0)  # 3 more evictable, after a's
    a_group2 = ctrl.pool.lookup((2, 1)), ctrl.pool.lookup((2, 2))
    # c: 2 hits per group (6 evictable) + 2 new per group (cdiv(25, 8) = 4 slots) = 12
    # = 3 free + 9 evictable: the 6 new blocks are the 3 free and d's 3, never a hit.
    [c] = ctrl.submit(RequestSpec("c", 25, 0, (1, 2, 3)), 0.0)
    assert c.kind is DecisionKind.ADMIT and c.cached_hit_blocks == 2
    assert c.new_block_ids[2][:2] == a_group2
    ctrl.check_integrity()


def test_window_hit_shared_with_another_request_keeps_a_block_in_reserve():
    # Found by the stateful test: a sliding-window hit on a block another request holds
    # costs nothing now, but when it leaves the hitter's window the hitter drops it (no
    # block comes back, a still holds it) and owes one more block to its window.
    config = AdmissionConfig(max_model_len=96, max_num_batched_tokens=16, policy="guaranteed")
    ctrl = AdmissionController(SMALL_LAYOUTS["hybrid"], 63, config)  # W = 16, B = 8
    ctrl.submit(RequestSpec("a", 8, None, (7,)), 0.0)
    ctrl.progress("a", 8, 0.0)  # publishes a's block 0 of each group under hash 7
    # L = 96, F = 16: sliding min(cdiv(min(15 + 16, 96), 8) + 1, 12) = 5 twice, full 12: 22.
    # a holds 1 per group (3), owes 19: spare 63 - 3 - 19 = 41.
    [b] = ctrl.submit(RequestSpec("b", 23, None, (7, 8)), 0.0)
    # b hits block 0 in all 3 groups (held by a): its first chunk min(23, 8 + 16) = 23
    # slots = 3 per group, 1 shared + 2 new each. need = 22 - 1 (the full group's shared
    # hit only) = 21; the 2 sliding hits go to the window share reserve.
    assert b.cached_hit_blocks == 1 and b.blocks_held == (3, 3, 3)
    assert ctrl.pool.num_free_blocks == 63 - 3 - 6 == 54
    assert (ctrl.ledger.owed, ctrl.ledger.window_share_reserve, ctrl.ledger.spare) == (19 + 13, 2, 20)
    ctrl.check_integrity()
    out = ctrl.progress("b", 23, 0.0)
    # (23 - 16 + 1) // 8 = 1 block out of b's window per sliding group: b drops the shared
    # block 0 (a keeps it: nothing comes back), owes 2 more, the reserve pays: spare stays 20.
    assert out[0].freed_blocks == 2 and ctrl.pool.num_free_blocks == 54
    assert (ctrl.ledger.owed, ctrl.ledger.window_share_reserve, ctrl.ledger.spare) == (19 + 15, 0, 20)
    ctrl.check_integrity()
