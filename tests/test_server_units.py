"""Unit tests of the server's small parts: auth, watch fan-out, sessions, conversions."""

from __future__ import annotations

import types

import grpc
import pytest

from kvbudget.daemon.wire import convert
from kvbudget.daemon.server.auth import AuthError, Authorizer, Role, bearer_token
from kvbudget.daemon.core.records import Decision, DecisionKind, Reason
from kvbudget.daemon.server.sessions import SessionExists, SessionTable, TooManySessions
from kvbudget.daemon.server.watch import TooManyWatchers, WatchHub
from kvbudget.v1 import common_pb2, observer_pb2

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


NAMES = {"vllm-0": "engine", "grafana": "observer"}


@pytest.mark.parametrize(
    "token, peer_names, needed, outcome",
    [
        (None, [b"vllm-0"], Role.ENGINE, Role.ENGINE),  # the certificate's name gives the role
        (None, [b"somebody", b"grafana"], Role.OBSERVER, Role.OBSERVER),  # any of its names
        (None, [b"grafana"], Role.ENGINE, grpc.StatusCode.PERMISSION_DENIED),
        (None, [b"stranger"], Role.OBSERVER, grpc.StatusCode.UNAUTHENTICATED),
        (None, [], Role.OBSERVER, grpc.StatusCode.UNAUTHENTICATED),
        ("admin-token-1", [b"grafana"], Role.ADMIN, Role.ADMIN),  # a token sent decides
        ("not-a-token", [b"vllm-0"], Role.OBSERVER, grpc.StatusCode.UNAUTHENTICATED),
    ],
)
def test_roles_by_client_certificate_name(token, peer_names, needed, outcome) -> None:
    auth = Authorizer(TOKENS, certificate_names=NAMES)
    metadata = [("authorization", f"Bearer {token}")] if token else []
    if isinstance(outcome, Role):
        assert auth.check("ipv4:127.0.0.1:5000", metadata, needed, peer_names) == outcome
    else:
        with pytest.raises(AuthError) as info:
            auth.check("ipv4:127.0.0.1:5000", metadata, needed, peer_names)
        assert info.value.code == outcome


def test_names_are_refused_where_the_tokens_file_lists_none_and_the_refusal_says_which() -> None:
    with pytest.raises(AuthError) as info:
        Authorizer(TOKENS).check("ipv4:127.0.0.1:5000", [], Role.OBSERVER, [b"vllm-0"])
    assert str(info.value) == "authorization: bearer token required"
    auth = Authorizer(TOKENS, certificate_names=NAMES)
    with pytest.raises(AuthError) as info:
        auth.check("ipv4:127.0.0.1:5000", [], Role.OBSERVER, [b"stranger", b"stranger.gpu-3"])
    assert str(info.value) == ("authorization: bearer token required (or a client certificate the tokens file's "
                               "[certificates] names; this one names stranger, stranger.gpu-3)")
    auth.replace_tokens(TOKENS, {"stranger": "observer"})  # a reload
    assert auth.check("ipv4:127.0.0.1:5000", [], Role.OBSERVER, [b"stranger"]) == Role.OBSERVER
    assert auth.check("ipv4:127.0.0.1:5000", [("authorization", "Bearer observer-token-1")], Role.OBSERVER) == (
        Role.OBSERVER)
    auth.replace_tokens(TOKENS)
    with pytest.raises(AuthError):
        auth.check("ipv4:127.0.0.1:5000", [], Role.OBSERVER, [b"stranger"])


class _Context:
    """What `Authorizer.require` asks of a grpc.aio context, counting auth-context reads."""

    def __init__(self, metadata, names) -> None:
        self.metadata, self.names, self.auth_reads = metadata, names, 0

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5000"

    def invocation_metadata(self):
        return self.metadata

    def auth_context(self):
        self.auth_reads += 1
        return {"x509_common_name": self.names}

    async def abort(self, code, message, trailing_metadata=()):
        raise AuthError(code, message)


