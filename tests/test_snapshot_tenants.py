"""A snapshot's tenant list is bounded: the configured tenants, the largest others, and one
"(other)" entry summing the rest; `num_tenants` says how many there are.

Tenant names come from the engines' requests (often a user id): 20,000 of them made every
GetSnapshot, and every Watch update (up to 10 Hz a watcher), carry 20,000 entries.
"""

from __future__ import annotations

import dataclasses

from kvbudget.daemon.wire import convert

from kvbudget.daemon.server import metrics
from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController
from kvbudget.daemon.core.admission_report import tenant_snapshots
from kvbudget.daemon.core.records import MAX_SNAPSHOT_TENANTS, OTHER_TENANTS, RequestSpec, TenantSnapshot
from kvbudget.v1 import common_pb2

from test_admission_support import SMALL_LAYOUTS

FULL = SMALL_LAYOUTS["full"]  # one group, 8 tokens a block


def make(num_blocks: int) -> AdmissionController:
    config = AdmissionConfig(max_model_len=64, max_num_batched_tokens=64, watermark=0.0, policy="guaranteed")
    return AdmissionController(FULL, num_blocks, config)


def req(rid: str, blocks: int, tenant: str, new_blocks: int = 0) -> RequestSpec:
    """`blocks` prompt blocks, and `new_blocks` more reserved for its output (guaranteed)."""
    return RequestSpec(rid, 8 * blocks, 8 * new_blocks, tenant=tenant)


def row(t: TenantSnapshot) -> tuple:
    return t.tenant, t.blocks_held, t.blocks_reserved, t.quota_blocks, t.running, t.waiting


def six_tenants() -> AdmissionController:
    """20 blocks. Held + reserved: a 5, r 1 + 4, b 4, c 3, d 1; e holds none, 2 wait (2 blocks
    are free, its requests need 3). q has a quota (0.25 x 20 = 5 blocks) and nothing else."""
    ctrl = make(20)
    ctrl.set_tenant_quota("q", 0.25)
    for rid, blocks, tenant, new in [("a1", 5, "a", 0), ("r1", 1, "r", 4), ("b1", 4, "b", 0),
                                     ("c1", 3, "c", 0), ("d1", 1, "d", 0), ("e1", 3, "e", 0), ("e2", 3, "e", 0)]:
        ctrl.submit(req(rid, blocks, tenant, new), 0.0)
    ctrl.check_integrity()
    return ctrl


def test_a_cut_list_keeps_the_configured_and_the_largest_and_sums_the_rest():
    ctrl = six_tenants()
    # 6 tenants without a quota, room for 3 entries: the 2 largest, then (other).
    # a and r tie at 5 blocks held + reserved and one request each: by name, a then r.
    # (other) = b + c + d + e: held 4 + 3 + 1 + 0 = 8, running 3, waiting 2.
    assert [row(t) for t in tenant_snapshots(ctrl.ledger, limit=3)] == [
        ("q", 0, 0, 5, 0, 0),  # a quota, nothing held nor waiting: listed all the same
        ("a", 5, 0, None, 1, 0),
        ("r", 1, 4, None, 1, 0),  # reserved blocks count: it outranks b, which holds 4
        (OTHER_TENANTS, 8, 0, None, 3, 2),
    ]
    # Room for 4: b joins; (other) = c + d + e.
    assert [row(t) for t in tenant_snapshots(ctrl.ledger, limit=4)][3:] == [
        ("b", 4, 0, None, 1, 0),
        (OTHER_TENANTS, 4, 0, None, 2, 2),
    ]
    assert [t.tenant for t in tenant_snapshots(ctrl.ledger, limit=5)] == ["q", "a", "r", "b", "c", OTHER_TENANTS]


