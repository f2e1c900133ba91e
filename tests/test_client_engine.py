"""The engine client as an engine uses it, against a real daemon: its Events readers, its
close(), its StepBatch when a step is refused, its heartbeat, and the errors it raises."""

from __future__ import annotations

import asyncio
import logging
import re
import signal
from pathlib import Path

import grpc
import pytest

from kvbudget.client import ClientClosed, EngineClient, ObserverClient, SessionLost
from kvbudget.daemon.core.records import Decision, DecisionKind, Reason, RequestSpec

from daemon_harness import DaemonProcess, await_until, wait_until

pytestmark = pytest.mark.slow

WAIT_S = 30.0  # bounds a hang only


@pytest.fixture
def daemon(tmp_path):
    with DaemonProcess(tmp_path, "--policy", "guaranteed", lease_ttl_s=1) as process:
        yield process


async def _admit_later(engine: EngineClient, other: EngineClient, request_id: str, received: list[str]) -> None:
    """`request_id` waits behind `other`'s request of the whole budget (512 + 512 tokens =
    64 blocks), then is admitted when that one finishes: its ADMIT goes to Events. Once a
    reader put it in `received`, it finishes (the next one needs the whole budget again)."""
    await other.step(submits=[RequestSpec(f"{request_id}-big", 512, 512)])
    [queued] = await engine.step(submits=[RequestSpec(request_id, 16, 16)])
    assert (queued.kind, queued.reason) == (DecisionKind.QUEUE, Reason.BUDGET_FULL)
    await other.step(finishes=[f"{request_id}-big"])
    await await_until(lambda: _true_when(request_id in received), WAIT_S)
    await engine.step(finishes=[request_id])


def _read_into(engine: EngineClient, *into: list[str]) -> asyncio.Task:
    """A task that reads `engine.events()`, appending each request id to every list given."""

    async def read() -> None:
        async for decision in engine.events():
            for received in into:
                received.append(decision.request_id)

    return asyncio.create_task(read())


def _other_tasks() -> set[asyncio.Task]:
    return asyncio.all_tasks() - {asyncio.current_task()}


async def test_a_second_events_reader_takes_over_and_the_first_ends(daemon: DaemonProcess) -> None:
    """As on the daemon, one reader per session: the newer iteration reads, the older one
    ends. (The older one used to reconnect and take the stream back, the two then split
    the engine's admissions between them, back and forth for ever.)"""
    async with EngineClient(daemon.target, "engine-a") as a, EngineClient(daemon.target, "engine-b") as b:
        first: list[str] = []
        second: list[str] = []
        either: list[str] = []
        first_reader = _read_into(a, first, either)
        await _admit_later(a, b, "q0", either)

        second_reader = _read_into(a, second, either)
        await asyncio.wait_for(first_reader, WAIT_S)  # ended, not raised
        for request_id in ("q1", "q2", "q3"):
            await _admit_later(a, b, request_id, either)
        assert (first, second) == (["q0"], ["q1", "q2", "q3"])
    await asyncio.wait_for(second_reader, WAIT_S)


async def _true_when(condition: bool) -> bool:
    return condition


async def test_close_ends_an_events_iteration_and_leaves_no_task(daemon: DaemonProcess) -> None:
    """close() ends `async for ... in events()`: the reader's task returns. It used to get
    the CancelledError of the call close() cancelled, as if someone had cancelled it."""
    async with EngineClient(daemon.target, "engine-b") as b:
        a = EngineClient(daemon.target, "engine-a")
        await a.open()
        received: list[str] = []
        reader = _read_into(a, received)
        await _admit_later(a, b, "q0", received)
        await a.close()
        await asyncio.wait_for(reader, WAIT_S)
        assert not reader.cancelled() and reader.exception() is None
        await a.close()  # idempotent
    # Neither the heartbeats nor a call of either client is left running.
    await await_until(lambda: _true_when(not _other_tasks()), WAIT_S)