async def test_require_reads_the_certificate_only_when_no_token_was_sent() -> None:
    auth = Authorizer(TOKENS, certificate_names=NAMES)
    by_name = _Context([], [b"vllm-0"])
    assert await auth.require(by_name, Role.ENGINE) == Role.ENGINE and by_name.auth_reads == 1
    by_token = _Context([("authorization", "Bearer admin-token-1")], [b"vllm-0"])
    assert await auth.require(by_token, Role.ADMIN) == Role.ADMIN and by_token.auth_reads == 0
    no_names = _Context([], [b"vllm-0"])
    with pytest.raises(AuthError):
        await Authorizer(TOKENS).require(no_names, Role.OBSERVER)
    assert no_names.auth_reads == 0  # no [certificates] table: never read


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


async def test_watchers_get_the_same_messages_each_built_once(monkeypatch) -> None:
    built: list[int] = []
    real = convert.decision_to_proto
    monkeypatch.setattr(convert, "decision_to_proto", lambda d: built.append(d.seq) or real(d))
    decisions = [_decision(i, engine_id="e", blocks_held=(i,), new_block_ids=((i, i + 1),)) for i in range(1, 5)]
    expected = [real(d) for d in decisions]
    hub = WatchHub(max_watchers=3)
    watchers = [hub.add(max_decisions=100) for _ in range(3)]
    hub.publish(decisions)
    updates = []
    for watcher in watchers:
        taken, _ = watcher.take()
        response = observer_pb2.WatchResponse()
        hub.add_to(response.decisions, taken)
        updates.append(list(response.decisions))
    assert updates == [expected] * 3
    assert built == [1, 2, 3, 4]  # once each, for three watchers


async def test_watch_messages_kept_for_watchers_are_bounded(monkeypatch) -> None:
    """What the hub keeps shows in what it builds again: a message kept is not rebuilt."""
    from kvbudget.daemon.server import watch

    built: list[int] = []
    real = convert.decision_to_proto
    monkeypatch.setattr(convert, "decision_to_proto", lambda d: built.append(d.seq) or real(d))
    monkeypatch.setattr(watch, "MAX_BUILT", 3)
    hub = WatchHub(max_watchers=3)
    first, second = hub.add(max_decisions=100), hub.add(max_decisions=100)
    decisions = [_decision(i) for i in range(1, 6)]
    hub.publish(decisions)
    target = observer_pb2.WatchResponse().decisions
    hub.add_to(target, first.take()[0])
    assert [m.seq for m in target] == [1, 2, 3, 4, 5]
    target = observer_pb2.WatchResponse().decisions
    built.clear()
    hub.add_to(target, second.take()[0])
    assert [m.seq for m in target] == [1, 2, 3, 4, 5]
    assert built == [1, 2]  # 3, 4, 5 kept (the newest); 1 and 2 built again
    hub.remove(second)
    target = observer_pb2.WatchResponse().decisions
    hub.publish([_decision(6)])
    built.clear()
    hub.add_to(target, first.take()[0])  # one watcher: built in place, nothing kept
    assert [m.seq for m in target] == [6]
    third = hub.add(max_decisions=100)
    hub.publish(decisions[2:])
    built.clear()
    hub.add_to(observer_pb2.WatchResponse().decisions, third.take()[0])
    assert built == [3, 4, 5]  # what was kept went with the single watcher's update


async def test_session_table_one_live_session_per_engine_and_leases() -> None:
    table = SessionTable(default_ttl_s=10.0, max_ttl_s=60.0, max_sessions=2)
    a = table.open("engine-a", 0, lease_now=100.0)
    assert a.lease_ttl_s == 10.0 and a.expires_at == 110.0
    with pytest.raises(SessionExists):
        table.open("engine-a", 0, lease_now=100.0)
    b = table.open("engine-b", 600, lease_now=100.0)
    assert b.lease_ttl_s == 60.0  # capped at max_ttl_s
    with pytest.raises(TooManySessions):
        table.open("engine-c", 0, lease_now=100.0)
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
    from kvbudget.daemon.core.admission import POLICIES

    assert set(convert.POLICY_NAMES) == set(POLICIES)
    for kind in DecisionKind:
        assert convert.kind_from_proto(convert.kind_to_proto(kind)) == kind
    for policy in convert.POLICY_NAMES:
        assert convert.policy_from_proto(convert.policy_to_proto(policy)) == policy


