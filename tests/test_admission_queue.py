"""The waiting queue: FCFS, priorities, bounded backfill with aging, limits, deadlines,
tenant quotas and weighted fair share."""

from __future__ import annotations

import pytest

from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController, AdmissionError
from kvbudget.daemon.core.records import DecisionKind, RequestSpec

from test_admission_support import SMALL_LAYOUTS, kinds

FULL = SMALL_LAYOUTS["full"]  # one group, B = 8


def make(num_blocks: int = 8, **kw) -> AdmissionController:
    kw.setdefault("policy", "guaranteed")
    config = AdmissionConfig(max_model_len=64, max_num_batched_tokens=64, watermark=0.0, **kw)
    return AdmissionController(FULL, num_blocks, config)


def req(rid: str, blocks: int, **kw) -> RequestSpec:
    """A request whose worst case is exactly `blocks` blocks (prompt 8·blocks, no output)."""
    return RequestSpec(rid, 8 * blocks, 0, **kw)


def test_fcfs_head_blocks_later_requests_without_backfill():
    ctrl = make(backfill_depth=0)
    ctrl.submit(req("run", 6), 0.0)  # 2 left
    out = ctrl.submit(req("big", 4), 0.0) + ctrl.submit(req("small", 1), 0.0)
    assert kinds(out) == [("queue", "pool_full", "big"), ("queue", "queue_ahead", "small")]
    out = ctrl.finish("run", 1.0)
    assert kinds(out) == [("release", "finished", "run"), ("admit", "fits", "big"), ("admit", "fits", "small")]
    ctrl.check_integrity()


def test_backfill_lets_up_to_depth_requests_pass_a_blocked_head():
    ctrl = make(backfill_depth=1)
    ctrl.submit(req("run", 6), 0.0)
    out = ctrl.submit(req("big", 4), 0.0) + ctrl.submit(req("big2", 3), 0.0)
    out += ctrl.submit(req("small", 1), 0.0)
    # Depth 1: only big2 (right behind the head) may be tried; small is third: it waits.
    assert kinds(out)[2] == ("queue", "queue_ahead", "small")
    ctrl2 = make(backfill_depth=2)
    ctrl2.submit(req("run", 6), 0.0)
    ctrl2.submit(req("big", 4), 0.0)
    ctrl2.submit(req("big2", 3), 0.0)
    assert kinds(ctrl2.submit(req("small", 1), 0.0)) == [("admit", "fits", "small")]
    ctrl.check_integrity()
    ctrl2.check_integrity()


def test_aged_head_stops_backfill():
    ctrl = make(backfill_depth=4, max_head_wait_s=5.0)
    ctrl.submit(req("run", 6), 0.0)
    ctrl.submit(req("big", 4), 0.0)
    assert kinds(ctrl.submit(req("s1", 1), 4.0)) == [("admit", "fits", "s1")]  # head waited 4 s
    assert kinds(ctrl.submit(req("s2", 1), 6.0)) == [("queue", "queue_ahead", "s2")]  # 6 s > 5 s
    ctrl.check_integrity()


def test_aging_follows_the_workload_under_a_steady_stream_of_small_requests():
    """Small requests never wait here (the median wait is 0), so a head that has waited at
    all is no longer passed: the big one is admitted once the requests running beside it
    end. (With a fixed 30 s bound it starved for 30 s; a fixed cap still bounds it.)"""

    def run(max_head_wait_s: float) -> float | None:
        ctrl = make(backfill_depth=8, max_head_wait_s=max_head_wait_s)
        ends: dict[str, float] = {}
        admitted_big = None
        n = 0
        for tick in range(60):
            now = float(tick)
            decisions = []
            for rid, end in sorted(ends.items()):
                if end <= now:
                    del ends[rid]
                    decisions += ctrl.finish(rid, now)
            if tick == 1:
                decisions += ctrl.submit(req("big", 8), now)  # needs the whole pool
            for _ in range(3):  # three 1-block requests a second, each running 3 s
                n += 1
                decisions += ctrl.submit(req(f"s{n}", 1), now)
            for d in decisions:
                if d.kind is DecisionKind.ADMIT:
                    if d.request_id == "big":
                        admitted_big = now
                    else:
                        ends[d.request_id] = now + 3.0
            ctrl.check_integrity()
            if admitted_big is not None:
                return admitted_big - 1.0  # waited since t = 1
        return None

    # t=1: big waits; s4-s6 pass it (expected to end before it can start: no waits seen
    # yet, so no bound). They waited 0 s: from t=2 on nothing passes big, which starts at
    # t=4, when s4-s6 end.
    assert run(max_head_wait_s=0.0) == 3.0
    assert run(max_head_wait_s=1e9) == 3.0  # a cap above the workload's bound changes nothing


def test_priority_lower_value_first_and_preempted_back_in_front():
    ctrl = make(backfill_depth=0)
    ctrl.submit(req("run", 8), 0.0)
    ctrl.submit(req("low", 2, priority=2), 0.0)
    ctrl.submit(req("high", 2, priority=0), 0.0)
    assert [r.request_id for r in ctrl.waiting_requests()] == ["high", "low"]
    out = ctrl.finish("run", 1.0)
    assert [d.request_id for d in out if d.kind is DecisionKind.ADMIT] == ["high", "low"]
    ctrl.check_integrity()


