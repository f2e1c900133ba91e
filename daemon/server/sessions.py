"""Engine sessions and their leases, and what a session keeps of its last step for a resend.

A session's lease is renewed by its every call; one silent past its TTL is expired. An
engine id has at most one live session. (The resend protocol: `steps.py`.)
"""

from __future__ import annotations

import asyncio
import secrets
from collections import deque
from dataclasses import dataclass, field

from kvbudget.daemon.server.lease_clock import LeaseClock
from kvbudget.daemon.core.records import Decision
from kvbudget.v1 import common_pb2


class SessionExists(Exception):
    pass


class TooManySessions(Exception):
    pass


# Events waiting for a session whose engine does not read its stream are bounded: past
# this, the oldest are dropped (the log keeps them all; the engine can query it).
EVENTS_QUEUE_LIMIT = 10_000


@dataclass(frozen=True)
class UnansweredStep:
    """A step applied whose decisions wait to be written (the engine was told UNAVAILABLE)."""

    request: bytes  # the StepRequest's ops, serialized deterministically (step_seq left out): its retry's are the same
    reply: object  # the StepResponse, kept for that retry
    decisions: tuple[Decision, ...]  # the engine's own (those in the reply): streamed if it moves on


@dataclass(slots=True)  # one per numbered step: slots make it cheaper to build
class KeptStep:
    """The last numbered step applied, with what its sender was (or is being) told."""

    seq: int
    request: object  # the StepRequest: a resend must be the same step
    # The decisions' commit (None: nothing to wait for). A resend that comes while it runs
    # waits for it, as the first call does: nothing is answered before it is in the log.
    committed: asyncio.Future | None
    reply: object | None = None  # the StepResponse, or
    error: tuple[object, str] | None = None  # (refusal.Status, message) the step ended with
    # While `committed` runs: the step's decisions, for `unanswered` should the write fail
    # after the first call has gone (its deadline), the resend being the one to find out.
    decisions: list[Decision] | None = None


