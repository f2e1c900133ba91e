"""`kvbudget admin status` on a snapshot whose tenant list the daemon cut: the last entry,
"(other)", is the sum of the tenants left out, shown as "+N more" (never as a tenant named
"(other)"), and the true tenant count is given, in text and in JSON."""

from __future__ import annotations

import json

from kvbudget.cli.cmd_admin import render_status, status_fields
from kvbudget.daemon.core.records import OTHER_TENANTS
from kvbudget.v1 import common_pb2


def _snapshot(num_tenants: int, *tenants: common_pb2.TenantState) -> common_pb2.Snapshot:
    return common_pb2.Snapshot(
        num_blocks=64, num_free_blocks=40, num_held_blocks=24, tenants=tenants, num_tenants=num_tenants
    )


def _cut() -> common_pb2.Snapshot:
    # 2,000 tenants: "big" listed, the other 1,999 summed in the daemon's "(other)" entry.
    return _snapshot(
        2000,
        common_pb2.TenantState(tenant="big", blocks_held=20, blocks_reserved=2, running=3, weight=1.0),
        common_pb2.TenantState(tenant=OTHER_TENANTS, blocks_held=4, blocks_reserved=1, running=2, waiting=7,
                               weight=1.0),
    )


def test_a_cut_list_gives_the_count_and_the_rest_apart_in_json() -> None:
    f = json.loads(json.dumps(status_fields(_cut())))
    assert f["num_tenants"] == 2000
    assert [t["tenant"] for t in f["tenants"]] == ["big"]
    assert f["other_tenants"] == {"tenants": 1999, "blocks_held": 4, "blocks_reserved": 1, "running": 2,
                                  "waiting": 7}


def test_a_cut_list_shows_plus_n_more_with_its_sums_and_the_count() -> None:
    lines = render_status(_cut(), "unix:///x.sock").splitlines()
    assert "  tenants    2000 in all: 1 listed, the other 1999 summed" in lines
    more = next(line for line in lines if "more" in line)
    assert more.split() == ["+1999", "more", "4", "1", "-", "2", "7"]
    assert not any(OTHER_TENANTS in line for line in lines)


def test_a_whole_list_is_as_before_and_a_tenant_named_other_is_a_tenant() -> None:
    # 2 tenants, both listed (one of them really named "(other)"): no cut, nothing summed.
    snapshot = _snapshot(
        2,
        common_pb2.TenantState(tenant="a", blocks_held=1, weight=1.0),
        common_pb2.TenantState(tenant=OTHER_TENANTS, blocks_held=2, weight=1.0),
    )
    f = status_fields(snapshot)
    assert (f["num_tenants"], f["other_tenants"]) == (2, None)
    assert [t["tenant"] for t in f["tenants"]] == ["a", OTHER_TENANTS]
    text = render_status(snapshot, "unix:///x.sock")
    assert "more" not in text and "in all" not in text


def test_an_older_daemon_without_a_count_lists_them_all() -> None:
    snapshot = _snapshot(0, common_pb2.TenantState(tenant="a", weight=1.0))
    f = status_fields(snapshot)
    assert (f["num_tenants"], f["other_tenants"], len(f["tenants"])) == (1, None, 1)


def test_a_real_cut_snapshot_from_the_core_reads_back_exactly() -> None:
    # The daemon's own conversion of a ledger cut: the sums of the rows shown are the totals.
    from kvbudget.daemon.core.records import MAX_SNAPSHOT_TENANTS

    n = MAX_SNAPSHOT_TENANTS + 25
    tenants = [common_pb2.TenantState(tenant=f"t{i}", blocks_held=1, waiting=1, weight=1.0)
               for i in range(MAX_SNAPSHOT_TENANTS - 1)]
    tenants.append(common_pb2.TenantState(tenant=OTHER_TENANTS, blocks_held=26, waiting=26, weight=1.0))
    f = status_fields(_snapshot(n, *tenants))
    assert len(f["tenants"]) + f["other_tenants"]["tenants"] == f["num_tenants"] == n
    assert sum(t["blocks_held"] for t in f["tenants"]) + f["other_tenants"]["blocks_held"] == n


class _FakeDaemon:
    """Stands in for AdminConnection: SetTenantQuota succeeds, the snapshot is given."""

    def __init__(self, snapshot: common_pb2.Snapshot) -> None:
        self._snapshot = snapshot
        self.admin = type("Admin", (), {"SetTenantQuota": None})()

    def call(self, method, request):
        return None

    def snapshot(self) -> common_pb2.Snapshot:
        return self._snapshot


def test_set_quota_never_reads_the_sum_of_a_cut_list_back_as_the_tenant() -> None:
    # A tenant named "(other)" (the daemon accepts the name) in a cut list is summed, not
    # listed: its quota cannot be read back, and "0 blocks" would be false.
    from kvbudget.cli.cmd_admin import set_quota

    result, text, code = set_quota(_FakeDaemon(_cut()), OTHER_TENANTS, 0.5, 1.0)
    assert (code, result["quota_blocks"]) == (0, None)
    assert "0 of" not in text and text == "tenant (other): max share 0.5 of 64 blocks, weight 1"


def test_set_quota_reads_a_listed_tenant_back_in_blocks() -> None:
    from kvbudget.cli.cmd_admin import set_quota

    snapshot = _cut()
    snapshot.tenants[0].quota_blocks = 32
    result, text, code = set_quota(_FakeDaemon(snapshot), "big", 0.5, 2.0)
    assert result["quota_blocks"] == 32
    assert text == "tenant big: max share 0.5 (32 of 64 blocks), weight 2"
