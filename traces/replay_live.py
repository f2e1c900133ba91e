"""Replay a trace live: each simulated engine holds a session with a running daemon.

One `Step` per simulated step that has something to ask; the daemon decides, logs and
shows it on its dashboard. Decisions come back on the Step reply and, for those another
engine's call caused, on the engine's event stream.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from kvbudget.daemon.core.records import Decision, DecisionKind, Reason
from kvbudget.daemon.core.spec import KVCacheLayout
from kvbudget.daemon.core.step import StepOps
from kvbudget.traces.trace_request import TraceRequest
from kvbudget.traces.replay import ReplaySetup
from kvbudget.traces.results import ReplayResult, summarize
from kvbudget.traces.simulation import ProgressHook, Simulation

if TYPE_CHECKING:
    import grpc


_STOPS = (DecisionKind.PREEMPT, DecisionKind.EXPIRE, DecisionKind.REJECT, DecisionKind.ADMIT)
IDLE_WAIT_S = 0.15  # the daemon looks at its queue every 0.1 s
STALE_WAIT_S = 0.5
MAX_STEP_ATTEMPTS = 8
LIVE_MAX_IDLE_ROUNDS = 400  # ~60 s of nothing admitted, nothing running: give up
_OP_FIELD = re.compile(r"^(grows|progress)\[(\d+)\]")


def _culprit(ops: StepOps, details: str) -> str | None:
    """The request of the grow / progress op a refused step names (`grows[1].num_tokens: ...`)."""
    match = _OP_FIELD.match(details)
    if not match:
        return None
    items = ops.grows if match.group(1) == "grows" else ops.progress
    index = int(match.group(2))
    return items[index][0] if index < len(items) else None


def _stale_codes():
    import grpc

    return (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT)


class DaemonBackend:
    """Simulated engines as gRPC sessions of a running daemon (one EngineClient each).

    Pacing: `poll` waits until wall time catches up with virtual time / speed.
    Decisions taken for one engine inside another engine's call arrive on the first
    engine's event stream; `poll` hands over whatever has arrived, and `step` copes with
    news that is still on its way (see there). Decisions are counted once by `seq`.
    """

    def __init__(self, target: str, token: str | None, layout: KVCacheLayout, num_blocks: int,
                 *, speed: float | None, replace_existing: bool = True,
                 credentials: grpc.ChannelCredentials | None = None,
                 on_reject: Callable[[LiveDecision | Decision], None] | None = None) -> None:  # fmt: skip
        self.target = target
        self.token = token
        self.credentials = credentials  # TLS for a TCP daemon; None: plaintext
        self.layout = layout
        self.num_blocks = num_blocks
        self.speed = speed
        self.replace_existing = replace_existing
        self.clients: dict[str, object] = {}
        self._events: dict[str, asyncio.Queue[Decision]] = {}
        self._readers: list[asyncio.Task] = []
        self._free = num_blocks
        # Every decision counted, by seq, with the policy that took it (a dict rather
        # than a set of seqs: the same keys, and the policies in order come for free).
        self._seen: dict[int, str] = {}
        self._wall_origin: float | None = None
        self._replies = ReplyReader()
        self.on_reject = on_reject  # told of each rejection as it is counted (RejectionNotes)

    async def open_engine(self, engine_id: str) -> None:
        from kvbudget.client import EngineClient

        client = EngineClient(self.target, engine_id, self.token, credentials=self.credentials,
                              replace_existing=self.replace_existing)  # fmt: skip
        await client.open()
        self.clients[engine_id] = client
        queue: asyncio.Queue[Decision] = asyncio.Queue()
        self._events[engine_id] = queue
        self._readers.append(asyncio.create_task(self._read_events(client, queue)))

    async def _read_events(self, client, queue: asyncio.Queue[Decision]) -> None:
        try:
            async for decision in client.events():
                queue.put_nowait(decision)
        except asyncio.CancelledError:
            raise
        except Exception:  # the stream died with the daemon; steps will report it
            return

    def note(self, decisions: list[Decision | LiveDecision]) -> list[Decision | LiveDecision]:
        """Those of `decisions` not counted before (by seq), now counted."""
        fresh = []
        seen = self._seen
        on_reject, reject = self.on_reject, DecisionKind.REJECT
        for d in decisions:
            if d.seq in seen:
                continue
            seen[d.seq] = d.policy
            fresh.append(d)
            if d.kind is reject and on_reject is not None:
                on_reject(d)
        return fresh

    def policies(self) -> list[str]:
        """The policies that decided this replay's requests, in decision (seq) order, a
        run of one policy named once: `["optimistic", "guaranteed"]` if it was switched
        mid-replay. By seq, not by arrival: an event stream may deliver late."""
        names = set(self._seen.values()) - {""}
        if len(names) <= 1:  # the usual case: no need to sort every seq
            return sorted(names)
        out: list[str] = []
        for _, name in sorted(self._seen.items()):
            if name and (not out or out[-1] != name):
                out.append(name)
        return out

    def _drain(self) -> list[Decision]:
        out: list[Decision] = []
        for queue in self._events.values():
            while not queue.empty():
                out.append(queue.get_nowait())
        return out

    async def poll(self, engine_id: str, now: float) -> list[Decision]:
        if self.speed:
            if self._wall_origin is None:
                self._wall_origin = time.monotonic() - now / self.speed
            delay = self._wall_origin + now / self.speed - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        await asyncio.sleep(0)  # let the event readers and heartbeats run
        return self.note(self._drain())

    async def idle(self, engine_id: str, now: float) -> list[Decision]:
        """Nothing runs here: give the daemon's own queue pass (every 0.1 s) time to admit."""
        out = await self.poll(engine_id, now)
        if out:
            return out
        deadline = time.monotonic() + IDLE_WAIT_S
        while time.monotonic() < deadline and not any(not q.empty() for q in self._events.values()):
            await asyncio.sleep(0.002)
        return await self.poll(engine_id, now)

    async def step(self, engine_id: str, ops: StepOps, now: float) -> list[Decision | LiveDecision]:
        """One Step. Another engine's call may have preempted (and maybe re-admitted) one
        of ours a moment ago, with the news still on its way on our event stream: the
        daemon then refuses the step (waiting request, unknown request, fewer slots than it
        now holds, ...) and changes nothing. We wait for the news, drop the grows and
        progress of the requests it concerns, and send the step again."""
        import grpc

        from kvbudget.client import step_message

        client = self.clients[engine_id]
        early: list[Decision] = []
        for attempt in range(MAX_STEP_ATTEMPTS):
            message = step_message(
                "", ops.submits, ops.grows, ops.progress, ops.finishes, ops.aborts, ops.admit_tokens, ops.admit_seqs
            )
            try:
                response = await client.step_raw(message)  # type: ignore[attr-defined]
                break
            except grpc.aio.AioRpcError as error:
                details = error.details() or ""
                culprit = _culprit(ops, details)
                stale = error.code() in _stale_codes() and culprit is not None
                if not stale or attempt == MAX_STEP_ATTEMPTS - 1:
                    raise
                news = await self._wait_for_news(culprit)
                early += news
                # The refused op is stale whatever the news says; so are the grows and
                # progress of every request the news stopped or restarted.
                drop = {culprit} | {d.request_id for d in news if d.kind in _STOPS}
                ops = StepOps(
                    finishes=ops.finishes,
                    aborts=ops.aborts,
                    progress=[p for p in ops.progress if p[0] not in drop],
                    grows=[g for g in ops.grows if g[0] not in drop],
                    submits=ops.submits,
                    admit_tokens=ops.admit_tokens,
                    admit_seqs=ops.admit_seqs,
                )
        self._free = response.num_free_blocks
        return early + self.note(self._replies.read(response.decisions))

    async def _wait_for_news(self, request_id: str) -> list[Decision]:
        """Events that arrived, waiting (briefly) for one about `request_id`."""
        deadline = time.monotonic() + STALE_WAIT_S
        news = self.note(self._drain())
        while not any(d.request_id == request_id for d in news) and time.monotonic() < deadline:
            await asyncio.sleep(0.002)
            news += self.note(self._drain())
        return news

    def num_free_blocks(self) -> int:
        return self._free

    async def close(self) -> None:
        for task in self._readers:
            task.cancel()
        for task in self._readers:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        for client in self.clients.values():
            await client.close()  # type: ignore[attr-defined]