class EventQueue:
    """A session's later decisions, for its Events stream. Bounded like an asyncio.Queue of
    `maxsize` (the caller drops the oldest: admission never blocks on a reader) and read by
    one stream at a time; unlike one, a decision a stream took but could not send (its call
    ended mid-write, or a newer stream took over meanwhile) goes back to the front
    (`put_front`), so the next stream sends it first, in the order made."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._items: deque[Decision | None] = deque()
        self._ready = asyncio.Event()

    def qsize(self) -> int:
        return len(self._items)

    def full(self) -> bool:
        return len(self._items) >= self.maxsize

    def put_nowait(self, item: Decision | None) -> None:
        self._items.append(item)
        self._ready.set()

    def put_front(self, item: Decision) -> None:
        self._items.appendleft(item)  # (one past maxsize at most: it was in the queue a moment ago)
        self._ready.set()

    def get_nowait(self) -> Decision | None:
        if not self._items:
            raise asyncio.QueueEmpty
        item = self._items.popleft()
        if not self._items:
            self._ready.clear()
        return item

    async def get(self) -> Decision | None:
        """The oldest item; a get cancelled while it waits takes nothing."""
        while not self._items:
            await self._ready.wait()
        return self.get_nowait()


@dataclass(eq=False)
class Session:
    session_id: str
    engine_id: str
    lease_ttl_s: float
    expires_at: float  # lease time (SessionTable.clock)
    events: EventQueue = field(default_factory=lambda: EventQueue(EVENTS_QUEUE_LIMIT))
    events_dropped: int = 0
    # Set when another Events stream of this session takes over: one reader at a time.
    events_reader: asyncio.Event | None = None
    closed: bool = False
    # A step applied but not yet written to the log: the engine's retry gets its reply
    unanswered: UnansweredStep | None = None
    # The last numbered step (step_seq > 0) applied: a resend of it gets the same outcome
    last_step: KeptStep | None = None
    # The credential that opened it (`auth.Caller.credential`): only it may use or replace
    # the session (identity.py). "trusted": a unix-socket caller, or TCP without tokens.
    owner: str = "trusted"

    def renew(self, lease_now: float) -> None:
        self.expires_at = lease_now + self.lease_ttl_s

    def lease_remaining_s(self, lease_now: float) -> float:
        return max(0.0, self.expires_at - lease_now)

    def push_event(self, decision: Decision) -> None:
        """Never blocks admission: a full queue drops its oldest event."""
        if self.closed:
            return
        if self.events.full():
            self.events.get_nowait()
            self.events_dropped += 1
        self.events.put_nowait(decision)

    def take_events(self) -> asyncio.Event:
        """A new Events stream: the one reading so far is told to end (the returned event is
        set when a later one takes over in turn). Two readers of one queue split its
        decisions between them, and a stale stream (a half-open connection, a reconnect
        racing the old call) took the admissions its engine never heard of."""
        if self.events_reader is not None:
            self.events_reader.set()
        self.events_reader = asyncio.Event()
        return self.events_reader

    def end_events(self) -> None:
        """Wakes the Events stream so it ends (None is the end marker)."""
        self.closed = True
        if self.events.full():
            self.events.get_nowait()
        self.events.put_nowait(None)


class SessionTable:
    def __init__(self, default_ttl_s: float, max_ttl_s: float, max_sessions: int) -> None:
        self.default_ttl_s = default_ttl_s
        self.max_ttl_s = max_ttl_s
        self.max_sessions = max_sessions
        self._by_id: dict[str, Session] = {}
        self._by_engine: dict[str, Session] = {}
        self.clock = LeaseClock()  # what every lease time here is on (`lease_now`: its now)

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self):
        return iter(list(self._by_id.values()))

    def get(self, session_id: str) -> Session | None:
        return self._by_id.get(session_id)

    def of_engine(self, engine_id: str) -> Session | None:
        return self._by_engine.get(engine_id)

    def open(self, engine_id: str, ttl_s: float, lease_now: float) -> Session:
        """Raises SessionExists / TooManySessions; the caller handles replacement."""
        if engine_id in self._by_engine:
            raise SessionExists(engine_id)
        if len(self._by_id) >= self.max_sessions:
            raise TooManySessions(engine_id)
        ttl = min(ttl_s or self.default_ttl_s, self.max_ttl_s)
        session = Session(
            session_id=secrets.token_hex(16),
            engine_id=engine_id,
            lease_ttl_s=ttl,
            expires_at=lease_now + ttl,
        )
        self._by_id[session.session_id] = session
        self._by_engine[engine_id] = session
        return session

    def remove(self, session: Session, *, end_events: bool = True) -> None:
        """`end_events=False` leaves its Events stream open: the caller ends it once the
        decisions its removal made are on it (they reach a stream only once logged)."""
        self._by_id.pop(session.session_id, None)
        if self._by_engine.get(session.engine_id) is session:
            del self._by_engine[session.engine_id]
        if end_events:
            session.end_events()

    def expired(self, lease_now: float) -> list[Session]:
        return [s for s in self._by_id.values() if s.expires_at <= lease_now]


class ReplayTable:
    """Trace replays as their replayers report them (ReportReplay), for the snapshot.

    A replayer reports its progress every few hundred ms and a last time with `done`. One
    that dies never sends that last report, so a replay silent for `stale_after_s` is
    marked done here (its last position stays): the dashboard stops showing it as running.
    At most `max_replays` are kept; finished ones make room for new ones.
    """

    def __init__(self, stale_after_s: float = 30.0, max_replays: int = 64) -> None:
        self.stale_after_s = stale_after_s
        self.max_replays = max_replays
        self._states: dict[str, common_pb2.ReplayState] = {}
        self._reported_at: dict[str, float] = {}  # monotonic

    def __len__(self) -> int:
        return len(self._states)

    def get(self, replay_id: str) -> common_pb2.ReplayState | None:
        return self._states.get(replay_id)

    def values(self) -> list[common_pb2.ReplayState]:
        return list(self._states.values())

    def report(self, state: common_pb2.ReplayState, now_monotonic: float) -> bool:
        """Records a report; False when the table is full of unfinished replays."""
        replay_id = state.replay_id
        if replay_id not in self._states and len(self._states) >= self.max_replays:
            for key in [k for k, r in self._states.items() if r.done]:
                del self._states[key]
                del self._reported_at[key]
            if len(self._states) >= self.max_replays:
                return False
        kept = common_pb2.ReplayState()
        kept.CopyFrom(state)  # not the caller's message: expire() changes it
        self._states[replay_id] = kept
        self._reported_at[replay_id] = now_monotonic
        return True

    def expire(self, now_monotonic: float) -> list[str]:
        """Marks done every unfinished replay silent for stale_after_s; returns their ids."""
        stalled = [
            replay_id
            for replay_id, state in self._states.items()
            if not state.done and now_monotonic - self._reported_at[replay_id] >= self.stale_after_s
        ]
        for replay_id in stalled:
            self._states[replay_id].done = True
        return stalled
