"""The dashboard's view model: one immutable value folded from the Watch stream.

Panels are pure functions of a `DashboardState`; folding a `WatchResponse` in returns a new
state, so the app renders at its own rate while updates arrive at theirs.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from kvbudget.client.pool_parts import pool_parts  # (the pool panel's split; the free plot samples it)
from kvbudget.daemon.wire.convert import decision_from_proto, kind_name, policy_name
from kvbudget.tui.replay_rejects import ReplayRejects, count_rejects
from kvbudget.v1 import common_pb2, observer_pb2


@dataclass(frozen=True)
class Limits:
    """How much the dashboard remembers; bounded so hours of load cost constant memory."""

    history_len: int = 480  # samples kept for the plots
    sample_period_s: float = 0.5  # at most one sample per period (daemon clock): 480 = 4 min
    max_decisions: int = 500  # newest decisions kept for the table
    rate_window_s: float = 10.0  # preempt and decision rates are measured over this window

    def __post_init__(self) -> None:
        if self.history_len < 2:
            raise ValueError(f"history_len must be at least 2, got {self.history_len}")
        if self.max_decisions < 1:
            raise ValueError(f"max_decisions must be at least 1, got {self.max_decisions}")
        if self.sample_period_s < 0 or self.rate_window_s <= 0:
            raise ValueError("sample_period_s must be >= 0 and rate_window_s > 0")


@dataclass(frozen=True)
class Sample:
    """One point of the history plots, on the daemon's clock."""

    time_s: float
    free_blocks: int  # neither held, promised nor cached: the pool panel's "free" (pool_parts)
    usage: float  # held / capacity
    waiting: int
    running: int
    preemptions: int  # cumulative
    decisions: int  # cumulative, all kinds
    gpu_used_bytes: int  # 0 without a GPU
    outside_pool_bytes: int  # GPU memory used by everything but the pool
    log_stall_s: float = 0.0  # cumulative: time commits waited for the decision log's upkeep
    # Why the waiting requests waited, as the daemon said (pool_full, budget_full, ...)
    waiting_by_reason: Mapping[str, int] = field(default_factory=dict)


def sample_of(snapshot: common_pb2.Snapshot) -> Sample:
    capacity = snapshot.num_blocks
    gpu = snapshot.gpu
    outside = max(0, gpu.used_bytes - gpu.pool_bytes) if gpu.present else 0
    return Sample(
        time_s=snapshot.time_unix_s,
        free_blocks=pool_parts(snapshot).free,
        usage=snapshot.num_held_blocks / capacity if capacity else 0.0,
        waiting=snapshot.num_waiting,
        running=snapshot.num_running,
        preemptions=snapshot.num_preemptions,
        decisions=sum(snapshot.decisions_by_kind.values()),
        gpu_used_bytes=gpu.used_bytes if gpu.present else 0,
        outside_pool_bytes=outside,
        log_stall_s=snapshot.decision_log.stall_s,
        waiting_by_reason=dict(snapshot.waiting_by_reason),
    )


@dataclass(frozen=True)
class DecisionRow:
    """One decision as the table and the detail view show it (every field of the record)."""

    seq: int
    time_s: float
    kind: str
    reason: str
    request_id: str
    engine_id: str
    tenant: str
    policy: str
    prompt_tokens: int
    max_new_tokens: int
    num_tokens: int
    num_computed_tokens: int
    blocks_reserved: tuple[int, ...]
    blocks_held: tuple[int, ...]
    new_blocks: tuple[tuple[int, tuple[int, ...]], ...]  # (group index, block ids)
    freed_blocks: int
    cached_hit_blocks: int
    num_free_blocks: int
    num_waiting: int
    num_running: int
    detail: str

    @classmethod
    def from_proto(cls, m: common_pb2.Decision) -> DecisionRow:
        """The wire's record of `m`, with kind, reason and policy as the daemon named them:
        a newer daemon's kind or reason is shown as sent, not as this build's default."""
        d = decision_from_proto(m)
        return cls(
            seq=d.seq,
            time_s=d.time_s,
            kind=kind_name(m.kind),
            reason=m.reason,
            request_id=d.request_id,
            engine_id=d.engine_id,
            tenant=d.tenant,
            policy=policy_name(m.policy),
            prompt_tokens=d.prompt_tokens,
            max_new_tokens=d.max_new_tokens,
            num_tokens=d.num_tokens,
            num_computed_tokens=d.num_computed,
            blocks_reserved=d.blocks_reserved,
            blocks_held=d.blocks_held,
            new_blocks=tuple((group, ids) for group, ids in enumerate(d.new_block_ids) if ids),
            freed_blocks=d.freed_blocks,
            cached_hit_blocks=d.cached_hit_blocks,
            num_free_blocks=d.num_free_blocks,
            num_waiting=d.num_waiting,
            num_running=d.num_running,
            detail=d.detail,
        )


