"""Every bad input of every RPC gets the right status, names the field (in its message and
its details), and changes nothing.

One daemon for the module. Before each case we take the pool's state and the number of
rows in the decision log; after the refused call both must be exactly as they were.

Standing state (policy guaranteed, 64 usable blocks of 16 tokens):
  engine bad-a: "a-run" running (prompt 100, max_new 28: 7 held of 8 reserved, max_len 128),
                "a-wait" queued (512 + 512 = 64 blocks > the 56 left)
  engine bad-b: "b-run" running (prompt 32, max_new 16)
"""

from __future__ import annotations

import math
import sqlite3

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvbudget.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    engine_pb2,
    engine_pb2_grpc,
    observer_pb2,
    observer_pb2_grpc,
)

from daemon_harness import DaemonProcess
from kvbudget.client import refusal_details

pytestmark = pytest.mark.slow
Code = grpc.StatusCode


class Daemon:
    def __init__(self, process: DaemonProcess) -> None:
        self.process = process
        self.channel = grpc.insecure_channel(process.target)
        self.engine = engine_pb2_grpc.EngineServiceStub(self.channel)
        self.observer = observer_pb2_grpc.ObserverServiceStub(self.channel)
        self.admin = admin_pb2_grpc.AdminServiceStub(self.channel)
        self.session_a = self.open("bad-a")
        self.session_b = self.open("bad-b")

    def open(self, engine_id: str) -> str:
        return self.engine.OpenSession(engine_pb2.OpenSessionRequest(engine_id=engine_id, lease_ttl_s=600)).session_id

    def state(self) -> tuple:
        s = self.observer.GetSnapshot(observer_pb2.GetSnapshotRequest()).snapshot
        connection = sqlite3.connect(f"file:{self.process.db_path}?mode=ro", uri=True)
        try:
            [(rows,)] = connection.execute("SELECT count(*) FROM decisions").fetchall()
        finally:
            connection.close()
        return (
            s.num_free_blocks, s.num_held_blocks, s.num_reserved_blocks, s.num_running, s.num_waiting,
            dict(s.decisions_by_kind), s.policy, [(t.tenant, t.quota_blocks, t.weight) for t in s.tenants],
            sorted(e.engine_id for e in s.engines), rows,
        )


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with DaemonProcess(tmp_path_factory.mktemp("bad"), "--policy", "guaranteed") as process:
        d = Daemon(process)
        step = d.engine.Step(engine_pb2.StepRequest(session_id=d.session_a, submits=[
            engine_pb2.Submit(request_id="a-run", prompt_tokens=100, max_new_tokens=28),
            engine_pb2.Submit(request_id="a-wait", prompt_tokens=512, max_new_tokens=512),
        ]))
        assert [x.kind for x in step.decisions] == [common_pb2.DECISION_KIND_ADMIT, common_pb2.DECISION_KIND_QUEUE]
        d.engine.Step(engine_pb2.StepRequest(session_id=d.session_b, submits=[
            engine_pb2.Submit(request_id="b-run", prompt_tokens=32, max_new_tokens=16)]))
        yield d
        d.channel.close()


def submit(request_id="new-1", prompt_tokens=20, **kw) -> engine_pb2.Submit:
    return engine_pb2.Submit(request_id=request_id, prompt_tokens=prompt_tokens, **kw)


def step(d: Daemon, session="a", **ops) -> engine_pb2.StepRequest:
    session_id = {"a": d.session_a, "b": d.session_b}.get(session, session)
    return engine_pb2.StepRequest(session_id=session_id, **ops)


G, P, F, A = engine_pb2.Grow, engine_pb2.Progress, engine_pb2.Finish, engine_pb2.Abort