async def test_close_ends_an_events_reader_waiting_for_a_daemon_that_went_away(daemon: DaemonProcess) -> None:
    """The reader's reconnect waits for the daemon to come back; close() cancels that call.
    The reader used to raise that CancelledError (its task looked cancelled by someone)."""
    engine = EngineClient(daemon.target, "engine-a")
    await engine.open()
    received: list[str] = []
    reader = _read_into(engine, received)
    async with EngineClient(daemon.target, "engine-b") as other:
        await _admit_later(engine, other, "q0", received)  # it is reading
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(WAIT_S) == 0
    await asyncio.sleep(0.5)  # its stream ended: it reconnects after 0.05 to 0.1 s, and waits
    await engine.close()
    await asyncio.wait_for(reader, WAIT_S)
    assert not reader.cancelled() and reader.exception() is None


async def test_a_step_after_close_or_cut_by_close_raises_client_closed(daemon: DaemonProcess) -> None:
    """Not grpc's UsageError "Channel is closed." after close(), and not the CancelledError
    of the call close() cancels under a step in flight (the engine loop's task looked
    cancelled, and `await`ing it cancelled its awaiter in turn)."""
    engine = EngineClient(daemon.target, "engine-a")
    await engine.open()
    await engine.step(submits=[RequestSpec("r", 32, 16)])
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(WAIT_S) == 0
    waiting = asyncio.create_task(engine.step(grows=[("r", 33)]))  # waits for the daemon to come back
    await asyncio.sleep(0.5)
    await engine.close()
    with pytest.raises(ClientClosed, match="closed during this step"):
        await asyncio.wait_for(waiting, WAIT_S)
    with pytest.raises(ClientClosed, match="engine 'engine-a' is closed"):
        await engine.step(finishes=["r"])


async def test_cancelling_the_events_reader_still_cancels_it(daemon: DaemonProcess) -> None:
    async with EngineClient(daemon.target, "engine-a") as engine, EngineClient(daemon.target, "engine-b") as other:
        received: list[str] = []
        reader = _read_into(engine, received)
        await _admit_later(engine, other, "q0", received)  # it is reading: cancelled mid-stream
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(reader, WAIT_S)


async def test_async_with_closes_the_channel_when_the_open_is_refused(daemon: DaemonProcess) -> None:
    """`async with` does not call __aexit__ when __aenter__ raises: the client closes itself."""
    async with EngineClient(daemon.target, "engine-a"):
        second = EngineClient(daemon.target, "engine-a")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async with second:
                pass
        assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS
        assert second._channel.get_state() == grpc.ChannelConnectivity.SHUTDOWN  # noqa: SLF001


async def test_a_refused_flush_keeps_its_ops(daemon: DaemonProcess) -> None:
    """A step refused for one bad op applied nothing: the batch keeps every op (the submit
    too, which the engine would otherwise believe sent), and sends them once it is fixed."""
    async with EngineClient(daemon.target, "engine-a") as engine:
        batch = engine.batch()
        batch.submit(RequestSpec("new", 32, 16))
        batch.finish("never-submitted")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await batch.flush()
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        assert refused.value.details() == "finishes[0].request_id: no live request 'never-submitted' of this engine"
        assert ([s.request_id for s in batch.submits], batch.finishes) == (["new"], ["never-submitted"])

        batch.finishes.remove("never-submitted")
        [admit] = await batch.flush()
        assert (admit.kind, admit.request_id, admit.blocks_reserved) == (DecisionKind.ADMIT, "new", (3,))
        assert len(batch) == 0


async def test_an_empty_flush_tells_an_idle_engine_its_session_was_lost_and_empties_the_batch(
    daemon: DaemonProcess,
) -> None:
    """Without heartbeats the lease (1 s) lapses and the daemon expires the request. The
    engine's next flush, empty or not, raises SessionLost once; the batch's ops were for
    the lost session and are dropped; the new session takes the request again."""
    async with EngineClient(daemon.target, "engine-a", heartbeat=False) as engine:
        [admit] = await engine.step(submits=[RequestSpec("r", 32, 16)])
        assert admit.kind == DecisionKind.ADMIT
        wait_until(lambda: daemon.decision_rows("kind = 'expire'"), WAIT_S)
        batch = engine.batch()
        batch.grow("r", 33)
        with pytest.raises(SessionLost):
            await batch.flush()
        assert len(batch) == 0 and engine.sessions_opened == 2
        assert await engine.batch().flush() == []  # told once; an empty step is answered
        [again] = await engine.step(submits=[RequestSpec("r", 32, 16)])
        assert again.kind == DecisionKind.ADMIT


