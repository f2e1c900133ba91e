"""The controller's surface: misuse raises AdmissionError naming the field, decisions are
numbered and complete, snapshots and engine expiry."""

from __future__ import annotations

import dataclasses

import pytest

from kvbudget.daemon.core.admission import (
    AdmissionConfig,
    AdmissionController,
    AdmissionError,
    DuplicateRequest,
    UnknownRequest,
)
from kvbudget.daemon.core.predictor import OutputLengthPredictor
from kvbudget.daemon.core.records import DecisionKind, Reason, RequestSpec

from test_admission_support import SMALL_LAYOUTS, kinds

HYBRID = SMALL_LAYOUTS["hybrid"]  # 2 sliding groups (W = 16) + 1 full, B = 8


def make(**kw) -> AdmissionController:
    config = AdmissionConfig(max_model_len=64, max_num_batched_tokens=16, watermark=0.0, **kw)
    return AdmissionController(HYBRID, 30, config)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda c: c.submit(RequestSpec("x", 0), 0.0), "prompt_tokens"),
        (lambda c: c.submit(RequestSpec("x", 4, -1), 0.0), "max_new_tokens"),
        (lambda c: c.submit(RequestSpec("", 4), 0.0), "request_id"),
        (lambda c: c.grow("nope", 5, 0.0), "request_id"),
        (lambda c: c.grow("a", 4 + 8 + 1, 0.0), "num_tokens"),  # past L = 12
        (lambda c: c.grow("a", 3, 0.0), "num_tokens"),  # below the 4 slots held
        (lambda c: c.progress("a", 5, 0.0), "num_computed"),  # past the slots held
        (lambda c: c.set_policy("greedy", 0.0), "policy"),
        (lambda c: c.set_tenant_quota("t", 1.5), "max_share"),
        (lambda c: c.set_tenant_quota("t", 0.5, weight=0), "weight"),
        (lambda c: c.finish("nope", 0.0), "request_id"),
    ],
)
def test_misuse_names_the_field(call, field):
    ctrl = make()
    ctrl.submit(RequestSpec("a", 4, 8), 0.0)
    with pytest.raises(AdmissionError) as info:
        call(ctrl)
    assert info.value.field == field
    ctrl.check_integrity()


def test_duplicate_and_unknown_are_their_own_types():
    ctrl = make()
    ctrl.submit(RequestSpec("a", 4, 8), 0.0)
    with pytest.raises(DuplicateRequest):
        ctrl.submit(RequestSpec("a", 4, 8), 0.0)
    with pytest.raises(UnknownRequest):
        ctrl.abort("b", 0.0)
    ctrl.finish("a", 0.0)
    ctrl.submit(RequestSpec("a", 4, 8), 0.0)  # a finished id may be used again
    ctrl.check_integrity()


def test_progress_cannot_go_backwards():
    ctrl = make()
    ctrl.submit(RequestSpec("a", 4, 8), 0.0)
    ctrl.progress("a", 4, 0.0)
    with pytest.raises(AdmissionError) as info:
        ctrl.progress("a", 3, 0.0)
    assert info.value.field == "num_computed"
    ctrl.check_integrity()


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_model_len", 0), ("max_num_batched_tokens", 0), ("policy", "x"), ("watermark", 1.0),
     ("lookahead_tokens", -1), ("max_queue_len", -1), ("backfill_depth", -1)],
)
def test_bad_config_names_the_field(field, value):
    config = dataclasses.replace(AdmissionConfig(max_model_len=64), **{field: value})
    with pytest.raises(AdmissionError) as info:
        AdmissionController(HYBRID, 30, config)
    assert info.value.field == field