class LiveDecision(NamedTuple):
    """The fields of a Step reply's decision that the simulated engine reads.

    A tuple built from the message in one go: a full `Decision` (frozen dataclass, block
    id lists converted) costs about six times as much, once per decision of a replay."""

    seq: int
    kind: DecisionKind
    reason: Reason
    request_id: str
    num_tokens: int
    num_computed: int
    cached_hit_blocks: int
    num_free_blocks: int
    policy: str  # the policy that took it ("" if this client does not know its number)


class ReplyReader:
    """Reads a Step reply's decisions into `LiveDecision`s, the protos' enum numbers
    looked up in tables built once."""

    def __init__(self) -> None:
        from kvbudget.daemon.core.policies import POLICIES
        from kvbudget.daemon.wire import convert  # the protos: live mode only

        self.kinds = {value: kind for kind in DecisionKind if (value := convert.kind_to_proto(kind))}
        self.reasons = {reason.value: reason for reason in Reason}
        self.policies = {convert.policy_to_proto(name): name for name in POLICIES}

    def read(self, messages) -> list[LiveDecision]:
        kinds, reasons, policies = self.kinds, self.reasons, self.policies
        admit, none = DecisionKind.ADMIT, Reason.NONE
        return [
            LiveDecision(
                m.seq,
                kinds.get(m.kind, admit),
                reasons.get(m.reason, none),
                m.request_id,
                m.num_tokens,
                m.num_computed_tokens,
                m.cached_hit_blocks,
                m.num_free_blocks,
                policies.get(m.policy, ""),
            )
            for m in messages
        ]


