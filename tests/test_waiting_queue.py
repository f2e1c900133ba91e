"""The waiting queue's order, kept incrementally (sorted tenant heads, moved only when a
tenant's first request or usage changes), always equals the plain definition: every
waiting request sorted by (priority, class, usage of its tenant, arrival), or by
(priority, class, arrival) without fair share; and its count per engine is the plain
count. And a pass costs no more for many tenants."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController
from kvbudget.daemon.core.records import RequestSpec
from kvbudget.daemon.core.requests import RequestState
from kvbudget.daemon.core.waiting_queue import TenantAccount, WaitingQueue

from test_admission_support import SMALL_LAYOUTS, kinds

TENANTS = ("a", "b", "c", "d")

operations = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.sampled_from(TENANTS), st.integers(0, 2), st.booleans()),
        st.tuples(st.just("remove"), st.integers(0, 1000), st.just(0), st.just(False)),
        st.tuples(st.just("charge"), st.sampled_from(TENANTS), st.integers(-5, 9), st.just(False)),
        st.tuples(st.just("weight"), st.sampled_from(TENANTS), st.integers(1, 4), st.just(False)),
    ),
    max_size=60,
)


def expected_order(waiting: list[RequestState], tenants: dict[str, TenantAccount], fair_share: bool) -> list[str]:
    def key(r: RequestState) -> tuple:
        priority, klass, order = r.queue_key
        return priority, klass, tenants[r.tenant].usage() if fair_share else 0.0, order

    return [r.request_id for r in sorted(waiting, key=key)]


@settings(max_examples=300, deadline=None)
@given(ops=operations, fair_share=st.booleans())
def test_in_order_is_the_sorted_definition_after_any_changes(ops, fair_share: bool) -> None:
    tenants = {name: TenantAccount(name) for name in TENANTS}
    queue = WaitingQueue(fair_share=fair_share)
    waiting: list[RequestState] = []
    for n, (kind, tenant, value, preempted) in enumerate(ops):
        if kind == "push":
            spec = RequestSpec(f"r{n}", 8, priority=value, tenant=tenant, engine_id=f"e{n % 3}")
            r = RequestState(spec, 8, n, 1)
            queue.push(r, preempted, tenants[tenant].usage())
            waiting.append(r)
        elif kind == "remove" and waiting:
            queue.remove(waiting.pop(tenant % len(waiting) if isinstance(tenant, int) else 0))
        elif kind in ("charge", "weight"):
            account = tenants[tenant]
            if kind == "charge":
                account.charged = max(0, account.charged + value)
            else:
                account.weight = float(value)
            queue.usage_changed.add(tenant)  # as the ledger and the controller say so
        assert [r.request_id for r in queue.in_order(tenants)] == expected_order(waiting, tenants, fair_share)
        assert len(queue) == len(waiting)
        # Kept as requests come and go (snapshots read it): the count of each engine's waiting.
        assert queue.num_by_engine == Counter(r.spec.engine_id for r in waiting)


def test_a_tenant_whose_running_request_grows_moves_back_in_the_queue() -> None:
    # One full-attention group, B = 8, 10 blocks, fair share, no backfill past the head.
    # a-run holds 2 blocks (16 tokens), b-run 1 block (8); x-run fills the pool (7 blocks).
    # Waiting: a2 (arrived first) then b2. Usage a 2 > b 1: b2 is the head.
    ctrl = AdmissionController(
        SMALL_LAYOUTS["full"], 10,
        AdmissionConfig(max_model_len=64, max_num_batched_tokens=64, watermark=0.0, policy="optimistic",
                        backfill_depth=0),
    )
    for request_id, prompt, tenant in (("a-run", 16, "a"), ("b-run", 8, "b"), ("x-run", 56, "x")):
        assert kinds(ctrl.submit(RequestSpec(request_id, prompt, 40, tenant=tenant), 0.0))[0][0] == "admit"
    for request_id, tenant in (("a2", "a"), ("b2", "b")):
        assert kinds(ctrl.submit(RequestSpec(request_id, 8, 8, tenant=tenant), 0.0))[0][0] == "queue"
    assert [r.request_id for r in ctrl.waiting_requests()] == ["b2", "a2"]
    # b-run grows 8 -> 32 tokens (+3 blocks after x-run frees 7): b's usage 4 > a's 2,
    # so a2 is the head now; the queue must see it without being told by a push.
    ctrl.hold_queue()
    ctrl.finish("x-run", 1.0)
    ctrl.progress("b-run", 8, 1.0)
    assert kinds(ctrl.grow("b-run", 32, 1.0)) == [("grow", "fits", "b-run")]
    assert [r.request_id for r in ctrl.waiting_requests()] == ["a2", "b2"]
    ctrl.check_integrity()
    assert kinds(ctrl.release_queue(1.0)) == [("admit", "fits", "a2"), ("admit", "fits", "b2")]
    ctrl.check_integrity()


def test_many_tenants_cost_a_pass_no_more_than_a_few() -> None:
    # 3,000 one-request tenants waiting (a user or API key each): every submit looks at
    # the queue's first candidates. Merging every tenant's list for each look made this
    # quadratic (a 3,000-submit step took 20 s and other engines' leases lapsed). Counted,
    # not timed: the tenants' usages read (`usage()` calls) per submit stay a handful.
    ctrl = AdmissionController(
        SMALL_LAYOUTS["full"], 4,
        AdmissionConfig(max_model_len=64, max_num_batched_tokens=64, watermark=0.0, policy="guaranteed"),
    )
    ctrl.submit(RequestSpec("big", 32, 0, tenant="owner"), 0.0)  # all 4 blocks: everything after waits
    calls = 0
    original = TenantAccount.usage

    def counting(self: TenantAccount) -> float:
        nonlocal calls
        calls += 1
        return original(self)

    TenantAccount.usage = counting  # type: ignore[method-assign]
    try:
        for i in range(3000):
            assert kinds(ctrl.submit(RequestSpec(f"r{i}", 8, 8, tenant=f"user-{i}"), 0.0))[0][0] == "queue"
    finally:
        TenantAccount.usage = original  # type: ignore[method-assign]
    assert calls <= 2 * 3000  # one at each push (its place); none per tenant per look
    ctrl.check_integrity()


def test_a_preempted_request_not_yet_tried_waits_behind_the_others_not_for_none() -> None:
    # One full-attention group, B = 8, 9 blocks, no backfill. a, b: 2 blocks each; c (48
    # tokens, 6 blocks > 5 free) waits for room. a grows to 48 tokens (+4 of 5), then b
    # (priority 1, the least important) preempts itself growing: it waits behind c, untried.
    # It kept the reason of its admission: the snapshot said it waited for "none".
    ctrl = AdmissionController(
        SMALL_LAYOUTS["full"], 9,
        AdmissionConfig(max_model_len=64, max_num_batched_tokens=64, watermark=0.0, policy="optimistic",
                        backfill_depth=0),
    )
    for request_id, prompt, priority in (("a", 16, 0), ("b", 16, 1), ("c", 48, 0)):
        ctrl.submit(RequestSpec(request_id, prompt, 32, priority=priority), 0.0)
    ctrl.progress("a", 16, 1.0)
    ctrl.progress("b", 16, 1.0)
    assert kinds(ctrl.grow("a", 48, 2.0) + ctrl.grow("b", 48, 2.0)) == [
        ("grow", "fits", "a"), ("preempt", "growth", "b")]
    assert ctrl.snapshot(2.0).waiting_by_reason == {"pool_full": 1, "queue_ahead": 1}
    ctrl.check_integrity()


def test_the_order_version_moves_whenever_the_order_may_have() -> None:
    # Backfill skips a pass that would try no one again only while this number stands:
    # a push or a removal moves it; a tenant's usage moving among others leaves it
    # unknown (None) until in_order has placed the tenant again, and then moved.
    tenants = {name: TenantAccount(name) for name in ("a", "b")}
    queue = WaitingQueue()
    ra, rb = (RequestState(RequestSpec(f"r{t}", 8, tenant=t), 8, n, 1) for n, t in enumerate("ab"))
    queue.push(ra, False)
    first = queue.order_version()
    queue.usage_changed.add("a")  # one tenant waiting: its usage moves it past no one
    assert queue.order_version() == first
    list(queue.in_order(tenants))
    assert queue.order_version() == first
    queue.push(rb, False)
    second = queue.order_version()
    assert second not in (None, first)
    tenants["a"].charged = 5
    queue.usage_changed.add("a")  # two waiting: a now goes behind b
    assert queue.order_version() is None
    assert [r.request_id for r in queue.in_order(tenants)] == ["rb", "ra"]
    third = queue.order_version()
    assert third not in (None, second)
    queue.remove(rb)
    assert queue.order_version() not in (None, third)
