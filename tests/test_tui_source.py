"""The dashboard's one source: the Watch stream, reopened when the daemon goes away.

A small in-test ObserverService stands in for the daemon so that a restart can be staged
exactly: serve, stop, serve again on the same unix socket.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from kvbudget.client.target import no_socket
from kvbudget.tui.source import (
    Backoff,
    Connected,
    Disconnected,
    RecordedSource,
    WatchSource,
    auth_metadata,
)
from kvbudget.v1 import common_pb2, observer_pb2, observer_pb2_grpc


class FakeObserver(observer_pb2_grpc.ObserverServiceServicer):
    """Sends `updates` snapshots numbered from `first`, then ends the stream."""

    def __init__(self, first: int, updates: int) -> None:
        self.first, self.updates = first, updates
        self.requests: list[observer_pb2.WatchRequest] = []
        self.metadata: list[tuple] = []

    async def Watch(self, request, context):
        self.requests.append(request)
        self.metadata.append(tuple(context.invocation_metadata()))
        for i in range(self.updates):
            snapshot = common_pb2.Snapshot(time_unix_s=float(self.first + i), num_blocks=10)
            yield observer_pb2.WatchResponse(snapshot=snapshot)
        await asyncio.sleep(3600)  # then stay open, like a daemon with nothing new


async def serve(socket: Path, observer: FakeObserver) -> grpc.aio.Server:
    server = grpc.aio.server()
    observer_pb2_grpc.add_ObserverServiceServicer_to_server(observer, server)
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    return server


async def next_event(events, timeout: float = 20.0):
    return await asyncio.wait_for(events.__anext__(), timeout)


async def test_survives_the_daemon_restarting(tmp_path: Path):
    socket = tmp_path / "kvbudget.sock"
    first = FakeObserver(first=1, updates=2)
    server = await serve(socket, first)
    source = WatchSource(f"unix://{socket}", "secret", interval_ms=50, max_decisions=300,
                         backoff=Backoff(initial_s=0.05, factor=2.0, max_s=0.2))
    events = source.events()
    try:
        assert isinstance(await next_event(events), Connected)
        times = [(await next_event(events)).response.snapshot.time_unix_s for _ in range(2)]
        assert times == [1.0, 2.0]
        # What the dashboard asked for, and how it said who it is.
        assert first.requests[0] == observer_pb2.WatchRequest(interval_ms=50, max_decisions=300)
        assert ("authorization", "Bearer secret") in first.metadata[0]

        await server.stop(grace=None)  # the daemon goes away
        down = await next_event(events)
        assert isinstance(down, Disconnected)
        assert down.retry_in_s == 0.05  # the first retry waits the initial backoff
        # It keeps trying while nothing listens, backing off: 0.05, 0.1, 0.2, 0.2 ...
        again = await next_event(events)
        # grpc removed its socket on stop: said in the words every other command uses
        assert isinstance(again, Disconnected) and again.detail == no_socket(str(socket))
        assert again.retry_in_s == 0.1

        server = await serve(socket, FakeObserver(first=100, updates=1))  # back up
        event = await next_event(events)
        while isinstance(event, Disconnected):  # retries that fell before it came back
            event = await next_event(events)
        assert isinstance(event, Connected)
        assert (await next_event(events)).response.snapshot.time_unix_s == 100.0
    finally:
        await events.aclose()
        await server.stop(grace=None)


def test_backoff_doubles_up_to_its_cap():
    backoff = Backoff(initial_s=0.25, factor=2.0, max_s=5.0)
    # 0.25 x 2^n: 0.25, 0.5, 1, 2, 4, then capped at 5
    assert [backoff.delay(n) for n in range(7)] == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_no_token_no_metadata():
    assert auth_metadata(None) == ()
    assert auth_metadata("t") == (("authorization", "Bearer t"),)


async def test_recorded_source_plays_in_order_then_ends_when_told():
    responses = [observer_pb2.WatchResponse(snapshot=common_pb2.Snapshot(time_unix_s=t))
                 for t in (1.0, 2.0)]
    events = [e async for e in RecordedSource(responses, hold=False).events()]
    assert isinstance(events[0], Connected)
    assert [e.response.snapshot.time_unix_s for e in events[1:3]] == [1.0, 2.0]
    assert events[3] == Disconnected("recording ended", 0.0)


def test_recorded_source_reads_json_lines(tmp_path: Path):
    from google.protobuf import json_format

    path = tmp_path / "stream.jsonl"
    response = observer_pb2.WatchResponse(snapshot=common_pb2.Snapshot(num_blocks=7))
    path.write_text(json_format.MessageToJson(response, indent=None) + "\n")
    assert RecordedSource.from_jsonl(path).responses == [response]
    with pytest.raises(json_format.ParseError):
        path.write_text("{not json\n")
        RecordedSource.from_jsonl(path)


def test_replay_command_line_and_shipped_traces():
    from kvbudget.tui.replays import ReplayRequest, replay_argv, replay_env, shipped_traces

    traces = shipped_traces()
    names = {p.name for p in traces}
    assert {"mooncake_fast25_conversation_trace.jsonl", "azure_llm_2023_conv.csv"} <= names
    request = ReplayRequest(traces[0], speed=20.0, policy="guaranteed", limit=500)
    assert replay_argv(request, "unix:///run/k.sock", python="py") == [
        "py", "-m", "kvbudget", "replay", str(traces[0]), "--target", "unix:///run/k.sock",
        "--speed", "20", "--policy", "guaranteed", "--limit", "500",
    ]
    # the token travels in the child's environment, never on its command line (`ps` shows that)
    assert replay_env("tok", {"PATH": "p"}) == {"PATH": "p", "KVBUDGET_TOKEN": "tok"}
    assert replay_env(None, {"PATH": "p", "KVBUDGET_TOKEN": "stale"}) == {"PATH": "p"}
    # the daemon's policy and the whole trace: no flags for them
    assert replay_argv(ReplayRequest(traces[0]), "t", python="py")[-2:] == ["--speed", "10"]
    with pytest.raises(ValueError, match="policy"):
        ReplayRequest(traces[0], policy="fastest")
    with pytest.raises(ValueError, match="speed"):
        ReplayRequest(traces[0], speed=0)


def test_replay_launcher_runs_and_stops_its_children(tmp_path: Path, monkeypatch):
    import sys

    from kvbudget.tui import replays

    launcher = replays.ReplayLauncher("unix:///nowhere.sock", log_path=tmp_path / "replay.log")
    # A stand-in child that would run for a minute: stop_all must end it.
    monkeypatch.setattr(replays, "replay_argv",
                        lambda *a, **k: [sys.executable, "-c", "import time; time.sleep(60)"])
    child = launcher.start(replays.ReplayRequest(tmp_path / "t.jsonl"))
    assert launcher.running() == [child]
    launcher.stop_all()
    assert child.poll() is not None and launcher.running() == []


def test_replay_launcher_gives_the_child_its_token_in_the_environment(tmp_path: Path, monkeypatch):
    import sys

    from kvbudget.tui import replays

    launcher = replays.ReplayLauncher("unix:///nowhere.sock", "s3cret", log_path=tmp_path / "replay.log")
    seen = {}
    real_argv = replays.replay_argv

    def argv(*a, **k):
        seen["argv"] = real_argv(*a, **k)
        return [sys.executable, "-c", "import os; print('token=' + os.environ['KVBUDGET_TOKEN'])"]

    monkeypatch.setattr(replays, "replay_argv", argv)
    child = launcher.start(replays.ReplayRequest(tmp_path / "t.jsonl"))
    child.wait(30)
    assert "s3cret" not in " ".join(seen["argv"])
    assert launcher.reap() == [replays.Finished("t.jsonl", 0, "token=s3cret")]


def test_replay_launcher_reports_a_failed_child_with_its_last_line(monkeypatch):
    import sys

    from kvbudget.tui import replays

    launcher = replays.ReplayLauncher("unix:///nowhere.sock")
    monkeypatch.setattr(replays, "replay_argv", lambda *a, **k: [
        sys.executable, "-c", "import sys; print('loading'); sys.exit('kvbudget replay: error: no daemon')",
    ])
    child = launcher.start(replays.ReplayRequest(Path("azure.csv")))
    child.wait(30)
    assert launcher.reap() == [
        replays.Finished("azure.csv", 1, "kvbudget replay: error: no daemon")
    ]
    assert launcher.reap() == []  # reported once


async def test_recording_source_writes_what_recorded_source_plays(tmp_path: Path):
    from kvbudget.tui.source import RecordingSource

    responses = [observer_pb2.WatchResponse(snapshot=common_pb2.Snapshot(time_unix_s=t))
                 for t in (1.0, 2.0, 3.0)]
    path = tmp_path / "stream.jsonl"
    inner = RecordedSource(responses, hold=False)
    events = [e async for e in RecordingSource(inner, path).events()]
    assert len(events) == 5  # connected, three updates, the end: all passed through
    assert RecordedSource.from_jsonl(path).responses == responses


def test_a_disconnect_keeps_grpcs_whole_first_line():
    # grpc names the cause last; cut at 80 characters, "Connection refused" was lost.
    from kvbudget.tui.source import _short_error

    class Refused:
        def code(self):
            return grpc.StatusCode.UNAVAILABLE

        def details(self):
            return (
                "failed to connect to all addresses; last error: FAILED_PRECONDITION: "
                "unix:/tmp/k/d.sock: connect failed: addr: unix:/tmp/k/d.sock error: "
                "Connection refused\nsecond line"
            )

    detail = _short_error(Refused())
    assert detail.startswith("UNAVAILABLE: failed to connect")
    assert detail.endswith("error: Connection refused")