# (id, call(d) -> the refused call, status, field named in the message)
CASES = [
    ("open-no-engine-id", lambda d: d.engine.OpenSession(engine_pb2.OpenSessionRequest()), Code.INVALID_ARGUMENT, "engine_id"),
    ("open-long-engine-id", lambda d: d.engine.OpenSession(engine_pb2.OpenSessionRequest(engine_id="e" * 300)), Code.INVALID_ARGUMENT, "engine_id"),
    ("open-huge-ttl", lambda d: d.engine.OpenSession(engine_pb2.OpenSessionRequest(engine_id="x", lease_ttl_s=10**6)), Code.INVALID_ARGUMENT, "lease_ttl_s"),
    ("open-wrong-model", lambda d: d.engine.OpenSession(engine_pb2.OpenSessionRequest(engine_id="x", model_fingerprint="gpt-2:0")), Code.FAILED_PRECONDITION, "model_fingerprint"),
    ("open-duplicate-engine", lambda d: d.engine.OpenSession(engine_pb2.OpenSessionRequest(engine_id="bad-a")), Code.ALREADY_EXISTS, "engine_id"),
    ("step-no-session", lambda d: d.engine.Step(step(d, "")), Code.INVALID_ARGUMENT, "session_id"),
    ("step-unknown-session", lambda d: d.engine.Step(step(d, "nope", submits=[submit()])), Code.FAILED_PRECONDITION, "session_id"),
    ("submit-no-id", lambda d: d.engine.Step(step(d, submits=[submit("")])), Code.INVALID_ARGUMENT, "submits[0].request_id"),
    ("submit-zero-prompt", lambda d: d.engine.Step(step(d, submits=[submit(prompt_tokens=0)])), Code.INVALID_ARGUMENT, "submits[0].prompt_tokens"),
    ("submit-zero-max-new", lambda d: d.engine.Step(step(d, submits=[submit(max_new_tokens=0)])), Code.INVALID_ARGUMENT, "submits[0].max_new_tokens"),
    ("submit-negative-deadline", lambda d: d.engine.Step(step(d, submits=[submit(deadline_unix_s=-1.0)])), Code.INVALID_ARGUMENT, "submits[0].deadline_unix_s"),
    ("submit-nan-deadline", lambda d: d.engine.Step(step(d, submits=[submit(deadline_unix_s=math.nan)])), Code.INVALID_ARGUMENT, "submits[0].deadline_unix_s"),
    # 20 tokens hold one full 16-token block: two prefix hashes cannot be right.
    ("submit-too-many-hashes", lambda d: d.engine.Step(step(d, submits=[submit(prefix_hashes=[1, 2])])), Code.INVALID_ARGUMENT, "submits[0].prefix_hashes"),
    ("submit-duplicate-in-step", lambda d: d.engine.Step(step(d, submits=[submit("dup"), submit("dup")])), Code.ALREADY_EXISTS, "submits[1].request_id"),
    ("submit-duplicate-live", lambda d: d.engine.Step(step(d, submits=[submit("a-run")])), Code.ALREADY_EXISTS, "submits[0].request_id"),
    ("submit-duplicate-other-engine", lambda d: d.engine.Step(step(d, submits=[submit("b-run")])), Code.ALREADY_EXISTS, "submits[0].request_id"),
    # Atomic: the valid submit must not be applied when the grow after it is refused.
    ("valid-submit-then-bad-grow", lambda d: d.engine.Step(step(d, submits=[submit("new-1")], grows=[G(request_id="missing", num_tokens=5)])), Code.NOT_FOUND, "grows[0].request_id"),
    ("grow-other-engine", lambda d: d.engine.Step(step(d, grows=[G(request_id="b-run", num_tokens=40)])), Code.NOT_FOUND, "grows[0].request_id"),
    ("grow-huge", lambda d: d.engine.Step(step(d, grows=[G(request_id="a-run", num_tokens=2**32 - 1)])), Code.INVALID_ARGUMENT, "grows[0].num_tokens"),
    ("grow-past-max-len", lambda d: d.engine.Step(step(d, grows=[G(request_id="a-run", num_tokens=129)])), Code.INVALID_ARGUMENT, "grows[0].num_tokens"),
    ("grow-shrinks", lambda d: d.engine.Step(step(d, grows=[G(request_id="a-run", num_tokens=50)])), Code.INVALID_ARGUMENT, "grows[0].num_tokens"),
    ("grow-twice", lambda d: d.engine.Step(step(d, grows=[G(request_id="a-run", num_tokens=110), G(request_id="a-run", num_tokens=120)])), Code.INVALID_ARGUMENT, "grows[1].request_id"),
    ("progress-past-slots", lambda d: d.engine.Step(step(d, progress=[P(request_id="a-run", num_computed_tokens=101)])), Code.INVALID_ARGUMENT, "progress[0].num_computed_tokens"),
    ("progress-unknown", lambda d: d.engine.Step(step(d, progress=[P(request_id="zzz", num_computed_tokens=1)])), Code.NOT_FOUND, "progress[0].request_id"),
    ("finish-unknown", lambda d: d.engine.Step(step(d, finishes=[F(request_id="zzz")])), Code.NOT_FOUND, "finishes[0].request_id"),
    ("finish-twice", lambda d: d.engine.Step(step(d, finishes=[F(request_id="a-run"), F(request_id="a-run")])), Code.INVALID_ARGUMENT, "finishes[1].request_id"),
    ("finish-and-grow", lambda d: d.engine.Step(step(d, finishes=[F(request_id="a-run")], grows=[G(request_id="a-run", num_tokens=110)])), Code.INVALID_ARGUMENT, "grows[0].request_id"),
    ("abort-other-engine", lambda d: d.engine.Step(step(d, aborts=[A(request_id="b-run")])), Code.NOT_FOUND, "aborts[0].request_id"),
    ("events-no-session", lambda d: next(d.engine.Events(engine_pb2.EventsRequest())), Code.INVALID_ARGUMENT, "session_id"),
    ("events-unknown-session", lambda d: next(d.engine.Events(engine_pb2.EventsRequest(session_id="nope"))), Code.FAILED_PRECONDITION, "session_id"),
    ("heartbeat-unknown-session", lambda d: d.engine.Heartbeat(engine_pb2.HeartbeatRequest(session_id="nope")), Code.FAILED_PRECONDITION, "session_id"),
    ("close-no-session", lambda d: d.engine.CloseSession(engine_pb2.CloseSessionRequest()), Code.INVALID_ARGUMENT, "session_id"),
    ("watch-huge-interval", lambda d: next(d.observer.Watch(observer_pb2.WatchRequest(interval_ms=60_001))), Code.INVALID_ARGUMENT, "interval_ms"),
    ("watch-huge-buffer", lambda d: next(d.observer.Watch(observer_pb2.WatchRequest(max_decisions=2**32 - 1))), Code.INVALID_ARGUMENT, "max_decisions"),
    ("query-unknown-kind", lambda d: d.observer.QueryDecisions(observer_pb2.QueryDecisionsRequest(kind=99)), Code.INVALID_ARGUMENT, "kind"),
    ("query-negative-since", lambda d: d.observer.QueryDecisions(observer_pb2.QueryDecisionsRequest(since_unix_s=-1)), Code.INVALID_ARGUMENT, "since_unix_s"),
    ("query-since-after-until", lambda d: d.observer.QueryDecisions(observer_pb2.QueryDecisionsRequest(since_unix_s=20, until_unix_s=10)), Code.INVALID_ARGUMENT, "since_unix_s"),
    ("query-huge-limit", lambda d: d.observer.QueryDecisions(observer_pb2.QueryDecisionsRequest(limit=10**6)), Code.INVALID_ARGUMENT, "limit"),
    ("estimate-zero", lambda d: d.observer.Estimate(observer_pb2.EstimateRequest()), Code.INVALID_ARGUMENT, "tokens_per_request"),
    ("estimate-huge", lambda d: d.observer.Estimate(observer_pb2.EstimateRequest(tokens_per_request=2**32 - 1)), Code.INVALID_ARGUMENT, "tokens_per_request"),
    ("replay-no-id", lambda d: d.observer.ReportReplay(observer_pb2.ReportReplayRequest()), Code.INVALID_ARGUMENT, "replay.replay_id"),
    ("replay-past-total", lambda d: d.observer.ReportReplay(observer_pb2.ReportReplayRequest(replay=common_pb2.ReplayState(replay_id="r", position=5, total=4))), Code.INVALID_ARGUMENT, "replay.position"),
    # Every snapshot carries each replay: a 5 MB trace name broke every observer.
    ("replay-huge-trace", lambda d: d.observer.ReportReplay(observer_pb2.ReportReplayRequest(replay=common_pb2.ReplayState(replay_id="r", trace="T" * 513))), Code.INVALID_ARGUMENT, "replay.trace"),
    ("replay-newline-policy", lambda d: d.observer.ReportReplay(observer_pb2.ReportReplayRequest(replay=common_pb2.ReplayState(replay_id="r", policy="a\nb"))), Code.INVALID_ARGUMENT, "replay.policy"),
    ("replay-nan-speed", lambda d: d.observer.ReportReplay(observer_pb2.ReportReplayRequest(replay=common_pb2.ReplayState(replay_id="r", speed=math.nan))), Code.INVALID_ARGUMENT, "replay.speed"),
    ("policy-unspecified", lambda d: d.admin.SetPolicy(admin_pb2.SetPolicyRequest()), Code.INVALID_ARGUMENT, "policy"),
    ("policy-unknown", lambda d: d.admin.SetPolicy(admin_pb2.SetPolicyRequest(policy=99)), Code.INVALID_ARGUMENT, "policy"),
    ("quota-no-tenant", lambda d: d.admin.SetTenantQuota(admin_pb2.SetTenantQuotaRequest(max_share=0.5)), Code.INVALID_ARGUMENT, "tenant"),
    ("quota-reserved-tenant", lambda d: d.admin.SetTenantQuota(admin_pb2.SetTenantQuotaRequest(tenant="(other)", max_share=0.5)), Code.INVALID_ARGUMENT, "tenant"),
    ("quota-share-above-one", lambda d: d.admin.SetTenantQuota(admin_pb2.SetTenantQuotaRequest(tenant="t", max_share=1.5)), Code.INVALID_ARGUMENT, "max_share"),
    ("quota-negative-share", lambda d: d.admin.SetTenantQuota(admin_pb2.SetTenantQuotaRequest(tenant="t", max_share=-0.5)), Code.INVALID_ARGUMENT, "max_share"),
    ("quota-nan-share", lambda d: d.admin.SetTenantQuota(admin_pb2.SetTenantQuotaRequest(tenant="t", max_share=math.nan)), Code.INVALID_ARGUMENT, "max_share"),
    ("quota-negative-weight", lambda d: d.admin.SetTenantQuota(admin_pb2.SetTenantQuotaRequest(tenant="t", weight=-1)), Code.INVALID_ARGUMENT, "weight"),
]


