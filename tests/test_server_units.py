"""Unit tests of the server's small parts: auth, watch fan-out, sessions, conversions."""

from __future__ import annotations

import grpc
import pytest

from kvbudget.daemon import convert
from kvbudget.daemon.auth import AuthError, Authorizer, Role, bearer_token
from kvbudget.daemon.records import Decision, DecisionKind, Reason
from kvbudget.daemon.sessions import SessionExists, SessionTable, TooManySessions
from kvbudget.daemon.watch import TooManyWatchers, WatchHub
from kvbudget.v1 import common_pb2

TOKENS = {"engine-token-1": "engine", "observer-token-1": "observer", "admin-token-1": "admin"}


def _decision(seq: int, **kw) -> Decision:
    return Decision(seq=seq, time_s=float(seq), kind=DecisionKind.ADMIT, reason=Reason.FITS,
                    request_id=f"r{seq}", **kw)


def test_bearer_token_parsing() -> None:
    assert bearer_token([("authorization", "Bearer abc")]) == "abc"
    assert bearer_token([("Authorization", "bearer  abc ")]) == "abc"
    assert bearer_token([("authorization", "Basic abc")]) is None
    assert bearer_token([("x-other", "Bearer abc")]) is None
    assert bearer_token(None) is None


@pytest.mark.parametrize(
    "token, needed, outcome",
    [
        ("observer-token-1", Role.OBSERVER, Role.OBSERVER),
        ("observer-token-1", Role.ENGINE, grpc.StatusCode.PERMISSION_DENIED),
        ("engine-token-1", Role.OBSERVER, Role.ENGINE),
        ("engine-token-1", Role.ENGINE, Role.ENGINE),
        ("engine-token-1", Role.ADMIN, grpc.StatusCode.PERMISSION_DENIED),
        ("admin-token-1", Role.ADMIN, Role.ADMIN),
        ("admin-token-", Role.OBSERVER, grpc.StatusCode.UNAUTHENTICATED),  # a prefix is not a token
        (None, Role.OBSERVER, grpc.StatusCode.UNAUTHENTICATED),
    ],
)
def test_roles_over_tcp(token, needed, outcome) -> None:
    auth = Authorizer(TOKENS)
    metadata = [("authorization", f"Bearer {token}")] if token else []
    if isinstance(outcome, Role):
        assert auth.check("ipv4:127.0.0.1:5000", metadata, needed) == outcome
    else:
        with pytest.raises(AuthError) as info:
            auth.check("ipv4:127.0.0.1:5000", metadata, needed)
        assert info.value.code == outcome


def test_unix_socket_callers_are_trusted_without_a_token() -> None:
    assert Authorizer(TOKENS).check("unix:/run/kvbudget/kvbudget.sock", [], Role.ADMIN) == Role.ADMIN
    assert Authorizer(None).check("unix:", [], Role.ADMIN) == Role.ADMIN


async def test_watcher_keeps_the_newest_and_counts_what_it_dropped() -> None:
    hub = WatchHub(max_watchers=2)
    slow, fast = hub.add(max_decisions=3), hub.add(max_decisions=100)
    hub.publish([_decision(i) for i in range(1, 6)])  # 5 into a deque of 3: 2 dropped
    hub.publish([_decision(6)])  # 1 more dropped
    taken, dropped = slow.take()
    assert ([d.seq for d in taken], dropped) == ([4, 5, 6], 3)
    assert slow.take() == ([], 0)
    taken, dropped = fast.take()
    assert ([d.seq for d in taken], dropped) == ([1, 2, 3, 4, 5, 6], 0)
    with pytest.raises(TooManyWatchers):
        hub.add(max_decisions=1)
    hub.remove(fast)
    assert len(hub) == 1


async def test_session_table_one_live_session_per_engine_and_leases() -> None:
    table = SessionTable(default_ttl_s=10.0, max_ttl_s=60.0, max_sessions=2)
    a = table.open("engine-a", 0, now_monotonic=100.0)
    assert a.lease_ttl_s == 10.0 and a.expires_at == 110.0
    with pytest.raises(SessionExists):
        table.open("engine-a", 0, now_monotonic=100.0)
    b = table.open("engine-b", 600, now_monotonic=100.0)
    assert b.lease_ttl_s == 60.0  # capped at max_ttl_s
    with pytest.raises(TooManySessions):
        table.open("engine-c", 0, now_monotonic=100.0)
    a.renew(105.0)  # expires at 115
    assert table.expired(112.0) == []
    assert table.expired(115.0) == [a]
    table.remove(a)
    assert table.get(a.session_id) is None and table.of_engine("engine-a") is None
    assert a.events.get_nowait() is None  # its Events stream is told to end


def test_decision_round_trips_through_the_proto() -> None:
    d = Decision(seq=7, time_s=1.5, kind=DecisionKind.GROW, reason=Reason.FITS, request_id="r", engine_id="e",
                 tenant="t", policy="guaranteed", prompt_tokens=100, max_new_tokens=28, num_tokens=128,
                 num_computed=100, blocks_reserved=(8, 2), blocks_held=(8, 1), new_block_ids=((9,), ()),
                 freed_blocks=0, num_free_blocks=56, num_waiting=1, num_running=2, detail="x")
    message = convert.decision_to_proto(d)
    assert message.kind == common_pb2.DECISION_KIND_GROW and message.policy == common_pb2.POLICY_GUARANTEED
    assert convert.decision_from_proto(message) == d


def test_every_kind_and_policy_has_a_proto_value() -> None:
    from kvbudget.daemon.admission import POLICIES

    assert set(convert.POLICY_NAMES) == set(POLICIES)
    for kind in DecisionKind:
        assert convert.kind_from_proto(convert.kind_to_proto(kind)) == kind
    for policy in convert.POLICY_NAMES:
        assert convert.policy_from_proto(convert.policy_to_proto(policy)) == policy