STALE_MIN_S = 2.0
STALE_INTERVALS = 5


def _restarted(before: common_pb2.Snapshot | None, after: common_pb2.Snapshot) -> bool:
    """True when `after` comes from another daemon process than `before`.

    Both say when their process started: they differ, or not; nothing else counts. So a
    busy new daemon whose counters already passed an idle old one's is seen, and the same
    daemon whose wall clock was stepped back (NTP) is not taken for a new one: its counters
    never go backwards, its clock may. When either does not say (0: an older daemon, an
    older recording), a guess: the clock or the cumulative counters (which start at 0 in
    every process) went backwards."""
    if before is None:
        return False
    if before.started_unix_s and after.started_unix_s:
        return after.started_unix_s != before.started_unix_s
    return (
        after.time_unix_s < before.time_unix_s
        or after.num_preemptions < before.num_preemptions
        or sum(after.decisions_by_kind.values()) < sum(before.decisions_by_kind.values())
    )


def daemon_uptime_s(snapshot: common_pb2.Snapshot) -> float | None:
    """How long the daemon had been up when it took `snapshot`, on its own clock (so drawing
    it needs no clock here); None when it does not say when it started."""
    started = snapshot.started_unix_s
    uptime = snapshot.time_unix_s - started
    if not started or not math.isfinite(uptime):
        return None
    return max(0.0, uptime)


def decision_matches(m: common_pb2.Decision, query: str) -> bool:
    """The `/` filter: every word must appear in kind, reason, request, engine or tenant."""
    return words_match((kind_name(m.kind), m.reason, m.request_id, m.engine_id, m.tenant), query)


def words_match(fields: tuple[str, ...], query: str) -> bool:
    haystack = " ".join(fields).lower()
    return all(word in haystack for word in query.lower().split())


def _replay_moves(
    previous: tuple[tuple[str, int, float], ...], snapshot: common_pb2.Snapshot
) -> tuple[tuple[str, int, float], ...]:
    known = {replay_id: (position, moved_at) for replay_id, position, moved_at in previous}
    moves = []
    for replay in snapshot.replays:
        position, moved_at = known.get(replay.replay_id, (-1, snapshot.time_unix_s))
        if replay.position != position:
            moved_at = snapshot.time_unix_s
        moves.append((replay.replay_id, replay.position, moved_at))
    return tuple(moves)


class Link(enum.Enum):
    CONNECTING = "connecting"
    CONNECTED = "connected"
    DISCONNECTED = "disconnected"


@dataclass(frozen=True)
class Connection:
    target: str
    link: Link = Link.CONNECTING
    detail: str = ""  # why the last stream ended
    retry_in_s: float = 0.0
    # When the next attempt starts (the app's monotonic clock; None: not told), so the
    # status line can count down rather than repeat the delay it was given.
    retry_at: float | None = None
    reconnects: int = 0  # streams that ended since the dashboard started
    # A recording played back (`kvbudget tui --recording`): no daemon, nothing to retry,
    # nothing goes stale, no replay to start.
    playback: bool = False


