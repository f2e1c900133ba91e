"""A numbered step sent again gets the outcome it had and applies nothing twice.

An engine whose Step reply is lost (its deadline passed, the connection dropped mid-call)
cannot tell whether the step was applied. With `step_seq` set, the daemon keeps the last
numbered step's outcome per session, and the very same step sent again gets it back: the
same decisions, the same block ids, no new row in the log. Without a number, a resend is
a new step (its submits are ALREADY_EXISTS).

A real daemon (llama-3.1-8b, 16-token blocks, 64 usable, policy guaranteed). The lost
replies are real: a unix-socket proxy between the engine client and the daemon drops the
connection (or holds the reply past the client's deadline) once the daemon has answered.
"""

from __future__ import annotations

import asyncio
import itertools
import sqlite3

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvbudget.client import EngineClient
from kvbudget.client.engine import _outcome_unknown
from kvbudget.daemon.core.records import DecisionKind, RequestSpec
from kvbudget.v1 import common_pb2, engine_pb2, engine_pb2_grpc, observer_pb2, observer_pb2_grpc

from daemon_harness import DaemonProcess

pytestmark = pytest.mark.slow
Code = grpc.StatusCode


class Engine:
    """Raw stubs on one session, and the daemon's state as pool figures and log rows."""

    def __init__(self, daemon: DaemonProcess, engine_id: str) -> None:
        self.daemon = daemon
        self.channel = grpc.insecure_channel(daemon.target)
        self.stub = engine_pb2_grpc.EngineServiceStub(self.channel)
        self.observer = observer_pb2_grpc.ObserverServiceStub(self.channel)
        self.session_id = self.stub.OpenSession(
            engine_pb2.OpenSessionRequest(engine_id=engine_id, lease_ttl_s=600)).session_id

    def step(self, step_seq: int = 0, **ops) -> engine_pb2.StepResponse:
        return self.stub.Step(engine_pb2.StepRequest(session_id=self.session_id, step_seq=step_seq, **ops))

    def refused(self, step_seq: int = 0, **ops) -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as info:
            self.step(step_seq, **ops)
        return info.value

    def state(self) -> tuple:
        s = self.observer.GetSnapshot(observer_pb2.GetSnapshotRequest()).snapshot
        connection = sqlite3.connect(f"file:{self.daemon.db_path}?mode=ro", uri=True)
        try:
            [(rows,)] = connection.execute("SELECT count(*) FROM decisions").fetchall()
        finally:
            connection.close()
        return s.num_free_blocks, s.num_reserved_blocks, s.num_running, s.num_waiting, rows


def submit(request_id: str, prompt_tokens: int = 100, max_new_tokens: int = 28) -> engine_pb2.Submit:
    # 100 + 28 = 128 tokens: 8 blocks reserved, cdiv(100, 16) = 7 held
    return engine_pb2.Submit(request_id=request_id, prompt_tokens=prompt_tokens, max_new_tokens=max_new_tokens)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with DaemonProcess(tmp_path_factory.mktemp("resend"), "--policy", "guaranteed") as process:
        yield process


def test_a_numbered_step_sent_again_gets_the_same_reply_and_applies_nothing(daemon) -> None:
    engine = Engine(daemon, "resend-same")
    before = engine.state()
    first = engine.step(1, submits=[submit("r1")])
    [admit] = first.decisions
    assert admit.kind == common_pb2.DECISION_KIND_ADMIT
    assert len(admit.new_blocks[0].block_ids) == 7
    after_first = engine.state()
    # 7 blocks held, 1 more reserved (not yet held), one request running, one row
    assert after_first == (before[0] - 7, before[1] + 1, before[2] + 1, before[3], before[4] + 1)

    again = engine.step(1, submits=[submit("r1")])
    assert again == first  # the same decision: seq, block ids, figures
    assert engine.state() == after_first  # nothing applied, nothing logged

    released = engine.step(2, finishes=[engine_pb2.Finish(request_id="r1")])
    [release] = released.decisions
    assert (release.kind, release.freed_blocks) == (common_pb2.DECISION_KIND_RELEASE, 7)
    assert engine.step(2, finishes=[engine_pb2.Finish(request_id="r1")]) == released  # not NOT_FOUND
    assert engine.state() == before[:4] + (before[4] + 2,)
    assert [row["kind"] for row in daemon.decision_rows("request_id = 'r1'")] == ["admit", "release"]


def test_a_refused_resend_names_step_seq_and_changes_nothing(daemon) -> None:
    engine = Engine(daemon, "resend-refused")
    engine.step(5, submits=[submit("s1")])
    state = engine.state()

    other_ops = engine.refused(5, submits=[submit("s2")])  # the last number, other ops
    assert other_ops.code() == Code.INVALID_ARGUMENT
    assert other_ops.details().startswith("step_seq: 5 numbers another step")

    older = engine.refused(4, submits=[submit("s1")])  # below the last: that outcome is gone
    assert older.code() == Code.FAILED_PRECONDITION
    assert older.details().startswith("step_seq: 4 is below this session's last step (5)")
    assert "session_id" not in older.details()  # (the client reads that as "session lost")
    assert engine.state() == state

    engine.step(6, finishes=[engine_pb2.Finish(request_id="s1")])


