"""QA: every RPC of every service against every kind of caller, on a real daemon.

Over TCP with a tokens file: no token or a wrong one is UNAUTHENTICATED, a role too
small is PERMISSION_DENIED, and the refusal names the problem without echoing what was
sent. Over the unix socket every caller is trusted (README: "The unix socket (mode 0660,
group kvbudget) is trusted"). Health answers without a token; reflection needs one
(tests/test_trust_reflection.py). No token
ever shows in the journal, the decision log, a snapshot or /metrics.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Callable

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from kvbudget.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    engine_pb2,
    engine_pb2_grpc,
    observer_pb2,
    observer_pb2_grpc,
)

from daemon_harness import DaemonProcess, free_port, wait_until

pytestmark = pytest.mark.slow
Code = grpc.StatusCode
TOKENS = {"engine": "kvbt-engine-Tk7w2", "observer": "kvbt-observer-Zp9q", "admin": "kvbt-admin-Hx3v8m"}
WRONG = "kvbt-wrong-Jd8s4k"
SECRETS = (*TOKENS.values(), WRONG)
AUTH_CODES = (Code.UNAUTHENTICATED, Code.PERMISSION_DENIED)



@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("kvbtmatrix")
    tokens = workdir / "tokens.toml"
    tokens.write_text("".join(f'{role} = ["{token}"]\n' for role, token in TOKENS.items()))
    tokens.chmod(0o640)
    tcp, metrics = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    process = DaemonProcess(workdir, "--tokens-file", str(tokens), "--metrics-address", metrics,
                            listen=(f"unix://{workdir}/kvbudget.sock", tcp))
    with process:
        channels = {"tcp": grpc.insecure_channel(tcp), "unix": grpc.insecure_channel(process.target)}
        yield process, channels, metrics
        for channel in channels.values():
            channel.close()


# ----------------------------------------------------------------------------- the calls

def _unary(call) -> Callable[[grpc.Channel, tuple], object]:
    return call


def _first(stream) -> object:
    try:
        return next(iter(stream))
    finally:
        stream.cancel()


RPCS: dict[str, tuple[str, Callable[[grpc.Channel, tuple], object]]] = {
    # name: (the role it needs, how to call it with metadata)
    "EngineService.OpenSession": ("engine", lambda ch, md: engine_pb2_grpc.EngineServiceStub(ch).OpenSession(
        engine_pb2.OpenSessionRequest(engine_id="kvbt-matrix", replace_existing=True), metadata=md, timeout=10)),
    "EngineService.Step": ("engine", lambda ch, md: engine_pb2_grpc.EngineServiceStub(ch).Step(
        engine_pb2.StepRequest(session_id="kvbt-no-such-session"), metadata=md, timeout=10)),
    "EngineService.Events": ("engine", lambda ch, md: _first(engine_pb2_grpc.EngineServiceStub(ch).Events(
        engine_pb2.EventsRequest(session_id="kvbt-no-such-session"), metadata=md, timeout=10))),
    "EngineService.Heartbeat": ("engine", lambda ch, md: engine_pb2_grpc.EngineServiceStub(ch).Heartbeat(
        engine_pb2.HeartbeatRequest(session_id="kvbt-no-such-session"), metadata=md, timeout=10)),
    "EngineService.CloseSession": ("engine", lambda ch, md: engine_pb2_grpc.EngineServiceStub(ch).CloseSession(
        engine_pb2.CloseSessionRequest(session_id="kvbt-no-such-session"), metadata=md, timeout=10)),
    "EngineService.ReportReplay": ("engine", lambda ch, md: engine_pb2_grpc.EngineServiceStub(ch).ReportReplay(
        engine_pb2.EngineServiceReportReplayRequest(replay=common_pb2.ReplayState(replay_id="kvbt-replay", trace="t")),
        metadata=md, timeout=10)),
    "ObserverService.Watch": ("observer", lambda ch, md: _first(observer_pb2_grpc.ObserverServiceStub(ch).Watch(
        observer_pb2.WatchRequest(interval_ms=50), metadata=md, timeout=10))),
    "ObserverService.GetSnapshot": ("observer", lambda ch, md: observer_pb2_grpc.ObserverServiceStub(ch).GetSnapshot(
        observer_pb2.GetSnapshotRequest(), metadata=md, timeout=10)),
    "ObserverService.QueryDecisions": ("observer", lambda ch, md: observer_pb2_grpc.ObserverServiceStub(ch)
                                       .QueryDecisions(observer_pb2.QueryDecisionsRequest(limit=5), metadata=md,
                                                       timeout=10)),
    "ObserverService.Estimate": ("observer", lambda ch, md: observer_pb2_grpc.ObserverServiceStub(ch).Estimate(
        observer_pb2.EstimateRequest(tokens_per_request=100), metadata=md, timeout=10)),
    "ObserverService.AskAdmission": ("observer", lambda ch, md: observer_pb2_grpc.ObserverServiceStub(ch)
                                     .AskAdmission(observer_pb2.AskAdmissionRequest(prompt_tokens=100), metadata=md,
                                                   timeout=10)),
    "ObserverService.ReportReplay": ("engine", lambda ch, md: observer_pb2_grpc.ObserverServiceStub(ch).ReportReplay(
        observer_pb2.ReportReplayRequest(replay=common_pb2.ReplayState(replay_id="kvbt-replay", trace="t")),
        metadata=md, timeout=10)),
    "AdminService.SetPolicy": ("admin", lambda ch, md: admin_pb2_grpc.AdminServiceStub(ch).SetPolicy(
        admin_pb2.SetPolicyRequest(policy=common_pb2.POLICY_OPTIMISTIC), metadata=md, timeout=10)),
    "AdminService.SetTenantQuota": ("admin", lambda ch, md: admin_pb2_grpc.AdminServiceStub(ch).SetTenantQuota(
        admin_pb2.SetTenantQuotaRequest(tenant="kvbt-tenant", max_share=0.5), metadata=md, timeout=10)),
    # Drain is called only where it must be refused (here), and once allowed at the end.
    "AdminService.Drain": ("admin", lambda ch, md: admin_pb2_grpc.AdminServiceStub(ch).Drain(
        admin_pb2.DrainRequest(), metadata=md, timeout=10)),
}
_GRANTS = {"observer": {"observer"}, "engine": {"observer", "engine"}, "admin": {"observer", "engine", "admin"}}


def test_the_matrix_covers_every_rpc_of_every_service() -> None:
    served = {f"{service.name}.{method.name}"
              for module in (engine_pb2, observer_pb2, admin_pb2)
              for service in module.DESCRIPTOR.services_by_name.values() for method in service.methods}
    assert served == set(RPCS)


def _outcome(channel: grpc.Channel, rpc: str, metadata: tuple) -> tuple[Code, str]:
    try:
        RPCS[rpc][1](channel, metadata)
    except grpc.RpcError as error:
        return error.code(), error.details() or ""
    return Code.OK, ""


def _bearer(token: str, scheme: str = "Bearer") -> tuple[tuple[str, str], ...]:
    return (("authorization", f"{scheme} {token}"),)


# What each caller must get over TCP: a role (decided by _GRANTS) or UNAUTHENTICATED.
TCP_CALLERS: dict[str, tuple[tuple, str | None]] = {
    "no credentials": ((), None),
    "observer token": (_bearer(TOKENS["observer"]), "observer"),
    "engine token": (_bearer(TOKENS["engine"]), "engine"),
    "admin token": (_bearer(TOKENS["admin"]), "admin"),
    "wrong token": (_bearer(WRONG), None),
    "lowercase bearer": (_bearer(TOKENS["engine"], "bearer"), "engine"),
    "token with trailing spaces": ((("authorization", f"Bearer {TOKENS['observer']}  "),), "observer"),
    "a prefix of a token": (_bearer(TOKENS["admin"][:-1]), None),
    "a token and more": (_bearer(TOKENS["admin"] + "x"), None),
    "Bearer with no token": ((("authorization", "Bearer"),), None),
    "Basic scheme": (_bearer(TOKENS["admin"], "Basic"), None),
    "token without a scheme": ((("authorization", TOKENS["admin"]),), None),
    "token in another header": ((("x-token", f"Bearer {TOKENS['admin']}"),), None),
}


@pytest.mark.parametrize("caller", list(TCP_CALLERS))
def test_tcp_every_rpc_gets_exactly_what_the_callers_role_allows(daemon, caller) -> None:
    process, channels, _ = daemon
    metadata, role = TCP_CALLERS[caller]
    wrong: list[str] = []
    for rpc, (needed, _) in RPCS.items():
        if rpc == "AdminService.Drain" and role == "admin":
            continue  # (allowed: called once, last)
        code, details = _outcome(channels["tcp"], rpc, metadata)
        expected = Code.UNAUTHENTICATED if role is None else (None if needed in _GRANTS[role] else Code.PERMISSION_DENIED)
        if expected is None:
            # (Past the role check, the identity check may refuse: the callers here take turns
            # replacing one engine id's session. Its own test: test_server_identity.py.)
            if code in AUTH_CODES and not details.startswith("replace_existing:"):
                wrong.append(f"{rpc}: {code.name} {details!r}, expected to pass the role check")
        elif code != expected:
            wrong.append(f"{rpc}: {code.name} {details!r}, expected {expected.name}")
        elif not details.startswith("authorization"):
            wrong.append(f"{rpc}: {details!r} does not name the authorization header")
        if any(secret in details for secret in SECRETS):
            wrong.append(f"{rpc}: the refusal echoes a secret: {details!r}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("caller", ["no credentials", "wrong token", "observer token", "Bearer with no token"])
def test_unix_socket_callers_are_trusted_whatever_they_send(daemon, caller) -> None:
    _, channels, _ = daemon
    metadata, _ = TCP_CALLERS[caller]
    wrong = []
    for rpc in RPCS:
        if rpc == "AdminService.Drain":
            continue
        code, details = _outcome(channels["unix"], rpc, metadata)
        if code in AUTH_CODES:
            wrong.append(f"{rpc}: {code.name} {details!r}")
    assert not wrong, "\n".join(wrong)


def test_two_authorization_headers_are_refused_not_guessed(daemon) -> None:
    """Two `authorization` headers are ambiguous (HTTP allows one): which one decides must
    not depend on their order, and a malformed first one must not let the second in."""
    _, channels, _ = daemon
    cases = {
        "malformed, then admin": (("authorization", "Bearer"), ("authorization", f"Bearer {TOKENS['admin']}")),
        "wrong, then admin": (("authorization", f"Bearer {WRONG}"), ("authorization", f"Bearer {TOKENS['admin']}")),
        "admin, then wrong": (("authorization", f"Bearer {TOKENS['admin']}"), ("authorization", f"Bearer {WRONG}")),
        "observer, then admin": (("authorization", f"Bearer {TOKENS['observer']}"),
                                 ("authorization", f"Bearer {TOKENS['admin']}")),
    }
    wrong = []
    for name, metadata in cases.items():
        code, details = _outcome(channels["tcp"], "AdminService.SetTenantQuota", metadata)
        if code != Code.UNAUTHENTICATED or "authorization" not in details:
            wrong.append(f"{name}: {code.name} {details!r}")
        if any(secret in details for secret in SECRETS):
            wrong.append(f"{name}: echoes a secret: {details!r}")
    assert not wrong, "\n".join(wrong)


def test_a_malformed_authorization_header_is_named_as_such(daemon) -> None:
    """A header that is there but not `Bearer <token>` is told apart from no header at all
    (the operator's client sends something, and needs to know it is the wrong shape)."""
    _, channels, _ = daemon
    for value in ("Bearer", "Basic " + TOKENS["admin"], TOKENS["admin"]):
        code, details = _outcome(channels["tcp"], "ObserverService.GetSnapshot", (("authorization", value),))
        assert code == Code.UNAUTHENTICATED
        assert "Bearer <token>" in details, details
        assert TOKENS["admin"] not in details


def test_health_answers_without_a_token_over_tcp_and_reflection_with_one(daemon) -> None:
    _, channels, _ = daemon
    for metadata in ((), _bearer(WRONG), (("authorization", "Bearer"),)):
        reply = health_pb2_grpc.HealthStub(channels["tcp"]).Check(health_pb2.HealthCheckRequest(), metadata=metadata,
                                                                 timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    for service in ("kvbudget.v1.EngineService", "kvbudget.v1.ObserverService", "kvbudget.v1.AdminService"):
        reply = health_pb2_grpc.HealthStub(channels["tcp"]).Check(health_pb2.HealthCheckRequest(service=service),
                                                                 timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    stream = reflection_pb2_grpc.ServerReflectionStub(channels["tcp"]).ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), metadata=_bearer(TOKENS["observer"]),
        timeout=10)
    names = {s.name for s in next(iter(stream)).list_services_response.service}
    stream.cancel()
    assert {"kvbudget.v1.EngineService", "grpc.health.v1.Health"} <= names


def test_no_token_shows_in_the_journal_the_log_snapshots_or_metrics(daemon) -> None:
    process, channels, metrics = daemon
    # Give each place something to hold: a session and an admitted request, a replay.
    engine = engine_pb2_grpc.EngineServiceStub(channels["tcp"])
    md = _bearer(TOKENS["engine"])
    session = engine.OpenSession(engine_pb2.OpenSessionRequest(engine_id="kvbt-secrets", replace_existing=True),
                                 metadata=md, timeout=10)
    engine.Step(engine_pb2.StepRequest(session_id=session.session_id, submits=[
        engine_pb2.Submit(request_id="kvbt-r1", prompt_tokens=16, max_new_tokens=16)]), metadata=md, timeout=10)
    snapshot = observer_pb2_grpc.ObserverServiceStub(channels["unix"]).GetSnapshot(
        observer_pb2.GetSnapshotRequest(), timeout=10).SerializeToString()
    decisions = observer_pb2_grpc.ObserverServiceStub(channels["unix"]).QueryDecisions(
        observer_pb2.QueryDecisionsRequest(limit=1000), timeout=10).SerializeToString()
    assert b"kvbt-secrets" in snapshot or wait_until(lambda: process.decision_rows())  # (something is there)
    text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10).read()
    files = b"".join(p.read_bytes() for p in process.workdir.glob("decisions.db*") if p.is_file())
    journal = process.stderr().encode()
    for place, content in {"snapshot": snapshot, "decisions": decisions, "metrics": text, "log files": files,
                           "journal": journal}.items():
        for secret in SECRETS:
            assert secret.encode() not in content, f"{secret} in the {place}"


def test_zz_admin_may_drain_and_then_nothing_else_changes_for_auth(daemon) -> None:
    _, channels, _ = daemon
    assert _outcome(channels["tcp"], "AdminService.Drain", _bearer(TOKENS["engine"]))[0] == Code.PERMISSION_DENIED
    assert _outcome(channels["tcp"], "AdminService.Drain", _bearer(TOKENS["admin"]))[0] == Code.OK
    assert _outcome(channels["tcp"], "ObserverService.GetSnapshot", ())[0] == Code.UNAUTHENTICATED