async def test_heartbeats_keep_an_idle_session_for_many_leases(daemon: DaemonProcess) -> None:
    async with EngineClient(daemon.target, "engine-a") as engine:
        assert engine.lease_ttl_s == 1
        await engine.step(submits=[RequestSpec("r", 32, 16)])
        await asyncio.sleep(3.5)  # three and a half leases without a step
        [release] = await engine.step(finishes=["r"])
        assert (release.kind, release.reason, engine.sessions_opened) == (DecisionKind.RELEASE, Reason.FINISHED, 1)
    assert daemon.decision_rows("kind = 'expire'") == []


async def test_a_reopen_the_heartbeat_could_not_make_is_not_reported_as_session_lost(
    daemon: DaemonProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """Another process took the engine id over. The old client's heartbeat finds its session
    gone and its re-open refused: its next step must say ALREADY_EXISTS, not SessionLost
    ("a new session is open, resubmit": there is none)."""
    caplog.set_level(logging.WARNING, logger="kvbudget.client")
    old = EngineClient(daemon.target, "engine-a")
    await old.open()
    try:
        async with EngineClient(daemon.target, "engine-a", replace_existing=True) as new:
            await await_until(lambda: _true_when("session of engine-a lost" in caplog.text), WAIT_S)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await old.step(submits=[RequestSpec("r", 32, 16)])
            assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS
            assert old.sessions_opened == 1
            # Its heartbeats stop rather than try (and warn) every lease / 3 for ever.
            await await_until(lambda: _true_when(old._heartbeat_task.done()), WAIT_S)  # noqa: SLF001
            assert "heartbeats of engine-a stop: engine_id: 'engine-a' already has a live session" in caplog.text
            [admit] = await new.step(submits=[RequestSpec("r", 32, 16)])
            assert admit.kind == DecisionKind.ADMIT
    finally:
        await old.close()


async def test_the_errors_the_engine_guide_tells_engines_to_handle(daemon: DaemonProcess) -> None:
    """docs/engine-integration.md, "Handling what a step raises": the codes and messages it shows."""
    async with EngineClient(daemon.target, "engine-a") as engine, ObserverClient(daemon.target) as observer:
        await engine.step(submits=[RequestSpec("r", 32, 16)])
        codes = []
        for step in ({"submits": [RequestSpec("r", 32, 16)]}, {"finishes": ["gone"]}):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await engine.step(**step)
            codes.append((refused.value.code(), refused.value.details()))
        assert codes == [
            (grpc.StatusCode.ALREADY_EXISTS, "submits[0].request_id: request 'r' already exists"),
            (grpc.StatusCode.NOT_FOUND, "finishes[0].request_id: no live request 'gone' of this engine"),
        ]
        assert await observer.drain() == 1
        with pytest.raises(grpc.aio.AioRpcError) as draining:
            await engine.step(submits=[RequestSpec("s", 32, 16)])
        assert (draining.value.code(), draining.value.details()) == (
            grpc.StatusCode.UNAVAILABLE, "submits: daemon is draining, no new requests")
        decisions: list[Decision] = await engine.step(grows=[("r", 33)], finishes=[])  # running ones go on
        assert [(d.kind, d.request_id) for d in decisions] == [(DecisionKind.GROW, "r")]


def _guide_function(name: str) -> str:
    """The python block of docs/engine-integration.md that defines `name`, as a reader copies it."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "engine-integration.md").read_text()
    [block] = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if f"def {name}(" in b]
    return block


async def test_the_guides_flush_step_handles_each_refusal(tmp_path) -> None:
    namespace: dict = {}
    exec(compile(_guide_function("flush_step"), "docs/engine-integration.md", "exec"), namespace)
    flush_step = namespace["flush_step"]
    submitted: dict[str, RequestSpec] = {}
    elsewhere: list[RequestSpec] = []

    def submit(batch, spec: RequestSpec) -> None:
        submitted[spec.request_id] = spec
        batch.submit(spec)

    # Without heartbeats, for the lease (2 s) to lapse when the test waits for it.
    with DaemonProcess(tmp_path, "--policy", "guaranteed", lease_ttl_s=2) as daemon:
        async with EngineClient(daemon.target, "engine-a", heartbeat=False) as engine, \
                ObserverClient(daemon.target) as observer:
            batch = engine.batch()
            submit(batch, RequestSpec("r1", 32, 16))
            assert [(d.kind, d.request_id) for d in await flush_step(batch, submitted, elsewhere)] == [
                (DecisionKind.ADMIT, "r1")]

            # NOT_FOUND for a finish, then ALREADY_EXISTS for a submit: both ops dropped.
            batch.finish("ghost")
            batch.submit(RequestSpec("r1", 32, 16))
            submit(batch, RequestSpec("r2", 32, 16))
            assert [(d.kind, d.request_id) for d in await flush_step(batch, submitted, elsewhere)] == [
                (DecisionKind.ADMIT, "r2")]

            # The lease lapses: SessionLost, and both requests are submitted again.
            wait_until(lambda: len(daemon.decision_rows("kind = 'expire'")) == 2, WAIT_S)
            batch.grow("r1", 33)
            assert [(d.kind, d.request_id) for d in await flush_step(batch, submitted, elsewhere)] == [
                (DecisionKind.ADMIT, "r1"), (DecisionKind.ADMIT, "r2")]

            # Draining: the new request goes elsewhere, the running one still grows.
            assert await observer.drain() == 2
            submit(batch, RequestSpec("r3", 32, 16))
            batch.grow("r1", 33)
            assert [(d.kind, d.request_id) for d in await flush_step(batch, submitted, elsewhere)] == [
                (DecisionKind.GROW, "r1")]
            assert ([s.request_id for s in elsewhere], sorted(submitted)) == (["r3"], ["r1", "r2"])
            assert len(batch) == 0


async def test_close_ends_an_observers_watch(daemon: DaemonProcess) -> None:
    observer = ObserverClient(daemon.target)
    updates: list[int] = []

    async def watch() -> None:
        async for update in observer.watch(interval_ms=50):
            updates.append(update.snapshot.num_free_blocks)

    watcher = asyncio.create_task(watch())
    await await_until(lambda: _true_when(len(updates) >= 2), WAIT_S)
    await observer.close()
    await asyncio.wait_for(watcher, WAIT_S)
    assert not watcher.cancelled() and watcher.exception() is None
    assert set(updates) == {64}


async def test_a_decision_sent_again_on_the_next_events_stream_is_heard_once() -> None:
    """The daemon sends a decision again, first, on the next stream when the last one ended
    mid-write (it may have arrived): the client yields it once."""
    from kvbudget.v1 import common_pb2, engine_pb2

    def message(seq: int, request_id: str) -> engine_pb2.EventsResponse:
        return engine_pb2.EventsResponse(decision=common_pb2.Decision(
            seq=seq, kind=common_pb2.DECISION_KIND_ADMIT, request_id=request_id))

    class _Call:
        def __init__(self, messages, then_fail: bool) -> None:
            self.messages, self.then_fail = messages, then_fail

        def cancel(self) -> None:
            pass

        async def __aiter__(self):
            for m in self.messages:
                yield m
            if self.then_fail:
                raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(),
                                           grpc.aio.Metadata(), "connection dropped")

    calls = [_Call([message(7, "a"), message(9, "b")], then_fail=True),
             _Call([message(9, "b"), message(12, "c")], then_fail=False)]

    class _Stub:
        def Events(self, request, **kwargs):
            return calls.pop(0) if calls else _Call([], then_fail=False)

    client = EngineClient("unix:///nowhere.sock", "e", heartbeat=False, max_backoff_s=0.01)
    client.session_id = "s1"
    client._stub = _Stub()
    heard = []
    async for decision in client.events():
        heard.append(decision.request_id)
        if len(heard) == 3:
            break
    assert heard == ["a", "b", "c"]
    client.session_id = ""  # (no daemon to close a session with)
    await client.close()