POLICY_CHANGE = " -> "  # how a summary shows a policy switched mid-replay


async def run_live(
    trace: Sequence[TraceRequest],
    setup: ReplaySetup,
    *,
    target: str,
    token: str | None = None,
    credentials: grpc.ChannelCredentials | None = None,
    speed: float | None = None,
    trace_name: str = "",
    replay_id: str = "",
    on_progress: ProgressHook | None = None,
    rejections: RejectionNotes | None = None,
) -> ReplayResult:
    """Replay against the daemon at `target` (over TLS with `credentials`, as
    `kvbudget.client.tls.channel_credentials` builds them). The pool and layout come from its plan.

    `on_progress` hears of the start at once (0 done): a replayer that reports its
    progress to the daemon is on the dashboard from its first moment, not 200 steps
    later (~25 s of a replay at 10x). `rejections` says each rejection as it comes
    (None: on stderr)."""
    notes = rejections if rejections is not None else RejectionNotes()
    if on_progress is not None:
        on_progress(0, len(trace), 0.0)
    # The plan tells the real pool; the simulated engine's block size must match it.
    backend = DaemonBackend(target, token, setup.layout, setup.num_blocks, speed=speed, credentials=credentials,
                            on_reject=notes.add)  # fmt: skip
    simulation = Simulation(
        trace, setup.layout, setup.engine, engines=setup.engines, seed=setup.seed,
        id_prefix=f"{replay_id}-" if replay_id else "", sample_interval_s=setup.sample_interval_s,
        spread_s=setup.spread_s, on_progress=on_progress, max_idle_rounds=LIVE_MAX_IDLE_ROUNDS,
    )  # fmt: skip
    started = time.perf_counter()
    try:
        run = await simulation.run_async(backend)
    finally:
        await backend.close()
        notes.close()
    wall = time.perf_counter() - started
    # What decided this replay's requests, as their decisions say: the daemon's policy at
    # the end is not it if someone switched policies during the replay.
    policy = POLICY_CHANGE.join(backend.policies()) or await _daemon_policy(target, token, credentials)
    return summarize(run, policy=policy, trace=trace_name, mode="live", setup=setup, wall_s=wall)


async def _daemon_policy(target: str, token: str | None, credentials: grpc.ChannelCredentials | None) -> str:
    """The daemon's policy now ("" if it cannot say): for a replay that saw no decision."""
    from kvbudget.client import ObserverClient
    from kvbudget.daemon.wire import convert

    async with ObserverClient(target, token, credentials=credentials) as observer:
        try:
            snapshot = await observer.snapshot(timeout=5.0)
        except Exception:
            return ""
    return convert.policy_from_proto(snapshot.policy) or ""


# Why a request was rejected, in words an operator acts on (the reasons a REJECT carries).
REJECT_WHY = {
    Reason.NEVER_FITS: "its worst case is more than the whole pool",
    Reason.PROMPT_TOO_LONG: "its prompt is longer than max_model_len",
    Reason.TENANT_QUOTA: "its worst case is more than its tenant's quota",
    Reason.QUEUE_FULL: "the daemon's waiting queue is full",
    Reason.DEADLINE: "its deadline passed while it waited",
    Reason.DRAINING: "the daemon is draining",
}


def _stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class RejectionNotes:
    """A live replay's rejections said as they happen, not only in the final table (a
    gemma pool of 4,096 blocks rejected 750 of 1,500 Mooncake requests, and nothing said
    so until the end): the first `first` one a line with why, then the count by reason at
    most every `every_s` (a pool that serves nothing rejects thousands), and at the end the
    count if it moved since it was last said."""

    def __init__(self, write: Callable[[str], None] = _stderr_line, *, first: int = 5, every_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.write, self.first, self.every_s, self.clock = write, first, every_s, clock
        self.by_reason: dict[str, int] = {}
        self.rejected = 0
        self._said = 0  # the count the last line gave
        self._said_at: float | None = None

    def add(self, decision: LiveDecision | Decision) -> None:
        reason = decision.reason
        name = reason.value if isinstance(reason, Reason) else str(reason)
        self.rejected += 1
        self.by_reason[name] = self.by_reason.get(name, 0) + 1
        if self.rejected <= self.first:
            why = REJECT_WHY.get(reason, "") if isinstance(reason, Reason) else ""
            self.write(f"kvbudget replay: rejected {decision.request_id} ({name}{': ' + why if why else ''})")
            self._said = self.rejected
            return
        now = self.clock()
        if self._said_at is None or now - self._said_at >= self.every_s:
            self._say("so far")
            self._said_at = now

    def close(self) -> None:
        if self.rejected > self._said:
            self._say("in all")

    def _say(self, when: str) -> None:
        reasons = ", ".join(f"{name} {count:,}" for name, count in sorted(self.by_reason.items(), key=lambda x: -x[1]))
        self.write(f"kvbudget replay: {self.rejected:,} rejected {when} ({reasons})")
        self._said = self.rejected
