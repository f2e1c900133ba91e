"""Tenant accounting with shared prefix blocks: a block counts once for a tenant however
many of its requests hold it, and once for each tenant whose requests hold it (ledger.py,
TenantAccount). The quota, the fair-share order and the snapshot all read that figure.

Every figure below is worked out by hand; `check_integrity` recounts the same from the
block tables after every operation.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController
from kvbudget.daemon.core.pool import NULL_BLOCK
from kvbudget.daemon.core.records import DecisionKind, RequestSpec

from test_admission_support import B, SMALL_LAYOUTS, engine_step, kinds

FULL = SMALL_LAYOUTS["full"]  # one full-attention group, B = 8
HYBRID = SMALL_LAYOUTS["hybrid"]  # groups 0, 1: sliding window 16; group 2: full attention
PREFIX = (11, 12, 13, 14)  # 4 prompt blocks every request below shares


def make(layout=FULL, num_blocks: int = 20, **kw) -> AdmissionController:
    kw.setdefault("policy", "guaranteed")
    config = AdmissionConfig(max_model_len=64, max_num_batched_tokens=64, watermark=0.0, **kw)
    return AdmissionController(layout, num_blocks, config)


def shared(rid: str, tenant: str, max_new: int = 0) -> RequestSpec:
    """33 tokens: the 4 shared blocks (hits once published) and 1 block of its own."""
    return RequestSpec(rid, 33, max_new, PREFIX, tenant=tenant)


def figures(ctrl: AdmissionController, tenant: str) -> tuple[int, int]:
    account = ctrl.ledger.tenants[tenant]
    return account.held, account.charged


def test_a_system_prompt_shared_by_one_tenants_requests_counts_once():
    ctrl = make()  # 20 blocks
    ctrl.set_tenant_quota("t", 0.5)  # 10 blocks
    assert kinds(ctrl.submit(shared("a", "t"), 0.0)) == [("admit", "fits", "a")]
    ctrl.progress("a", 33, 0.0)  # publishes its 4 prompt blocks
    assert figures(ctrl, "t") == (5, 5)
    # Each further request takes the 4 hits and 1 block of its own: the tenant holds
    # 4 + n blocks for n requests (it was charged 5 n: b took 10, c waited on the quota).
    for n, rid in enumerate("bcdef", start=2):
        assert kinds(ctrl.submit(shared(rid, "t"), 0.0)) == [("admit", "prefix_hit", rid)]
        assert figures(ctrl, "t") == (4 + n, 4 + n) == (ctrl.pool.num_held_blocks,) * 2
        ctrl.check_integrity()
    # 4 + 7 = 11 > 10: the seventh waits on the quota, though the pool has 10 free.
    assert kinds(ctrl.submit(shared("g", "t"), 0.0)) == [("queue", "tenant_quota", "g")]
    assert ctrl.pool.num_free_blocks == 10
    snap = ctrl.snapshot(0.0)
    assert [(t.tenant, t.blocks_held, t.blocks_reserved, t.quota_blocks, t.running, t.waiting)
            for t in snap.tenants] == [("t", 10, 0, 10, 6, 1)]
    assert snap.num_held_blocks == 10
    # a ends: its own block goes; the 4 shared blocks stay, held (and charged) once by b..f.
    assert kinds(ctrl.finish("a", 1.0)) == [("release", "finished", "a"), ("admit", "prefix_hit", "g")]
    assert figures(ctrl, "t") == (10, 10)
    for rid in "bcdefg":
        ctrl.finish(rid, 2.0)
    assert figures(ctrl, "t") == (0, 0)
    ctrl.check_integrity()


def test_reservations_are_charged_per_request_and_shared_blocks_once():
    # 33 tokens + 8 new: worst case cdiv(41, 8) = 6 blocks, 5 held at admission, 1 owed.
    ctrl = make()
    ctrl.set_tenant_quota("t", 0.5)  # 10 blocks
    ctrl.submit(shared("a", "t", max_new=8), 0.0)
    ctrl.progress("a", 33, 0.0)
    assert figures(ctrl, "t") == (5, 6)
    # b: 4 hits + 1 block, 1 owed: the tenant holds 6 and is charged 6 + 2 owed = 8
    # (charged 12 before, over the quota).
    assert kinds(ctrl.submit(shared("b", "t", max_new=8), 0.0)) == [("admit", "prefix_hit", "b")]
    assert figures(ctrl, "t") == (6, 8)
    assert kinds(ctrl.submit(shared("c", "t", max_new=8), 0.0)) == [("admit", "prefix_hit", "c")]
    assert figures(ctrl, "t") == (7, 10)
    assert kinds(ctrl.submit(shared("d", "t", max_new=8), 0.0)) == [("queue", "tenant_quota", "d")]
    (t,) = ctrl.snapshot(0.0).tenants
    assert (t.blocks_held, t.blocks_reserved) == (7, 3)  # reserved: 1 owed by each of a, b, c
    ctrl.check_integrity()

    # reject_over_quota: the same request is judged on what it adds (2), not on 6.
    strict = make(reject_over_quota=True)
    strict.set_tenant_quota("t", 0.5)
    strict.submit(shared("a", "t", max_new=8), 0.0)
    strict.progress("a", 33, 0.0)
    assert kinds(strict.submit(shared("b", "t", max_new=8), 0.0)) == [("admit", "prefix_hit", "b")]
    strict.check_integrity()


def test_a_block_two_tenants_share_counts_once_for_each():
    ctrl = make()  # 20 blocks
    ctrl.set_tenant_quota("y", 0.25)  # 5 blocks
    ctrl.submit(shared("x1", "x"), 0.0)
    ctrl.progress("x1", 33, 0.0)
    # y's request hits x's 4 blocks: they count for y too (its quota covers what its
    # requests need to run, whoever brought the blocks in): 5 = its quota.
    assert kinds(ctrl.submit(shared("y1", "y"), 0.0)) == [("admit", "prefix_hit", "y1")]
    assert figures(ctrl, "x") == (5, 5) and figures(ctrl, "y") == (5, 5)
    assert ctrl.pool.num_held_blocks == 6  # the tenants' rows add up to more than the pool
    # A second y request adds 1 block of its own, not 5: 6 > 5 all the same.
    assert kinds(ctrl.submit(shared("y2", "y"), 0.0)) == [("queue", "tenant_quota", "y2")]
    # x's request ends: y's figures do not move (no block changes hands).
    assert kinds(ctrl.finish("x1", 1.0)) == [("release", "finished", "x1")]
    assert figures(ctrl, "y") == (5, 5) == (ctrl.pool.num_held_blocks,) * 2
    assert ctrl.ledger.tenants.get("x") is None  # idle, forgotten
    ctrl.check_integrity()


def test_fair_share_orders_tenants_by_the_blocks_they_really_use():
    def first_admitted(fair_share: bool) -> str:
        ctrl = make(num_blocks=20, fair_share=fair_share, backfill_depth=0)
        ctrl.submit(shared("a1", "a"), 0.0)
        ctrl.progress("a1", 33, 0.0)
        ctrl.submit(shared("a2", "a"), 0.0)
        ctrl.submit(shared("a3", "a"), 0.0)  # a: 4 shared + 3 own = 7 blocks (15 summed)
        ctrl.submit(RequestSpec("b1", 64, 0, tenant="b"), 0.0)  # b: 8 blocks
        ctrl.submit(RequestSpec("x1", 40, 0, tenant="x"), 0.0)  # 5: the pool is full
        ctrl.submit(RequestSpec("b-next", 40, 0, tenant="b"), 0.0)  # b waits first
        ctrl.submit(RequestSpec("a-next", 40, 0, tenant="a"), 0.0)
        assert figures(ctrl, "a") == (7, 7) and figures(ctrl, "b") == (8, 8)
        out = ctrl.finish("x1", 1.0)  # room for one of them
        ctrl.check_integrity()
        (admitted,) = (d.request_id for d in out if d.kind is DecisionKind.ADMIT)
        return admitted

    assert first_admitted(fair_share=True) == "a-next"  # usage a 7 < b 8 (a 15 before: b went)
    assert first_admitted(fair_share=False) == "b-next"  # arrival order


def test_sliding_window_hits_held_once_and_their_share_reserve_charged():
    # Hybrid: groups 0 and 1 slide (W = 16), group 2 is full attention; B = 8.
    # 33 tokens + 16 new (L = 49), guaranteed: base per group = (min(cdiv(min(15 + 64, 49),
    # 8) + 1, cdiv(49, 8)), same, cdiv(49, 8)) = (7, 7, 7), charge 21.
    ctrl = make(HYBRID, num_blocks=80)
    ctrl.set_tenant_quota("t", 0.5)  # 40 blocks
    ctrl.submit(shared("a", "t", max_new=16), 0.0)
    assert figures(ctrl, "t") == (15, 21)  # held (5, 5, 5)
    # Computing 33 tokens publishes 4 blocks per group; 33 - 16 + 1 = 18 tokens are out of
    # the window: 2 blocks per sliding group go back (cached, evictable). Held (3, 3, 5).
    ctrl.progress("a", 33, 0.0)
    assert figures(ctrl, "t") == (11, 21)
    # b hits 4 blocks: slots 0-1 of the sliding groups are out of its window (null), 2-3
    # are a's; all 4 of the full group are a's. It holds (3, 3, 5) with 3 new blocks,
    # charge 21. The tenant holds 11 + 3 = 14 distinct blocks and is charged
    # 21 + 21 - 4 (the full-group hits, once) = 38 = 14 held + 20 owed (10 each) + 4, the
    # extra references on the sliding blocks: their share reserve, which the pool keeps
    # too (b gets no block back when a drops one of them, yet owes its window one more).
    assert kinds(ctrl.submit(shared("b", "t", max_new=16), 0.0)) == [("admit", "prefix_hit", "b")]
    held, charged = figures(ctrl, "t")
    assert held == 14 == ctrl.pool.num_held_blocks
    owed = sum(r.owed for r in ctrl.running_requests())
    assert owed == 2 * ((7 - 3) * 2 + (7 - 5)) == 20
    assert charged == 38 == held + owed + 4  # 4: b's extra references on sliding blocks
    # (Before: 21 + 21 = 42 > 40, b waited on the quota.)

    # a decodes: 41 slots (one more block per group), then 40 computed: 40 - 16 + 1 = 25
    # tokens out of the window, so slot 2 of each sliding group leaves a's table. b still
    # holds those two blocks: the tenant holds as many blocks as before, and its charge
    # does not move (a's window reserve grows by 1 per group, the share reserve shrinks).
    ctrl.grow("a", 41, 1.0)
    assert figures(ctrl, "t") == (17, 38)
    ctrl.progress("a", 40, 1.0)
    assert figures(ctrl, "t") == (17, 38)
    assert ctrl.pool.num_held_blocks == 17
    ctrl.check_integrity()
    # a ends: b's 11 blocks (3, 3, 5) and its charge 21 are what is left.
    ctrl.finish("a", 2.0)
    assert figures(ctrl, "t") == (11, 21) == (ctrl.pool.num_held_blocks, 21)
    ctrl.check_integrity()


def _by_hand(ctrl: AdmissionController) -> dict[str, tuple[int, int]]:
    """Each tenant's (held, charged) recounted from the block tables, differently from the
    ledger: distinct blocks; + owed + references beyond the first on sliding-window blocks."""
    window = set(ctrl.ledger.window_groups)
    blocks: dict[str, set[int]] = {}
    window_refs: dict[str, Counter[int]] = {}
    owed: Counter[str] = Counter()
    for r in ctrl.running_requests():
        mine = blocks.setdefault(r.tenant, set())
        refs = window_refs.setdefault(r.tenant, Counter())
        for g, table in enumerate(r.tables):
            ids = [b for b in table if b != NULL_BLOCK]
            mine.update(ids)
            if g in window:
                refs.update(ids)
        owed[r.tenant] += sum(max(0, b - h) for h, b in zip(r.held, r.base))
    return {
        t: (len(blocks[t]), len(blocks[t]) + owed[t] + sum(n - 1 for n in window_refs[t].values()))
        for t in blocks
    }


OPS = st.lists(
    st.tuples(
        st.sampled_from(("submit", "submit", "step", "step", "step", "finish")),
        st.integers(0, 1000),  # which request / tenant / prefix
        st.integers(1, 56),  # prompt tokens
        st.integers(0, 24),  # max new tokens
    ),
    min_size=20,
    max_size=60,
)


@settings(max_examples=80, deadline=None)
@given(
    layout=st.sampled_from(("full", "hybrid", "chunked", "mla")),
    policy=st.sampled_from(("guaranteed", "optimistic", "predictive")),
    ops=OPS,
)
def test_each_tenant_holds_the_distinct_blocks_of_its_requests(layout, policy, ops):
    """Over random sharing patterns (2 tenants, 2 prefixes, 3 lengths of shared prefix):
    a tenant's held count is the number of distinct blocks its running requests reference,
    its charge that plus what they are owed plus their extra sliding-window references,
    and under `guaranteed` (nothing grows past its reservation) the quota is never passed."""
    ctrl = AdmissionController(
        SMALL_LAYOUTS[layout], 64,
        AdmissionConfig(max_model_len=64, max_num_batched_tokens=16, policy=policy, watermark=0.0),
    )
    ctrl.set_tenant_quota("b", 0.5)  # 32 blocks
    goals: dict[str, int] = {}
    for i, (op, pick, prompt, max_new) in enumerate(ops):
        running = sorted(ctrl.running_requests(), key=lambda r: r.order)
        if op == "submit" or not running:
            family, shared_blocks = pick % 2, (2, 4, 7)[pick % 3]
            hashes = tuple(
                1000 * family + j if j < shared_blocks else 10**6 + 1000 * i + j for j in range(prompt // B)
            )
            rid = f"r{i}"
            goals[rid] = min(prompt + max_new, 64)  # (max_model_len)
            ctrl.submit(RequestSpec(rid, prompt, max_new, hashes, tenant="aab"[pick // 2 % 3]), float(i))
        elif op == "step":
            r = running[pick % len(running)]
            engine_step(ctrl, r.request_id, goals[r.request_id], float(i))
        else:
            ctrl.finish(running[pick % len(running)].request_id, float(i))
        ctrl.check_integrity()
        expected = _by_hand(ctrl)
        for name, account in ctrl.ledger.tenants.items():
            assert (account.held, account.charged) == expected.get(name, (0, 0)), name
            assert account.held <= ctrl.pool.num_held_blocks
        if len(expected) == 1:  # one tenant running: it holds what the pool holds
            assert next(iter(expected.values()))[0] == ctrl.pool.num_held_blocks
        if policy == "guaranteed":
            assert ctrl.ledger.tenants.get("b") is None or ctrl.ledger.tenants["b"].charged <= 32
