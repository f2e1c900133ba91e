"""Where the dashboard's updates come from: the daemon's Watch stream, or a recording.

A source is an async iterator of events: `Connected`, `Update` (one WatchResponse) and
`Disconnected` (why, and when it will try again). The app runs exactly one worker over one
source and folds the events into its state; it never talks to gRPC itself.

`WatchSource` survives the daemon restarting: when the stream ends or cannot be opened it
reports `Disconnected` and tries again after a capped exponential backoff, forever, and the
backoff starts over once a stream delivers its first update. `RecordedSource` plays a list
of responses (tests, screenshots, the offline demo) through the same interface.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from kvbudget.client.target import no_socket, unix_socket_path
from kvbudget.v1 import observer_pb2

if TYPE_CHECKING:
    import grpc


@dataclass(frozen=True)
class Connected:
    pass


@dataclass(frozen=True)
class Update:
    response: observer_pb2.WatchResponse


@dataclass(frozen=True)
class Disconnected:
    detail: str
    retry_in_s: float


SourceEvent = Connected | Update | Disconnected


class Source(Protocol):
    def events(self) -> AsyncIterator[SourceEvent]: ...


@dataclass(frozen=True)
class Backoff:
    initial_s: float = 0.25
    factor: float = 2.0
    max_s: float = 5.0

    def delay(self, failures: int) -> float:
        """Seconds to wait after `failures` consecutive failed attempts (the first is 0)."""
        return min(self.max_s, self.initial_s * self.factor**failures)


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


def open_channel(target: str, token: str | None = None, credentials: grpc.ChannelCredentials | None = None):
    """A TLS channel with `credentials` (`kvbudget.client.tls.channel_credentials`), else an
    insecure one (unix socket, or TCP where the token is the guard).

    grpc is imported here so that importing the dashboard package stays cheap.
    """
    import grpc

    options = (
        # Fail fast and let the backoff decide when to try again.
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 1000),
        ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    )
    if credentials is not None:
        return grpc.aio.secure_channel(target, credentials, options=options)
    return grpc.aio.insecure_channel(target, options=options)


class WatchSource:
    """The daemon's ObserverService.Watch stream, reopened whenever it ends; over TLS with
    `credentials` (None: plaintext)."""

    def __init__(
        self,
        target: str,
        token: str | None = None,
        *,
        credentials: grpc.ChannelCredentials | None = None,
        interval_ms: int = 50,  # faster than the render rate, so every frame has news
        max_decisions: int = 500,  # the table buffer: nothing older could be shown anyway
        backoff: Backoff = Backoff(),
    ) -> None:
        self.target = target
        self._metadata = auth_metadata(token)
        self._token = token
        self.credentials = credentials
        self._request = observer_pb2.WatchRequest(
            interval_ms=interval_ms, max_decisions=max_decisions
        )
        self._backoff = backoff

    async def events(self) -> AsyncIterator[SourceEvent]:
        import grpc

        from kvbudget.v1 import observer_pb2_grpc

        failures = 0
        while True:
            channel = open_channel(self.target, self._token, self.credentials)
            detail = "stream ended"
            try:
                stub = observer_pb2_grpc.ObserverServiceStub(channel)
                call = stub.Watch(self._request, metadata=self._metadata)
                connected = False
                async for response in call:
                    if not connected:
                        connected, failures = True, 0
                        yield Connected()
                    yield Update(response)
            except grpc.aio.AioRpcError as exc:
                detail = _missing_socket(self.target) or _short_error(exc)
            except Exception as exc:  # noqa: BLE001 - the dashboard must outlive any one stream
                detail = f"{type(exc).__name__}: {exc}"[:100]
            finally:
                await channel.close(grace=None)
            delay = self._backoff.delay(failures)
            failures += 1
            yield Disconnected(detail, delay)
            await asyncio.sleep(delay)


def _missing_socket(target: str) -> str | None:
    """The other commands' words for a unix socket that is not there, instead of grpc's
    "No such file or directory": the operator sees one message for one cause."""
    path = unix_socket_path(target)
    if path is None or os.path.exists(path):
        return None
    return no_socket(path)


def _short_error(exc) -> str:
    """UNAVAILABLE rather than a page of C-core detail: the message's first line, whole.

    Not cut to a fixed width: grpc puts the cause at the end ("... error: Connection
    refused"); the status line shows that cause first and cuts the rest at the terminal's
    edge. Bounded all the same, against a peer that sends a novel.
    """
    details = (exc.details() or "").splitlines()
    first = details[0][:MAX_DETAIL] if details else ""
    return f"{exc.code().name}: {first}" if first else exc.code().name


MAX_DETAIL = 1000


class RecordingSource:
    """Passes another source's events through, writing each update as a JSON line to `path`
    (what `RecordedSource.from_jsonl` and `kvbudget tui --recording` play back)."""

    def __init__(self, inner: Source, path: Path) -> None:
        self.inner = inner
        self.path = Path(path)

    async def events(self) -> AsyncIterator[SourceEvent]:
        from google.protobuf import json_format

        with self.path.open("a") as out:
            async for event in self.inner.events():
                if isinstance(event, Update):
                    out.write(json_format.MessageToJson(event.response, indent=None) + "\n")
                    out.flush()
                yield event


class RecordedSource:
    """Plays recorded responses, then holds the last state (as an idle daemon would)."""

    def __init__(
        self,
        responses: Sequence[observer_pb2.WatchResponse],
        interval_s: float = 0.0,
        *,
        hold: bool = True,
    ) -> None:
        self.responses = list(responses)
        self.interval_s = interval_s
        self.hold = hold

    @classmethod
    def from_jsonl(cls, path: Path, interval_s: float = 0.0) -> RecordedSource:
        from google.protobuf import json_format

        lines = Path(path).read_text().splitlines()
        responses = [json_format.Parse(x, observer_pb2.WatchResponse()) for x in lines if x]
        return cls(responses, interval_s)

    async def events(self) -> AsyncIterator[SourceEvent]:
        yield Connected()
        for response in self.responses:
            yield Update(response)
            # Even at interval 0, let the app's loop breathe between updates.
            await asyncio.sleep(self.interval_s)
        if self.hold:
            await asyncio.Event().wait()
        yield Disconnected("recording ended", 0.0)