def test_under_the_cap_the_list_is_as_before_and_has_no_other_entry():
    ctrl = six_tenants()
    everyone = [("q", 0, 0, 5, 0, 0), ("a", 5, 0, None, 1, 0), ("r", 1, 4, None, 1, 0), ("b", 4, 0, None, 1, 0),
                ("c", 3, 0, None, 1, 0), ("d", 1, 0, None, 1, 0), ("e", 0, 0, None, 0, 2)]
    # 6 without a quota and room for 6 (the quota'd one is not counted): all, as they came.
    assert [row(t) for t in tenant_snapshots(ctrl.ledger, limit=6)] == everyone
    snap = ctrl.snapshot(0.0)
    assert [row(t) for t in snap.tenants] == everyone
    assert snap.num_tenants == 7


def test_the_snapshot_lists_at_most_the_cap_and_counts_them_all():
    # 8 blocks: "big" holds 4, "mid" 2 (running); 150 tenants wait with one 3-block request
    # each (2 blocks free); "quiet" has a weight and nothing else, "capped" a quota.
    ctrl = make(8)
    ctrl.set_tenant_quota("quiet", None, weight=2.0)
    ctrl.set_tenant_quota("capped", 0.5)
    ctrl.submit(req("big1", 4, "big"), 0.0)
    ctrl.submit(req("mid1", 2, "mid"), 0.0)
    for i in range(150):
        ctrl.submit(req(f"w{i}", 3, f"user-{i:03d}"), 0.0)
    ctrl.check_integrity()
    snap = ctrl.snapshot(0.0)
    assert len(snap.tenants) == 2 + MAX_SNAPSHOT_TENANTS  # 154 before
    assert snap.num_tenants == 154
    names = [t.tenant for t in snap.tenants]
    # The configured first, then big and mid, then the waiting ones by name, then the sum.
    kept_waiting = MAX_SNAPSHOT_TENANTS - 1 - 2
    assert names == ["capped", "quiet", "big", "mid", *(f"user-{i:03d}" for i in range(kept_waiting)), OTHER_TENANTS]
    assert row(snap.tenants[-1]) == (OTHER_TENANTS, 0, 0, None, 0, 150 - kept_waiting)
    # The figures still add up to the whole.
    assert sum(t.waiting for t in snap.tenants) == snap.num_waiting == 150
    assert sum(t.running for t in snap.tenants) == snap.num_running == 2
    assert sum(t.blocks_held for t in snap.tenants) == 6


def test_a_tenant_named_other_joins_the_sum_when_the_list_is_cut():
    ctrl = six_tenants()
    ctrl.submit(req("o1", 3, OTHER_TENANTS), 0.0)  # waits, as e's do
    # Uncut, it is listed as it is.
    assert [t.tenant for t in tenant_snapshots(ctrl.ledger, limit=7)][-1] == OTHER_TENANTS
    # Cut: one (other) entry, with its request in it; the largest (a) still named.
    tenants = tenant_snapshots(ctrl.ledger, limit=2)
    assert [row(t) for t in tenants] == [
        ("q", 0, 0, 5, 0, 0),
        ("a", 5, 0, None, 1, 0),
        (OTHER_TENANTS, 9, 4, None, 4, 3),  # r + b + c + d + e + "(other)"
    ]


def test_metrics_read_from_a_cut_snapshot_are_those_of_the_whole_list():
    """/metrics names its own top tenants from the snapshot and sums the rest: it must get the
    same series as from every tenant (same order, and the snapshot keeps more than it names)."""
    assert metrics.OTHER_TENANTS == OTHER_TENANTS
    assert MAX_SNAPSHOT_TENANTS >= metrics.MAX_TENANT_SERIES
    ctrl = make(64)
    ctrl.set_tenant_quota("gold", 0.25)
    ctrl.set_tenant_quota("heavy", None, weight=3.0)
    for i in range(40):  # running, 1 block each, some with reserved output blocks: ties
        ctrl.submit(req(f"r{i}", 1, f"run-{i % 13:02d}", i % 2), 0.0)
    for i in range(300):  # waiting: 1 to 3 requests each
        ctrl.submit(req(f"w{i}", 8, f"wait-{i % 170:03d}"), 0.0)
    ctrl.check_integrity()
    cut = ctrl.snapshot(0.0)
    whole = tenant_snapshots(ctrl.ledger, limit=10**9)
    assert len(whole) == 2 + 13 + 170 and len(cut.tenants) == 2 + MAX_SNAPSHOT_TENANTS
    from_cut = tenant_series(cut)
    assert len(from_cut) == 2 * 2 * metrics.MAX_TENANT_SERIES  # (blocks, requests) x 2 states each
    assert from_cut == tenant_series(dataclasses.replace(cut, tenants=tuple(whole)))