@pytest.mark.parametrize("call, code, field", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_refused_and_changes_nothing(daemon: Daemon, call, code, field) -> None:
    before = daemon.state()
    with pytest.raises(grpc.RpcError) as info:
        call(daemon)
    assert info.value.code() == code, info.value.details()
    assert info.value.details().startswith(field), info.value.details()
    # the same field, machine-readable, in the google.rpc.Status trailer (test_server_error_details)
    assert refusal_details(info.value).field == field
    assert daemon.state() == before


def test_does_not_fit_is_a_decision_not_an_error(daemon: Daemon) -> None:
    """A prompt longer than max_model_len (2048 here) is a REJECT decision, logged."""
    before = daemon.state()
    reply = daemon.engine.Step(step(daemon, submits=[submit("too-long", prompt_tokens=2**32 - 1, max_new_tokens=1)]))
    [reject] = reply.decisions
    assert (reject.kind, reject.reason, reject.request_id) == (common_pb2.DECISION_KIND_REJECT, "prompt_too_long", "too-long")
    after = daemon.state()
    assert after[-1] == before[-1] + 1  # one more row: the REJECT
    assert after[:5] == before[:5]  # the pool did not move


def test_engine_sessions_are_isolated(daemon: Daemon) -> None:
    """b's session cannot see a's requests, and a can still use its own."""
    with pytest.raises(grpc.RpcError) as info:
        daemon.engine.Step(step(daemon, "b", finishes=[F(request_id="a-run")]))
    assert info.value.code() == Code.NOT_FOUND
    reply = daemon.engine.Step(step(daemon, progress=[P(request_id="a-run", num_computed_tokens=100)]))
    assert list(reply.decisions) == []  # full attention: nothing to reclaim


def test_drain_refuses_new_work_but_lets_running_requests_end(tmp_path) -> None:
    with DaemonProcess(tmp_path, "--policy", "guaranteed") as process:
        d = Daemon(process)
        events = d.engine.Events(engine_pb2.EventsRequest(session_id=d.session_a), timeout=30)  # (never hangs)
        # r: 32 + 16 tokens = 3 of the 64 usable blocks; q: 512 + 512 = 64 blocks > the 61 left
        admitted, queued = d.engine.Step(step(d, submits=[submit("r", 32, max_new_tokens=16),
                                                          submit("q", 512, max_new_tokens=512)])).decisions
        assert (admitted.kind, queued.kind) == (common_pb2.DECISION_KIND_ADMIT, common_pb2.DECISION_KIND_QUEUE)
        assert d.admin.Drain(admin_pb2.DrainRequest()).running == 1
        # The waiting request will never be admitted now: its engine hears so at once, and
        # can send it elsewhere (it used to wait, and be admitted once r finished).
        rejected = next(events).decision
        assert (rejected.request_id, rejected.kind, rejected.reason) == ("q", common_pb2.DECISION_KIND_REJECT, "draining")
        assert d.observer.GetSnapshot(observer_pb2.GetSnapshotRequest()).snapshot.num_waiting == 0
        health = health_pb2_grpc.HealthStub(d.channel).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.NOT_SERVING
        for call, field in (
            (lambda: d.engine.OpenSession(engine_pb2.OpenSessionRequest(engine_id="late")), "daemon is draining"),
            (lambda: d.engine.Step(step(d, submits=[submit("r2")])), "submits"),
        ):
            with pytest.raises(grpc.RpcError) as info:
                call()
            assert info.value.code() == Code.UNAVAILABLE
            assert info.value.details().startswith(field)
        [release] = d.engine.Step(step(d, finishes=[F(request_id="r")])).decisions
        assert release.kind == common_pb2.DECISION_KIND_RELEASE
        assert d.observer.GetSnapshot(observer_pb2.GetSnapshotRequest()).snapshot.draining
        events.cancel()
        d.channel.close()
    # In the log, in order: the drain (an operator's change), then nothing admitted after it.
    assert [(r["request_id"], r["kind"], r["reason"]) for r in process.decision_rows("kind != 'policy' ORDER BY id")] == [
        ("r", "admit", "fits"), ("q", "queue", "pool_full"), ("", "admin", "draining"), ("q", "reject", "draining"),
        ("r", "release", "finished"),
    ]


def test_a_second_events_stream_of_a_session_replaces_the_first(tmp_path) -> None:
    # Two readers of one session's events split its decisions between them: a stale stream
    # (a half-open connection, a reconnect racing the old call) took admissions its engine
    # never heard of. The newer stream takes over; the older one ends.
    with DaemonProcess(tmp_path, "--policy", "guaranteed") as process:
        d = Daemon(process)
        # x: 512 + 512 tokens = all 64 blocks; a1: 16 + 16 = 2 blocks, queued behind it
        d.engine.Step(step(d, "b", submits=[submit("x", 512, max_new_tokens=512)]))
        [queued] = d.engine.Step(step(d, submits=[submit("a1", 16, max_new_tokens=16)])).decisions
        assert queued.kind == common_pb2.DECISION_KIND_QUEUE
        first = d.engine.Events(engine_pb2.EventsRequest(session_id=d.session_a), timeout=30)
        d.engine.Step(step(d, "b", finishes=[F(request_id="x")]))
        assert next(first).decision.request_id == "a1"  # the first stream is reading
        # y: cdiv(512 + 480, 16) = 62 blocks, the rest of the pool; a2 (2 blocks) waits for it
        [admitted] = d.engine.Step(step(d, "b", submits=[submit("y", 512, max_new_tokens=480)])).decisions
        [queued] = d.engine.Step(step(d, submits=[submit("a2", 16, max_new_tokens=16)])).decisions
        assert (admitted.kind, queued.kind) == (common_pb2.DECISION_KIND_ADMIT, common_pb2.DECISION_KIND_QUEUE)
        second = d.engine.Events(engine_pb2.EventsRequest(session_id=d.session_a), timeout=30)
        assert list(first) == []  # ended, cleanly, once the second took over
        d.engine.Step(step(d, "b", finishes=[F(request_id="y")]))  # (another engine's step: A hears on Events)
        admitted = next(second).decision
        assert (admitted.request_id, admitted.kind) == ("a2", common_pb2.DECISION_KIND_ADMIT)
        second.cancel()
        d.channel.close()


@pytest.mark.parametrize(
    ("method", "message_type"),
    [
        ("/kvbudget.v1.EngineService/Step", "kvbudget.v1.StepRequest"),
        ("/kvbudget.v1.EngineService/OpenSession", "kvbudget.v1.OpenSessionRequest"),
        ("/kvbudget.v1.EngineService/Events", "kvbudget.v1.EventsRequest"),
        ("/kvbudget.v1.ObserverService/QueryDecisions", "kvbudget.v1.QueryDecisionsRequest"),
        ("/kvbudget.v1.AdminService/SetTenantQuota", "kvbudget.v1.SetTenantQuotaRequest"),
        ("/grpc.health.v1.Health/Check", "grpc.health.v1.HealthCheckRequest"),
    ],
)
def test_bytes_that_are_not_the_message_are_invalid_argument(daemon, method: str, message_type: str) -> None:
    # A string field whose bytes are not UTF-8 (field 1, length 2: 0xff 0xfe). grpc.aio
    # answered UNKNOWN "Unexpected DecodeError" with a traceback in the journal per call.
    before = daemon.state()
    raw = daemon.channel.unary_stream if method.endswith("/Events") else daemon.channel.unary_unary
    call = raw(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)
    with pytest.raises(grpc.RpcError) as info:
        result = call(b"\x0a\x02\xff\xfe", timeout=10)
        if method.endswith("/Events"):
            list(result)
    assert info.value.code() == Code.INVALID_ARGUMENT
    assert info.value.details().startswith(f"request: not a valid {message_type}: ")
    assert daemon.state() == before
    assert "Traceback" not in daemon.process.stderr()