def test_gpu_note_without_a_gpu_says_device_cpu() -> None:
    state = convert.gpu_to_proto(None, pool_bytes=4096)
    assert not state.present
    assert state.note == "no GPU: device=cpu"
    assert state.pool_bytes == 4096


def test_other_processes_bytes_leaves_out_the_daemon_itself() -> None:
    from kvbudget.daemon.config.gpu import GPUProbe, GPUProcess

    probe = GPUProbe(
        present=True, index=0, name="H200", total_bytes=100, used_bytes=70, free_bytes=30,
        processes=(GPUProcess(pid=111, used_bytes=40), GPUProcess(pid=222, used_bytes=25),
                   GPUProcess(pid=333, used_bytes=5)),
    )
    # 222 is the daemon: the others hold 40 + 5 = 45.
    assert convert.gpu_to_proto(probe, own_pid=222).other_processes_bytes == 45
    # Without knowing its own pid it counts everyone: 40 + 25 + 5 = 70.
    assert convert.gpu_to_proto(probe).other_processes_bytes == 70
    # Processes in the dict form (GPUProbe.as_dict's) are read the same way.
    as_dicts = types.SimpleNamespace(present=True, processes=[{"pid": 1, "used_bytes": 8}, {"pid": 2, "used_bytes": 3}])
    assert convert.gpu_to_proto(as_dicts, own_pid=2).other_processes_bytes == 8


def test_add_decisions_builds_in_place_what_decision_to_proto_builds() -> None:
    from kvbudget.v1 import engine_pb2

    decisions = [
        _decision(1, engine_id="a", tenant="t", blocks_reserved=(3, 1), blocks_held=(2, 1),
                  new_block_ids=((4, 5), (6,)), freed_blocks=2, cached_hit_blocks=1, detail="d"),
        _decision(2, engine_id="b", new_block_ids=((), (7,))),
        _decision(3, engine_id="a"),
    ]
    reply = engine_pb2.StepResponse()
    convert.add_decisions(reply.decisions, decisions)
    assert list(reply.decisions) == [convert.decision_to_proto(d) for d in decisions]
    assert [convert.decision_from_proto(m) for m in reply.decisions][0] == decisions[0]
    # Only engine "a"'s, in order: seq 1 and 3.
    mine = engine_pb2.StepResponse()
    convert.add_decisions(mine.decisions, decisions, engine_id="a")
    assert [m.seq for m in mine.decisions] == [1, 3]


def test_submit_to_spec_reads_every_field() -> None:
    from kvbudget.daemon.core.records import RequestSpec
    from kvbudget.v1 import engine_pb2

    submit = engine_pb2.Submit(request_id="r", prompt_tokens=40, max_new_tokens=8, prefix_hashes=[11, 12],
                               priority=-1, tenant="t", deadline_unix_s=99.5)
    assert convert.submit_to_spec(submit, "e", 7.0) == RequestSpec(
        "r", 40, 8, (11, 12), priority=-1, tenant="t", engine_id="e", deadline_s=99.5, arrival_s=7.0
    )
    # Unset max_new_tokens and deadline: None (up to max_model_len, no deadline).
    bare = convert.submit_to_spec(engine_pb2.Submit(request_id="b", prompt_tokens=1), "e", 0.0)
    assert (bare.max_new_tokens, bare.deadline_s, bare.prefix_hashes) == (None, None, ())


def test_the_core_tick_follows_a_short_lease_but_never_spins() -> None:
    from kvbudget.daemon.server.lifecycle import MIN_TICK_S, core_tick_s

    assert core_tick_s(0.1, 30.0) == 0.1  # the default tick: leases of seconds lapse on time
    assert core_tick_s(0.1, 0.2) == 0.05  # a quarter of a short TTL: seen soon after it lapses
    assert core_tick_s(0.1, 1e-300) == MIN_TICK_S == 0.01  # an absurd TTL: no busy loop