def test_prompt_too_long_and_never_fits_are_rejections_not_errors():
    ctrl = make()
    assert kinds(ctrl.submit(RequestSpec("long", 65), 0.0)) == [("reject", "prompt_too_long", "long")]
    # L = 64: sliding min(cdiv(min(15 + 16, 64), 8) + 1, 8) = 5 twice, full 8: 18 blocks.
    small = AdmissionController(HYBRID, 17, AdmissionConfig(max_model_len=64, max_num_batched_tokens=16))
    assert kinds(small.submit(RequestSpec("big", 8), 0.0)) == [("reject", "never_fits", "big")]
    assert small.snapshot(0.0).rejections_by_reason == {"never_fits": 1}
    ctrl.check_integrity()
    small.check_integrity()


def test_decisions_are_numbered_and_carry_the_state_after_them():
    ctrl = make(policy="guaranteed")
    [a] = ctrl.submit(RequestSpec("a", 20, 12, engine_id="e", tenant="t"), 5.0)
    # L = 32, F = 16: sliding min(cdiv(min(31, 32), 8) + 1, 4) = 4; full cdiv(32, 8) = 4.
    # First chunk: min(20, 0 + 16) = 16 slots -> 2 blocks per group.
    assert (a.seq, a.time_s, a.kind, a.reason) == (1, 5.0, DecisionKind.ADMIT, Reason.FITS)
    assert (a.engine_id, a.tenant, a.policy) == ("e", "t", "guaranteed")
    assert (a.prompt_tokens, a.max_new_tokens, a.num_tokens, a.num_computed) == (20, 12, 16, 0)
    assert a.blocks_reserved == (4, 4, 4) and a.blocks_held == (2, 2, 2)
    assert a.new_block_ids == ((1, 2), (3, 4), (5, 6))
    assert (a.num_free_blocks, a.num_waiting, a.num_running) == (24, 0, 1)
    [g] = ctrl.grow("a", 20, 6.0)  # 20 slots: cdiv(20, 8) = 3 per group
    assert (g.seq, g.kind, g.new_block_ids, g.num_free_blocks) == (2, DecisionKind.GROW, ((7,), (8,), (9,)), 21)
    [r] = ctrl.finish("a", 7.0)
    assert (r.seq, r.kind, r.freed_blocks, r.num_free_blocks, r.num_running) == (3, DecisionKind.RELEASE, 9, 30, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.seq = 9  # type: ignore[misc]
    ctrl.check_integrity()


def test_grow_for_a_waiting_request_is_denied_and_progress_ignored():
    ctrl = AdmissionController(
        SMALL_LAYOUTS["full"], 3, AdmissionConfig(max_model_len=64, max_num_batched_tokens=64, watermark=0.0)
    )
    ctrl.submit(RequestSpec("a", 24, 0), 0.0)  # 3 blocks: the pool
    ctrl.submit(RequestSpec("b", 8, 8), 0.0)  # waits
    assert kinds(ctrl.grow("b", 9, 0.0)) == [("deny", "not_running", "b")]
    assert ctrl.progress("b", 0, 0.0) == []
    ctrl.check_integrity()


def test_grow_past_the_maximum_length_is_refused_for_a_waiting_request_too():
    """b's maximum length is 8 + 8 = 16 slots: a grow to 17 is the engine's error, named
    by field, whether b runs or waits; nothing is logged or moved by it."""
    ctrl = AdmissionController(
        SMALL_LAYOUTS["full"], 3, AdmissionConfig(max_model_len=64, max_num_batched_tokens=64, watermark=0.0)
    )
    ctrl.submit(RequestSpec("a", 24, 0), 0.0)  # 3 blocks: the pool
    ctrl.submit(RequestSpec("b", 8, 8), 0.0)  # waits
    before = ctrl.snapshot(0.0)
    with pytest.raises(AdmissionError) as refused:
        ctrl.grow("b", 17, 0.0)
    assert refused.value.field == "num_tokens" and "maximum length 16" in str(refused.value)
    assert ctrl.snapshot(0.0) == before
    assert kinds(ctrl.grow("b", 16, 0.0)) == [("deny", "not_running", "b")]  # at the limit: not yet
    ctrl.check_integrity()


def test_expire_engine_takes_back_running_and_queued_requests():
    ctrl = make()
    ctrl.submit(RequestSpec("a", 60, 4, engine_id="e1"), 0.0)
    ctrl.submit(RequestSpec("b", 60, 4, engine_id="e1"), 0.0)
    ctrl.submit(RequestSpec("c", 8, 4, engine_id="e2"), 0.0)
    out = ctrl.expire_engine("e1", 1.0)
    assert sorted((d.kind.value, d.reason.value, d.request_id) for d in out) == [
        ("expire", "lease_expired", "a"), ("expire", "lease_expired", "b"),
    ]
    assert ctrl.num_running == 1 and ctrl.num_waiting == 0
    ctrl.check_integrity()


def test_set_policy_applies_to_new_admissions_only():
    ctrl = make(policy="guaranteed")
    [a] = ctrl.submit(RequestSpec("a", 8, 24), 0.0)
    [p] = ctrl.set_policy("optimistic", 1.0)
    assert (p.kind, p.reason, p.policy, p.detail) == (DecisionKind.POLICY, Reason.SWITCH, "optimistic", "guaranteed -> optimistic")
    [b] = ctrl.submit(RequestSpec("b", 8, 24), 1.0)
    assert b.policy == "optimistic" and b.blocks_reserved == b.blocks_held
    [g] = ctrl.grow("a", 9, 1.0)
    assert g.policy == "guaranteed" and g.blocks_reserved == a.blocks_reserved
    snap = ctrl.snapshot(1.0)
    assert snap.policy == "optimistic" and snap.decisions_by_kind["policy"] == 1
    ctrl.check_integrity()


def test_set_policy_to_the_policy_in_force_is_no_decision():
    ctrl = make(policy="guaranteed")
    [a] = ctrl.submit(RequestSpec("a", 8, 24), 0.0)
    assert ctrl.set_policy("guaranteed", 1.0) == []
    # Nothing numbered, nothing counted: the next decision follows a's.
    [b] = ctrl.submit(RequestSpec("b", 8, 24), 1.0)
    assert b.seq == a.seq + 1
    assert "policy" not in ctrl.snapshot(1.0).decisions_by_kind
    ctrl.check_integrity()


def test_snapshot_counts_without_walking_the_pool():
    ctrl = make(policy="guaranteed")
    ctrl.submit(RequestSpec("a", 20, 12, tenant="t"), 0.0)
    snap = ctrl.snapshot(1.0)
    # held 2 per group, reserved 4 per group -> 2 per group promised but not held.
    assert (snap.num_blocks, snap.num_held_blocks, snap.num_reserved_blocks) == (30, 6, 6)
    assert [(g.kind, g.blocks_held, g.blocks_reserved) for g in snap.groups] == [
        ("sliding_window", 2, 2), ("sliding_window", 2, 2), ("full_attention", 2, 2),
    ]
    assert [(t.tenant, t.blocks_held, t.blocks_reserved, t.running) for t in snap.tenants] == [("t", 6, 6, 1)]
    assert snap.usage == 6 / 30
    ctrl.check_integrity()


def test_predictor_quantile_per_tenant_and_feedback():
    p = OutputLengthPredictor(quantile=0.5, min_samples=2, decay=0.1)
    assert p.predict("a", 100) == 100  # cold start: max new tokens
    for n in (10, 20, 30):
        p.observe("a", n)
    p.observe("b", 500)
    p.observe("b", 700)
    # median (nearest rank) of a's 10, 20, 30 = ceil(0.5 * 3) = 2nd = 20; b's own = 500.
    assert p.predict("a", 100) == 20 and p.predict("b", 1000) == 500
    assert p.predict("c", 100) == 30  # no data for c: all tenants, ceil(0.5 * 5) = 3rd = 30
    assert p.predict("a", 15) == 15  # never above the request's own maximum
    p.on_preemption()  # 0.5 -> 0.75: ceil(0.75 * 3) = 3rd = 30
    assert p.predict("a", 100) == 30
    p.observe("a", 30)  # decays 0.75 -> 0.65: ceil(0.65 * 4) = 3rd of 10, 20, 30, 30
    assert p.quantile == pytest.approx(0.65) and p.predict("a", 100) == 30


def _two_running_one_waiting() -> AdmissionController:
    """One full-attention group, B = 8, 9 blocks, F = 64 (a prompt is one chunk).
    a, b: 16-token prompts, 2 blocks each (5 free); c: a 48-token prompt, 6 blocks > 5: QUEUE."""
    ctrl = AdmissionController(
        SMALL_LAYOUTS["full"], 9,
        AdmissionConfig(max_model_len=64, max_num_batched_tokens=64, watermark=0.0, policy="optimistic"),
    )
    for request_id, prompt in (("a", 16), ("b", 16), ("c", 48)):
        ctrl.submit(RequestSpec(request_id, prompt, 32), 0.0)
    ctrl.progress("a", 16, 1.0)
    ctrl.progress("b", 16, 1.0)
    assert [r.request_id for r in ctrl.waiting_requests()] == ["c"] and ctrl.pool.num_free_blocks == 5
    return ctrl


def test_a_held_queue_gets_what_the_steps_running_requests_leave():
    # One engine step: a finishes (7 free), b grows 16 -> 40 tokens (+3 blocks).
    # Op by op, a's blocks went to c (6 of 7), and b's grow then preempted c, the latest
    # arrival, before it computed a token: admitted and preempted in one step.
    ctrl = _two_running_one_waiting()
    assert kinds(ctrl.finish("a", 2.0) + ctrl.grow("b", 40, 2.0)) == [
        ("release", "finished", "a"), ("admit", "fits", "c"), ("preempt", "growth", "c"), ("grow", "fits", "b")]
    # As the daemon's Step applies it: b grows first (7 - 3 = 4 free), then c is tried
    # and still does not fit (6 > 4), so it waits, never admitted to be preempted.
    ctrl = _two_running_one_waiting()
    ctrl.hold_queue()
    assert kinds(ctrl.finish("a", 2.0) + ctrl.grow("b", 40, 2.0)) == [("release", "finished", "a"), ("grow", "fits", "b")]
    assert ctrl.release_queue(2.0) == []
    assert ctrl.pool.num_free_blocks == 4 and [r.request_id for r in ctrl.waiting_requests()] == ["c"]
    ctrl.check_integrity()
    # ...and once b finishes too (4 + 5 = 9 free), c is admitted on the release.
    ctrl.hold_queue()
    assert kinds(ctrl.finish("b", 3.0)) == [("release", "finished", "b")]
    assert kinds(ctrl.release_queue(3.0)) == [("admit", "fits", "c")]
    assert ctrl.pool.num_free_blocks == 3
    ctrl.check_integrity()


def test_closed_admissions_reject_the_waiting_and_admit_nothing_more():
    ctrl = _two_running_one_waiting()
    assert kinds(ctrl.close_admissions(2.0)) == [("reject", "draining", "c")]
    assert ctrl.waiting_requests() == [] and not ctrl.admitting
    assert kinds(ctrl.submit(RequestSpec("d", 8, 8), 2.0)) == [("reject", "draining", "d")]
    # Running requests still grow: b 16 -> 48 tokens (+4 of the 5 free), then a likewise
    # (+4 of 1): b, the later arrival, is preempted for it (6 back), and, admissions being
    # closed, rejected at once rather than left to wait for good.
    assert kinds(ctrl.grow("b", 48, 3.0)) == [("grow", "fits", "b")]
    assert kinds(ctrl.grow("a", 48, 3.0)) == [
        ("preempt", "growth", "b"), ("grow", "fits", "a"), ("reject", "draining", "b")]
    assert kinds(ctrl.finish("a", 4.0)) == [("release", "finished", "a")]  # nothing waits to be admitted
    assert ctrl.num_running == 0 and ctrl.pool.num_free_blocks == 9
    ctrl.check_integrity()