def tenant_series(snapshot) -> list[tuple[str, tuple, float]]:
    """The tenant gauges /metrics shows for this snapshot, in order."""
    fed = metrics.Metrics()
    fed.update(snapshot)
    return [
        (sample.name, tuple(sorted(sample.labels.items())), sample.value)
        for family in fed.registry.collect()
        if family.name in ("kvbudget_tenant_blocks", "kvbudget_tenant_requests")
        for sample in family.samples
    ]


def test_the_count_crosses_the_wire():
    ctrl = make(8)
    ctrl.submit(req("big1", 4, "big"), 0.0)
    for i in range(MAX_SNAPSHOT_TENANTS + 5):
        ctrl.submit(req(f"w{i}", 8, f"user-{i:03d}"), 0.0)
    msg = convert.snapshot_to_proto(ctrl.snapshot(1.0))
    back = common_pb2.Snapshot.FromString(msg.SerializeToString())
    assert back.num_tenants == MAX_SNAPSHOT_TENANTS + 6
    assert len(back.tenants) == MAX_SNAPSHOT_TENANTS
    other = back.tenants[-1]
    # big and 98 waiting tenants named; the other 7 waiting ones summed.
    assert (other.tenant, other.blocks_held, other.waiting, other.quota_blocks) == (OTHER_TENANTS, 0, 7, 0)
    # Uncut: the count is the list's length.
    small = common_pb2.Snapshot.FromString(convert.snapshot_to_proto(make(8).snapshot(1.0)).SerializeToString())
    assert (small.num_tenants, len(small.tenants)) == (0, 0)
    assert convert.snapshot_to_proto(six_tenants().snapshot(0.0)).num_tenants == 7


def test_the_folded_count_is_read_one_way_by_the_cli_and_the_dashboard():
    """`kvbudget admin status` and the dashboard both say how many tenants "(other)" sums:
    one definition, in a module neither textual nor the daemon comes with."""
    import kvbudget.cli.cmd_admin
    import kvbudget.client.tenants
    import kvbudget.tui.engines
    import kvbudget.tui.state
    from kvbudget.client.tenants import tenants_folded

    assert kvbudget.cli.cmd_admin.tenants_folded is tenants_folded
    assert kvbudget.tui.engines.tenants_folded is tenants_folded
    assert not hasattr(kvbudget.tui.state, "tenants_folded")  # no second copy to drift

    def snap(num_tenants: int, listed: int) -> common_pb2.Snapshot:
        s = common_pb2.Snapshot(num_tenants=num_tenants)
        for i in range(listed - 1 if num_tenants > listed else listed):
            s.tenants.add(tenant=f"t{i}")
        if num_tenants > listed:
            s.tenants.add(tenant=OTHER_TENANTS)
        return s

    assert tenants_folded(snap(0, 0)) == 0  # no tenant at all
    assert tenants_folded(snap(0, 3)) == 0  # an older daemon sends no count: its list is whole
    assert tenants_folded(snap(3, 3)) == 0  # whole
    # 10 tenants, 4 entries: 3 named, "(other)" sums the 7 others.
    assert tenants_folded(snap(10, 4)) == 7
    assert tenants_folded(common_pb2.Snapshot(num_tenants=5)) == 0  # a count, but no list to fold into
    # Over the wire, from the daemon's own cut list: big and 98 named, 7 summed.
    ctrl = make(8)
    ctrl.submit(req("big1", 4, "big"), 0.0)
    for i in range(MAX_SNAPSHOT_TENANTS + 5):
        ctrl.submit(req(f"w{i}", 8, f"user-{i:03d}"), 0.0)
    back = common_pb2.Snapshot.FromString(convert.snapshot_to_proto(ctrl.snapshot(1.0)).SerializeToString())
    assert tenants_folded(back) == 7 == back.tenants[-1].waiting