@dataclass(frozen=True)
class DashboardState:
    connection: Connection
    limits: Limits = field(default_factory=Limits)
    snapshot: common_pb2.Snapshot | None = None
    history: tuple[Sample, ...] = ()  # oldest first
    # The newest decisions as they came (oldest first). Kept as messages and turned into
    # DecisionRows only when shown: thousands a second arrive, a screenful is displayed.
    decisions: tuple[common_pb2.Decision, ...] = ()
    # replay id -> (position, daemon time it last moved): a replayer that died never says
    # "done", so the panel marks a replay whose position stands still.
    replay_moves: tuple[tuple[str, int, float], ...] = ()
    replay_rejects: tuple[ReplayRejects, ...] = ()  # each replay's rejections, as they came
    # Every decision this dashboard received, counted across daemon restarts. The buffered
    # decision i is number `decisions_received - len(decisions) + i`: a key for the table
    # that nothing can repeat. `seq` is no such key: a restarted daemon numbers on from its
    # log's last (AdmissionController.number_from), but one started on a fresh or another
    # log numbers from 1 again.
    decisions_received: int = 0
    decisions_dropped: int = 0  # dropped by the daemon because this watcher was slow
    # When the last update arrived (the app's monotonic clock; None: not told) and the
    # daemon-clock gap between the last two snapshots: together they say how stale the
    # panels are (`staleness`).
    updated_at: float | None = None
    update_gap_s: float = 0.0
    # Daemon restarts seen: another start time, or (a daemon that does not say it) counters
    # or decision numbers that went backwards.
    restarts: int = 0
    version: int = 0  # bumped by every change, so the app renders only when it moved

    @classmethod
    def initial(
        cls, target: str, limits: Limits | None = None, *, playback: bool = False
    ) -> DashboardState:
        connection = Connection(target=target, playback=playback)
        return cls(connection=connection, limits=limits or Limits())

    # -- folding events in -------------------------------------------------------------

    def with_response(
        self, response: observer_pb2.WatchResponse, now: float | None = None
    ) -> DashboardState:
        """Fold one Watch update in: new snapshot, one more sample, newest decisions.

        `now`: when it arrived, on the app's monotonic clock (what staleness is measured
        against); None leaves the arrival time as it was.
        """
        limits = self.limits
        history = self.history
        has_snapshot = response.HasField("snapshot")
        snapshot = response.snapshot if has_snapshot else self.snapshot
        incoming = response.decisions
        restarted = (has_snapshot and _restarted(self.snapshot, response.snapshot)) or bool(
            # The decision numbers went backwards: a new daemon on a fresh log, counting from
            # 1 again. (One on the same log numbers on: its snapshot's start time tells.)
            incoming and self.decisions and incoming[0].seq <= self.decisions[-1].seq
        )
        # A daemon that restarted has a clock, counters and decision numbers of its own:
        # start the plots and the decision buffer over rather than mix two runs.
        kept = () if restarted else self.decisions
        # The same daemon's wall clock stepped back (NTP): the plots are on that clock, so
        # they start over too (else no sample joins them until the clock catches up); its
        # decisions stay.
        clock_stepped_back = (
            has_snapshot and self.snapshot is not None
            and response.snapshot.time_unix_s < self.snapshot.time_unix_s
        )
        gap_s = self.update_gap_s
        if has_snapshot:
            sample = sample_of(response.snapshot)
            last = history[-1] if history else None
            if restarted or clock_stepped_back:
                history = (sample,)
            elif last is None or sample.time_s - last.time_s >= limits.sample_period_s:
                history = (history + (sample,))[-limits.history_len :]
            if self.snapshot is not None and not restarted:
                gap_s = max(0.0, response.snapshot.time_unix_s - self.snapshot.time_unix_s)
        replay_moves, replay_rejects = self._replays_after(response, restarted)
        if incoming:
            newest = tuple(incoming[-limits.max_decisions :])
            decisions = (kept + newest)[-limits.max_decisions :]
        else:
            decisions = kept
        return replace(
            self,
            snapshot=snapshot,
            history=history,
            replay_moves=replay_moves,
            replay_rejects=replay_rejects,
            decisions=decisions,
            decisions_received=self.decisions_received + len(incoming),
            decisions_dropped=self.decisions_dropped + response.dropped_decisions,
            updated_at=self.updated_at if now is None else now,
            update_gap_s=gap_s,
            restarts=self.restarts + restarted,
            version=self.version + 1,
        )

    def _replays_after(
        self, response: observer_pb2.WatchResponse, restarted: bool
    ) -> tuple[tuple[tuple[str, int, float], ...], tuple[ReplayRejects, ...]]:
        """The replays' moves and rejections after `response` (a restart starts them over)."""
        if not response.HasField("snapshot"):
            return self.replay_moves, self.replay_rejects
        moves = _replay_moves(() if restarted else self.replay_moves, response.snapshot)
        rejects = count_rejects(() if restarted else self.replay_rejects, response.snapshot.replays,
                                response.decisions, response.dropped_decisions)
        return moves, rejects

    def with_link(
        self, link: Link, detail: str = "", retry_in_s: float = 0.0, now: float | None = None
    ) -> DashboardState:
        """The stream's state changed; `now` (monotonic) dates the retry countdown."""
        previous = self.connection
        reconnects = previous.reconnects + (
            link is Link.DISCONNECTED and previous.link is not Link.DISCONNECTED
        )
        retry_at = None if now is None or link is not Link.DISCONNECTED else now + retry_in_s
        connection = replace(
            previous, link=link, detail=detail, retry_in_s=retry_in_s, retry_at=retry_at,
            reconnects=reconnects,
        )
        return replace(self, connection=connection, version=self.version + 1)

    # -- derived figures ---------------------------------------------------------------

    def decision_number(self, index: int) -> int:
        """The arrival number of `decisions[index]` (see `decisions_received`)."""
        return self.decisions_received - len(self.decisions) + index

    def staleness(self, now: float) -> float | None:
        """Seconds since the last update when the panels no longer show the daemon live:
        disconnected, or no update for `STALE_INTERVALS` update intervals (at least
        `STALE_MIN_S`: a busy host delays a few updates without anything being wrong).
        None when they are live, before the first update, and in playback."""
        if self.connection.playback or self.updated_at is None:
            return None
        age = max(0.0, now - self.updated_at)
        if self.connection.link is Link.DISCONNECTED:
            return age
        if age >= max(STALE_MIN_S, STALE_INTERVALS * self.update_gap_s):
            return age
        return None

    def _window(self) -> tuple[Sample, Sample] | None:
        """The oldest sample inside the rate window and the current one, on the daemon clock."""
        if self.snapshot is None or not self.history:
            return None
        now = sample_of(self.snapshot)
        start = next(
            (s for s in self.history if now.time_s - s.time_s <= self.limits.rate_window_s),
            None,
        )
        if start is None or now.time_s - start.time_s <= 0:
            return None
        return start, now

    def preempt_rate(self) -> float:
        """Preemptions per second over the rate window (0 until two points exist)."""
        window = self._window()
        if window is None:
            return 0.0
        start, now = window
        return max(0, now.preemptions - start.preemptions) / (now.time_s - start.time_s)

    def decision_rate(self) -> float:
        """Decisions per second the daemon made over the rate window."""
        window = self._window()
        if window is None:
            return 0.0
        start, now = window
        return max(0, now.decisions - start.decisions) / (now.time_s - start.time_s)

    def replay_still_s(self, replay_id: str) -> float:
        """Seconds (daemon clock) since this replay's position last moved."""
        if self.snapshot is None:
            return 0.0
        for known_id, _, moved_at in self.replay_moves:
            if known_id == replay_id:
                return max(0.0, self.snapshot.time_unix_s - moved_at)
        return 0.0

    def recent(self, seconds: float) -> tuple[Sample, ...]:
        """The samples of the last `seconds` (daemon clock), the current point included."""
        if self.snapshot is None:
            return ()
        now = sample_of(self.snapshot)
        kept = tuple(s for s in self.history if now.time_s - s.time_s <= seconds)
        if not kept or kept[-1].time_s != now.time_s:
            kept += (now,)
        return kept