def test_a_step_refused_before_it_applied_does_not_use_its_number(daemon) -> None:
    engine = Engine(daemon, "resend-unused")
    unknown = engine.refused(1, finishes=[engine_pb2.Finish(request_id="nobody")])
    assert unknown.code() == Code.NOT_FOUND
    # The engine drops the op at fault and sends the step again under the same number.
    [admit] = engine.step(1, submits=[submit("u1")]).decisions
    assert admit.kind == common_pb2.DECISION_KIND_ADMIT
    engine.step(2, finishes=[engine_pb2.Finish(request_id="u1")])


def test_an_unnumbered_step_sent_again_is_a_new_step(daemon) -> None:
    engine = Engine(daemon, "resend-unnumbered")
    engine.step(submits=[submit("n1")])
    again = engine.refused(submits=[submit("n1")])
    assert again.code() == Code.ALREADY_EXISTS
    assert again.details().startswith("submits[0].request_id")
    engine.step(finishes=[engine_pb2.Finish(request_id="n1")])


def test_each_session_numbers_its_own_steps(daemon) -> None:
    a, b = Engine(daemon, "resend-a"), Engine(daemon, "resend-b")
    a.step(7, submits=[submit("a7")])
    [admit] = b.step(1, submits=[submit("b1")]).decisions  # b's 1 is not below a's 7
    assert admit.kind == common_pb2.DECISION_KIND_ADMIT
    a.step(8, finishes=[engine_pb2.Finish(request_id="a7")])
    b.step(2, finishes=[engine_pb2.Finish(request_id="b1")])


class ReplyLoser:
    """A unix-socket proxy in front of the daemon. Armed, it loses the next reply: the
    first chunk from the daemon big enough to carry one (flow-control and ping frames are
    13-17 bytes) is never passed on, and the connection is dropped, at once or, to let the
    client's deadline pass first, once the client sends anything more (the stream's reset
    when it gives up)."""

    def __init__(self, upstream: str, path: str) -> None:
        self.upstream, self.path = upstream, path
        self.armed = False
        self.until_client_gives_up = False
        self.replies_lost = 0
        self._client_spoke = asyncio.Event()
        self._server: asyncio.AbstractServer | None = None

    async def __aenter__(self) -> ReplyLoser:
        self._server = await asyncio.start_unix_server(self._serve, self.path)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()

    def lose_next_reply(self, *, until_client_gives_up: bool = False) -> None:
        self.armed, self.until_client_gives_up = True, until_client_gives_up
        self._client_spoke.clear()

    async def _serve(self, client_reader, client_writer) -> None:
        daemon_reader, daemon_writer = await asyncio.open_unix_connection(self.upstream)

        async def pump(reader, writer, from_daemon: bool) -> None:
            try:
                while data := await reader.read(65536):
                    if from_daemon and self.armed and len(data) >= 64:
                        self.armed = False
                        if self.until_client_gives_up:
                            self._client_spoke.clear()
                            await asyncio.wait_for(self._client_spoke.wait(), 60)
                        self.replies_lost += 1
                        return
                    writer.write(data)
                    await writer.drain()
                    if not from_daemon:
                        self._client_spoke.set()
            except (ConnectionError, OSError):
                pass
            finally:
                for w in (client_writer, daemon_writer):
                    w.close()

        await asyncio.gather(pump(client_reader, daemon_writer, False), pump(daemon_reader, client_writer, True))


@pytest.mark.parametrize("deadline", [False, True], ids=["connection-dropped", "deadline-passed"])
async def test_the_client_sends_a_step_whose_reply_was_lost_again_and_gets_it(daemon, tmp_path, deadline) -> None:
    engine_id = f"resend-client-{deadline}"
    async with ReplyLoser(str(daemon.socket_path), str(tmp_path / "proxy.sock")) as proxy:
        # deadline-passed: the reply never comes on time, the client gives up on the call
        # (DEADLINE_EXCEEDED) and sends it again; that one is lost with the connection
        # (UNAVAILABLE), and the next, on a new connection, gets the reply.
        client = EngineClient(f"unix://{proxy.path}", engine_id, heartbeat=False,
                              call_timeout_s=1.0 if deadline else 30.0)
        async with client:
            await client.step()  # the connection is up and quiet
            proxy.lose_next_reply(until_client_gives_up=deadline)
            [admit] = await client.step(submits=[RequestSpec(f"{engine_id}-r", 100, 28)])
            assert proxy.replies_lost == 1
            assert (admit.kind, admit.blocks_held) == (DecisionKind.ADMIT, (7,))
            assert len(admit.new_block_ids[0]) == 7
            [row] = daemon.decision_rows("request_id = ?", (f"{engine_id}-r",))
            assert (row["kind"], row["seq"]) == ("admit", admit.seq)  # applied once, the reply its own
            [release] = await client.step(finishes=[f"{engine_id}-r"])
            assert (release.kind, release.freed_blocks) == (DecisionKind.RELEASE, 7)