def test_queue_full_rejects_but_a_fitting_request_is_still_admitted():
    ctrl = make(max_queue_len=1)
    ctrl.submit(req("run", 7), 0.0)
    assert kinds(ctrl.submit(req("w1", 2), 0.0)) == [("queue", "pool_full", "w1")]
    assert kinds(ctrl.submit(req("w2", 2), 0.0)) == [("reject", "queue_full", "w2")]
    assert kinds(ctrl.submit(req("fits", 1), 0.0)) == [("admit", "fits", "fits")]
    assert ctrl.snapshot(0.0).rejections_by_reason == {"queue_full": 1}
    ctrl.check_integrity()


RETUNED = dict(max_queue_len=0, backfill_depth=16, max_head_wait_s=30.0, watermark=0.0, lookahead_tokens=0,
               reject_over_quota=False)


def test_retune_changes_the_queue_bound_live_and_keeps_who_waits():
    ctrl = make(max_queue_len=0)
    ctrl.submit(req("run", 7), 0.0)
    for rid in ("w1", "w2", "w3"):
        assert kinds(ctrl.submit(req(rid, 2), 0.0)) == [("queue", "pool_full", rid)]
    ctrl.retune(**{**RETUNED, "max_queue_len": 2})  # a reload lowers it
    assert kinds(ctrl.submit(req("w4", 2), 0.0)) == [("reject", "queue_full", "w4")]
    assert [r.request_id for r in ctrl.waiting_requests()] == ["w1", "w2", "w3"]  # nobody dropped
    ctrl.check_integrity()
    with pytest.raises(AdmissionError, match="max_queue_len: must not be negative"):
        ctrl.retune(**{**RETUNED, "max_queue_len": -1})
    assert ctrl.config.max_queue_len == 2  # the refused one changed nothing


def test_retune_changes_the_watermark_live():
    # optimistic keeps watermark x 8 blocks free while something runs: 0.25 -> 2 blocks.
    ctrl = make(policy="optimistic")
    assert kinds(ctrl.submit(req("a", 5), 0.0)) == [("admit", "fits", "a")]
    ctrl.retune(**{**RETUNED, "watermark": 0.25})
    assert kinds(ctrl.submit(req("b", 2), 0.0))[0][0] == "queue"  # 3 free - 2 < 2 kept: waits
    ctrl.retune(**RETUNED)  # back to 0: it goes in on the next pass
    assert [d.request_id for d in ctrl.schedule(1.0) if d.kind is DecisionKind.ADMIT] == ["b"]
    ctrl.check_integrity()


def test_deadline_passed_while_waiting_is_rejected_in_schedule():
    ctrl = make()
    ctrl.submit(req("run", 8), 0.0)
    ctrl.submit(req("late", 1, deadline_s=2.0), 0.0)
    assert ctrl.schedule(1.5) == []
    assert kinds(ctrl.schedule(2.5)) == [("reject", "deadline", "late")]
    assert ctrl.num_waiting == 0
    ctrl.check_integrity()


def test_tenant_quota_waits_or_rejects():
    ctrl = make(num_blocks=8)
    ctrl.set_tenant_quota("t", 0.5)  # 0.5 * 8 = 4 blocks
    out = ctrl.submit(req("a", 3, tenant="t"), 0.0) + ctrl.submit(req("b", 2, tenant="t"), 0.0)
    # 3 + 2 = 5 > 4: b waits although the pool has 5 free blocks.
    assert kinds(out) == [("admit", "fits", "a"), ("queue", "tenant_quota", "b")]
    # A request bigger than the quota itself can never be admitted: rejected.
    assert kinds(ctrl.submit(req("c", 5, tenant="t"), 0.0)) == [("reject", "tenant_quota", "c")]
    assert kinds(ctrl.finish("a", 1.0)) == [("release", "finished", "a"), ("admit", "fits", "b")]
    snap = ctrl.snapshot(1.0)
    assert [(t.tenant, t.quota_blocks, t.blocks_held) for t in snap.tenants] == [("t", 4, 2)]

    strict = make(num_blocks=8, reject_over_quota=True)
    strict.set_tenant_quota("t", 0.5)
    strict.submit(req("a", 3, tenant="t"), 0.0)
    assert kinds(strict.submit(req("b", 2, tenant="t"), 0.0)) == [("reject", "tenant_quota", "b")]
    ctrl.check_integrity()
    strict.check_integrity()


def test_weighted_fair_share_prefers_the_tenant_using_least_per_weight():
    def scenario(fair_share: bool) -> list[str]:
        ctrl = make(num_blocks=8, fair_share=fair_share, backfill_depth=0)
        ctrl.submit(req("a-run", 4, tenant="a"), 0.0)  # tenant a uses 4 blocks
        ctrl.submit(req("x-run", 4, tenant="x"), 0.0)  # pool full
        ctrl.submit(req("a2", 4, tenant="a"), 0.0)  # a waits first ...
        ctrl.submit(req("b1", 4, tenant="b"), 0.0)  # ... then b, which uses nothing
        out = ctrl.finish("x-run", 1.0)  # room for one of them
        ctrl.check_integrity()
        return [d.request_id for d in out if d.kind is DecisionKind.ADMIT]

    assert scenario(fair_share=True) == ["b1"]  # usage a 4/1, b 0/1
    assert scenario(fair_share=False) == ["a2"]  # plain arrival order


def test_nothing_running_means_the_head_is_admitted_or_rejected():
    ctrl = make(num_blocks=8, policy="optimistic")
    ctrl.submit(req("a", 8), 0.0)
    ctrl.submit(req("b", 8), 0.0)
    assert ctrl.num_waiting == 1
    out = ctrl.abort("a", 1.0)
    assert kinds(out) == [("release", "aborted", "a"), ("admit", "fits", "b")]
    ctrl.check_integrity()
