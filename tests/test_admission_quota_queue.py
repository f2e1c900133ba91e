"""Tenant quotas and the queue: a tenant at its quota waits (reason tenant_quota) and the
other tenants' requests proceed, however many of its requests wait ahead of theirs and
however long they have waited (backfill depth and aging are about the pool, not quotas)."""

from __future__ import annotations

from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController
from kvbudget.daemon.core.records import Reason, RequestSpec
from kvbudget.daemon.core.requests import RequestState, Status
from kvbudget.daemon.core.waiting_queue import TenantAccount, WaitingQueue

from test_admission_support import SMALL_LAYOUTS, kinds

FULL = SMALL_LAYOUTS["full"]  # one group, B = 8


def _controller(**kw) -> AdmissionController:
    config = AdmissionConfig(max_model_len=64, max_num_batched_tokens=64, policy="optimistic", watermark=0.0, **kw)
    ctrl = AdmissionController(FULL, 100, config)
    ctrl.set_tenant_quota("a", 0.1)  # 10 of the 100 blocks
    return ctrl


def _fill(ctrl: AdmissionController, num_a: int, now: float) -> None:
    # b holds 16 blocks, more than a's 10: under fair share a's waiting requests go first.
    for rid in ("b0", "b1"):
        ctrl.submit(RequestSpec(rid, 64, 0, tenant="b"), now)
    for i in range(num_a):  # 5 blocks each: two fit a's quota, the rest wait for it
        ctrl.submit(RequestSpec(f"a{i}", 40, 8, tenant="a"), now)


def test_many_requests_waiting_for_their_quota_do_not_hold_back_another_tenant():
    ctrl = _controller(backfill_depth=16)
    _fill(ctrl, 20, 0.0)
    assert ctrl.request("a5").wait_reason is Reason.TENANT_QUOTA
    out = ctrl.submit(RequestSpec("b2", 16, 8, tenant="b"), 0.0)
    # 74 of 100 blocks free, b has no quota: b2 must not wait behind a's 18 requests.
    assert kinds(out)[0] == ("admit", "fits", "b2"), kinds(out)
    assert ctrl.request("a19").status is Status.WAITING
    ctrl.check_integrity()


def test_a_head_waiting_long_for_its_quota_does_not_stop_another_tenant():
    ctrl = _controller(max_head_wait_s=30.0)
    _fill(ctrl, 3, 0.0)
    head = ctrl.waiting_requests()[0]
    assert (head.request_id, head.wait_reason) == ("a2", Reason.TENANT_QUOTA)
    # a2 has waited 100 s, for its tenant's quota, not for blocks: aging protects a head
    # from being starved of blocks; passing it takes nothing from a's quota.
    out = ctrl.submit(RequestSpec("b2", 16, 8, tenant="b"), 100.0)
    assert kinds(out)[0] == ("admit", "fits", "b2"), kinds(out)
    ctrl.check_integrity()


def test_the_quota_tenant_still_gets_its_turn_once_its_requests_finish():
    ctrl = _controller()
    _fill(ctrl, 3, 0.0)
    out = ctrl.finish("a0", 1.0)
    assert kinds(out) == [("release", "finished", "a0"), ("admit", "fits", "a2")]
    ctrl.check_integrity()


def test_a_later_request_of_a_tenant_at_its_quota_waits_behind_its_tenants_requests():
    ctrl = _controller()
    for rid in ("b0", "b1"):
        ctrl.submit(RequestSpec(rid, 64, 0, tenant="b"), 0.0)
    ctrl.submit(RequestSpec("a0", 40, 8, tenant="a"), 0.0)  # 5 blocks
    ctrl.submit(RequestSpec("a1", 32, 8, tenant="a"), 0.0)  # 4: a is charged 9 of its 10
    assert kinds(ctrl.submit(RequestSpec("a2", 40, 8, tenant="a"), 0.0)) == [("queue", "tenant_quota", "a2")]
    # a3's 1 block would fit a's quota and the pool, but a2 waits for that quota first: a3
    # waits behind it (backfilled, it could keep a's bigger requests waiting for ever).
    assert kinds(ctrl.submit(RequestSpec("a3", 8, 8, tenant="a"), 0.0)) == [("queue", "tenant_quota", "a3")]
    ctrl.check_integrity()
    out = ctrl.finish("a0", 1.0)
    assert kinds(out) == [("release", "finished", "a0"), ("admit", "fits", "a2"), ("admit", "fits", "a3")]
    ctrl.check_integrity()


def _queue_with(tenants: dict[str, int]) -> tuple[WaitingQueue, dict[str, TenantAccount]]:
    queue = WaitingQueue(fair_share=False)
    accounts = {name: TenantAccount(name) for name in tenants}
    order = 0
    for name, count in tenants.items():
        for i in range(count):
            order += 1
            queue.push(RequestState(RequestSpec(f"{name}{i}", 8, 8, tenant=name), 16, order, 1), preempted=False)
    return queue, accounts


def test_the_queue_leaves_out_a_tenant_put_in_skip_while_it_is_walked():
    # One tenant (its own fast path) and several (the merge): once a tenant is in `skip`,
    # none of its requests comes out, so thousands waiting for a quota are never walked.
    for tenants in ({"a": 5000}, {"a": 5000, "b": 2}):
        queue, accounts = _queue_with(tenants)
        skip: set[str] = set()
        seen = []
        for r in queue.in_order(accounts, skip=skip):
            seen.append(r.request_id)
            skip.add(r.spec.tenant)
        assert seen == ["a0", "b0"][: len(tenants)], seen
        # Without `skip`, every request, in order.
        assert len(list(queue.in_order(accounts))) == sum(tenants.values())


def test_a_lone_tenant_held_by_its_quota_waits_in_its_own_order() -> None:
    # Guaranteed, one full-attention group, B = 8, 10 blocks; tenant q may hold 5. Its
    # running request holds 3: q1 (3 blocks) waits for the quota, and q2 (1 block, which
    # the quota would take) waits behind it: the pass stops at q1, whose tenant is the
    # only one waiting (backfill does not pass a request of the same tenant).
    ctrl = AdmissionController(
        SMALL_LAYOUTS["full"], 10,
        AdmissionConfig(max_model_len=64, max_num_batched_tokens=64, policy="guaranteed", watermark=0.0),
    )
    ctrl.set_tenant_quota("q", 0.5)
    assert kinds(ctrl.submit(RequestSpec("run", 24, 0, tenant="q"), 0.0)) == [("admit", "fits", "run")]
    assert kinds(ctrl.submit(RequestSpec("q1", 24, 0, tenant="q"), 0.0)) == [("queue", "tenant_quota", "q1")]
    assert kinds(ctrl.submit(RequestSpec("q2", 8, 0, tenant="q"), 0.0)) == [("queue", "tenant_quota", "q2")]
    assert ctrl.schedule(1.0) == [] and ctrl.schedule(2.0) == []
    assert kinds(ctrl.finish("run", 3.0)) == [("release", "finished", "run"), ("admit", "fits", "q1"),
                                              ("admit", "fits", "q2")]  # fmt: skip
    ctrl.check_integrity()