def _error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


def test_only_a_lost_reply_is_sent_again() -> None:
    assert _outcome_unknown(_error(Code.DEADLINE_EXCEEDED, "Deadline Exceeded"))
    assert _outcome_unknown(_error(Code.UNAVAILABLE, "Socket closed"))
    # The daemon's own refusals say what happened: the engine decides what to do.
    assert not _outcome_unknown(_error(Code.UNAVAILABLE, "decision log: disk full; this step was applied ..."))
    assert not _outcome_unknown(_error(Code.UNAVAILABLE, "submits: daemon is draining, no new requests"))
    assert not _outcome_unknown(_error(Code.ALREADY_EXISTS, "submits[0].request_id: request 'r' already exists"))
    assert not _outcome_unknown(_error(Code.INVALID_ARGUMENT, "grows[0].num_tokens: ..."))


async def test_a_step_that_waited_in_vain_for_a_daemon_is_not_sent_again(tmp_path, caplog) -> None:
    # The daemon is gone: the call waits for a connection until its deadline, and nothing
    # was sent. A resend would only wait as long again.
    daemon = DaemonProcess(tmp_path, "--policy", "guaranteed").start()
    try:
        client = EngineClient(daemon.target, "resend-gone", heartbeat=False, call_timeout_s=1.0)
        await client.open()
    finally:
        daemon.stop()
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await client.step(submits=[RequestSpec("never", 16, 16)])
        assert info.value.code() == Code.DEADLINE_EXCEEDED
        assert "sending it again" not in caplog.text
    finally:
        await client.close()


class _Run:
    """One engine's numbered steps against the daemon, with what the log must then hold."""

    def __init__(self, daemon: DaemonProcess, engine_id: str) -> None:
        self.engine = Engine(daemon, engine_id)
        self.engine_id = engine_id
        self.seq = 0
        self.live: list[str] = []
        self.made = 0
        self.rows = 0  # rows the log must hold for this engine: the applied steps' decisions
        self.last: tuple[engine_pb2.StepRequest, object] | None = None  # request, reply or (code, details)

    def send(self, request: engine_pb2.StepRequest):
        try:
            return self.engine.stub.Step(request)
        except grpc.RpcError as error:
            return error.code(), error.details()

    def new_step(self, num_submits: int, num_finishes: int) -> None:
        finishes, self.live = self.live[:num_finishes], self.live[num_finishes:]
        submits = [f"{self.engine_id}-{self.made + i}" for i in range(num_submits)]
        self.made += num_submits
        self.seq += 1
        request = engine_pb2.StepRequest(
            session_id=self.engine.session_id, step_seq=self.seq,
            submits=[submit(r, 16, 16) for r in submits],  # 1 block held of 2 reserved each
            finishes=[engine_pb2.Finish(request_id=r) for r in finishes])
        outcome = self.send(request)
        assert isinstance(outcome, engine_pb2.StepResponse), outcome
        assert [d.kind for d in outcome.decisions] == (
            [common_pb2.DECISION_KIND_RELEASE] * len(finishes) + [common_pb2.DECISION_KIND_ADMIT] * len(submits))
        self.live += submits
        self.rows += len(outcome.decisions)
        self.last = request, outcome

    def check(self) -> None:
        rows = self.engine.daemon.decision_rows("engine_id = ?", (self.engine_id,))
        assert len(rows) == self.rows
        admitted = [row["request_id"] for row in rows if row["kind"] == "admit"]
        assert len(admitted) == len(set(admitted)) == self.made  # each request admitted once


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["new", "resend", "stale", "clash"]),
                          st.integers(0, 3), st.integers(0, 3)), min_size=1, max_size=10))
def test_any_run_of_steps_and_resends_applies_each_step_once(daemon, actions) -> None:
    run = _Run(daemon, f"resend-run-{next(_RUNS)}")
    try:
        for action, a, b in actions:
            if action == "new" or run.last is None:
                run.new_step(a, b)
            elif action == "resend":  # the reply was lost: the same outcome again
                request, outcome = run.last
                assert run.send(request) == outcome
            elif action == "stale" and run.seq > 1:
                request = engine_pb2.StepRequest(session_id=run.engine.session_id, step_seq=run.seq - 1)
                assert run.send(request)[0] == Code.FAILED_PRECONDITION
            elif action == "clash":
                request = engine_pb2.StepRequest(session_id=run.engine.session_id, step_seq=run.seq,
                                                 submits=[submit(f"{run.engine_id}-clash")])
                assert run.send(request)[0] == Code.INVALID_ARGUMENT
            run.check()
    finally:
        run.new_step(0, len(run.live))  # the next example finds the pool as it was
        run.check()
        run.engine.channel.close()


_RUNS = itertools.count()
