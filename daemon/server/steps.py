"""An engine's Step, served: the resend protocol around validating and applying it.

A numbered step (`step_seq` > 0) is kept with its outcome (`sessions.KeptStep`): the same
step sent again (its reply lost) gets that outcome, nothing applied twice. A step applied
whose decisions could not be written (a full disk) is kept too (`sessions.UnansweredStep`):
its retry gets the reply once they are written; another step means the engine moved on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from kvbudget.daemon.core.records import Decision
from kvbudget.daemon.core.step import BrokenStep, StepOps, apply_step
from kvbudget.daemon.core.validation import StepRejected, validate_step
from kvbudget.daemon.log.unwritten import UnwrittenError
from kvbudget.daemon.server.interpreter import big_step_heap
from kvbudget.daemon.server.refusal import Refused, Status, rejected
from kvbudget.daemon.server.sessions import KeptStep, Session, UnansweredStep
from kvbudget.daemon.server.sliced import SliceGate, is_big, slices
from kvbudget.daemon.server.step_request import read_step, step_bytes
from kvbudget.daemon.wire import convert
from kvbudget.v1 import engine_pb2

if TYPE_CHECKING:
    from kvbudget.daemon.server.service import CoreService

log = logging.getLogger("kvbudget.daemon")
MAX_MESSAGE_BYTES = 64 << 20  # the server's send and receive limit (and EngineClient's): a Step may batch many ops
_UNAVAILABLE = Status.UNAVAILABLE


class Steps:
    """Serves the engines' Steps."""

    def __init__(self, core: CoreService) -> None:
        self.core = core
        self._find = core.controller.find  # (the controller is the service's for its life)
        self._block_size = core.plan.block_size_tokens
        self._session = core.sessions.get
        self._lease_now = core.sessions.clock.now  # (the table's clock for its life)
        self._max_ops = core.options.max_ops_per_step
        self.gate = SliceGate()  # (every other change to the pool waits while a sliced step runs)

    async def step(
        self, request: engine_pb2.StepRequest, started: float, *, wire: bool = False,
    ) -> engine_pb2.StepResponse | bytes:
        """The step's reply, once its decisions are in the log; Refused otherwise.
        `started`: perf_counter at the call's arrival. `wire`: a sliced step's reply as
        the bytes it was serialized to slice by slice (the server sends them as they are:
        serializing 100,000 decisions at once held the loop 12-90 ms)."""
        session = self._session(request.session_id)
        lease_now = self._lease_now()
        if session is None or session.expires_at <= lease_now:
            session = self.core.live_session(request.session_id)  # refused, naming the field
        session.renew(lease_now)
        if session.unanswered is not None:  # the last step was applied but not logged
            reply = self._answer_again(session, request)
            if reply is not None:
                return reply
        step_seq = request.step_seq
        if step_seq and session.last_step is not None and step_seq <= session.last_step.seq:
            return await self._resent(session, request)
        core = self.core
        if core.draining and request.submits:
            raise Refused(_UNAVAILABLE, "submits: daemon is draining, no new requests")
        if core.log.num_unwritten and (
            request.submits or request.grows or request.progress or request.finishes or request.aborts
        ):
            core.check_writable("this step")
        engine_id = session.engine_id
        if self.gate.busy or is_big(request):
            # (no gc pass until a big step is written: interpreter.big_step_heap)
            with big_step_heap() if is_big(request) else contextlib.nullcontext():
                # Shielded: a caller gone between two slices (its deadline) must not leave
                # its step half applied; it is applied whole and kept for the resend.
                sliced = asyncio.ensure_future(self._sliced_step(session, request, engine_id, started))
                sliced.add_done_callback(_read_outcome)  # (a refusal nobody waits for any more is no ERROR)
                decisions, committed, reply, kept, serialized = await asyncio.shield(sliced)
                reply = await self._answered(session, request, reply, decisions, committed, kept, len(serialized))
                return serialized if wire else reply
        now = time.time()
        try:
            ops = read_step(request, engine_id, now, self._max_ops)
            validate_step(ops, engine_id, self._find, self._block_size)
        except StepRejected as problem:
            raise rejected(problem) from None
        try:
            decisions = apply_step(core.controller, ops, now)
        except BrokenStep as broken:
            await self._broken(session, request, broken)
        committed = core.record(decisions, engine_id, started)
        # Usually committed inline already; if it was queued behind others, the reply is built
        # while the writer commits (SQLite releases the GIL). It is sent only after.
        reply, kept = self._reply(session, request, decisions, committed)
        return await self._answered(session, request, reply, decisions, committed, kept)

    async def _answered(
        self, session: Session, request: engine_pb2.StepRequest, reply: engine_pb2.StepResponse,
        decisions: list[Decision], committed: asyncio.Future, kept: KeptStep | None, size: int = 0,
    ) -> engine_pb2.StepResponse:
        """The reply, once the decisions are in the log and if it is not too large to send
        (`size`: its bytes if known); Refused otherwise."""
        if not (committed.done() and committed.exception() is None):
            await self._settle(session, request, reply, decisions, committed)
        if len(decisions) > 1000 and (size := size or reply.ByteSize()) > MAX_MESSAGE_BYTES:
            _too_large(session, kept, decisions, size)
        return reply

    async def _sliced_step(
        self, session: Session, request: engine_pb2.StepRequest, engine_id: str, started: float,
    ) -> tuple[list[Decision], asyncio.Future, engine_pb2.StepResponse, KeptStep | None, bytes]:
        async with self.gate.hold():  # (a big step's slices, or a step waiting for them)
            session.renew(self._lease_now())  # (its lease counts from its turn)
            decisions, committed, reply, serialized = await self._apply_sliced(session, request, engine_id, started)
        return decisions, committed, reply, self._keep(session, request, reply, decisions, committed), serialized

    async def _apply_sliced(
        self, session: Session, request: engine_pb2.StepRequest, engine_id: str, started: float,
    ) -> tuple[list[Decision], asyncio.Future, engine_pb2.StepResponse, bytes]:
        """A step read, validated, applied and answered with the loop let go between slices
        (sliced.py); the caller holds the gate. Returns (decisions, their commit, the reply,
        the reply serialized: slice by slice, the same bytes as at once)."""
        core, now = self.core, time.time()
        try:
            # Read and validated in a worker thread, the loop running beside it (it gets the
            # GIL back every switch interval): 100,000 ops took 0.1-0.4 s. Safe: they only
            # read the pool, and nothing changes it while the gate is held.
            ops = (await asyncio.to_thread(self._read_checked, request, engine_id, now) if is_big(request)
                   else self._read_checked(request, engine_id, now))
        except StepRejected as problem:
            raise rejected(problem) from None
        decisions: list[Decision] = []
        reply, chunks, others = engine_pb2.StepResponse(), [], False  # (others: any decision another engine's)
        for part in slices(ops, core.controller):
            try:
                made = apply_step(core.controller, part, now)
            except BrokenStep as broken:
                core.record(decisions)  # (the slices before stand: logged, and on its Events stream)
                await self._broken(session, request, broken)
            decisions += made
            others = others or any(d.engine_id != engine_id and d.engine_id for d in made)
            built = engine_pb2.StepResponse()
            convert.add_decisions(built.decisions, made, engine_id)
            chunks.append(built.SerializeToString())  # (decisions are field 1: they come first)
            reply.decisions.extend(built.decisions)
            await asyncio.sleep(0)  # (heartbeats and other calls run here)
        reply.num_free_blocks = core.num_free_blocks
        chunks.append(engine_pb2.StepResponse(num_free_blocks=reply.num_free_blocks).SerializeToString())
        # Joined before the writer thread is woken: the join lets the GIL go, and getting
        # it back from the writer's 100,000 rows took 10-50 ms.
        serialized = b"".join(chunks)
        # One batch, as the whole step's: past 1,024 rows the writer thread commits it (an
        # inline commit per slice would hold the loop whenever the file is busy).
        return decisions, core.record(decisions, engine_id, started, others), reply, serialized

    def _read_checked(self, request: engine_pb2.StepRequest, engine_id: str, now: float) -> StepOps:
        """The step's ops, read and validated (StepRejected otherwise)."""
        ops = read_step(request, engine_id, now, self._max_ops)
        validate_step(ops, engine_id, self._find, self._block_size)
        return ops

    def _keep(self, session: Session, request: engine_pb2.StepRequest, reply: engine_pb2.StepResponse,
              decisions: list[Decision], committed: asyncio.Future) -> KeptStep | None:
        """The step as kept for a resend if it is numbered (as `_reply` keeps it)."""
        if not (step_seq := request.step_seq):
            return None
        done = committed.done() and committed.exception() is None
        session.last_step = kept = (KeptStep(step_seq, request, None, reply) if done
                                    else KeptStep(step_seq, request, committed, reply, decisions=decisions))
        return kept

    def _reply(
        self, session: Session, request: engine_pb2.StepRequest, decisions: list[Decision], committed: asyncio.Future
    ) -> tuple[engine_pb2.StepResponse, KeptStep | None]:
        """The step's reply (num_free_blocks: the pool as this step left it), and the step
        as kept for a resend if it is numbered."""
        reply = engine_pb2.StepResponse(num_free_blocks=self.core.num_free_blocks)
        convert.add_decisions(reply.decisions, decisions, session.engine_id)
        return reply, self._keep(session, request, reply, decisions, committed)

    async def _settle(
        self, session: Session, request: engine_pb2.StepRequest, reply: engine_pb2.StepResponse,
        decisions: list[Decision], committed: asyncio.Future,
    ) -> None:
        """Returns once the step's decisions are in the log; Refused if they are not."""
        try:
            # Shielded: a caller gone mid-commit (its deadline) must leave the commit's
            # future to the resend that may follow.
            await asyncio.shield(committed)
        except UnwrittenError as exc:
            # Applied, kept to be written first: the same step sent again gets this reply.
            session.unanswered = _unanswered(request, reply, decisions, session.engine_id)
            raise Refused(
                _UNAVAILABLE,
                f"decision log: {exc}; this step was applied and its decisions wait to be written: "
                "send the same step again to get them once they are",
            ) from None
        except Exception as exc:  # the log could not commit: promise nothing
            raise Refused(_UNAVAILABLE, f"decision log: {exc}") from None

    async def _broken(self, session: Session, request: engine_pb2.StepRequest, broken: BrokenStep) -> None:
        """The controller refused an op validation passed: a broken invariant (a bug). What
        was applied before it stands, is logged and reaches the engine on its Events stream."""
        log.error("engine %r: step broke an invariant at %s (what it applied before stands)",
                  session.engine_id, broken, exc_info=broken)
        committed = self.core.record(broken.decisions)
        error = (Status.INTERNAL, f"{broken}: the daemon refused an op it had validated (a bug); "
                                  "the ops before it were applied")
        if request.step_seq:
            session.last_step = KeptStep(request.step_seq, request, committed, error=error)
        try:
            await asyncio.shield(committed)
        except Exception as exc:  # the log could not commit: promise nothing
            raise Refused(_UNAVAILABLE, f"decision log: {exc}") from None
        raise Refused(*error)

    async def _resent(self, session: Session, request: engine_pb2.StepRequest) -> engine_pb2.StepResponse:
        """The last numbered step sent again (its reply was lost on the way): the outcome it
        had, once its decisions are in the log; nothing is applied again."""
        kept: KeptStep = session.last_step
        if request.step_seq < kept.seq:
            raise Refused(
                Status.FAILED_PRECONDITION,
                f"step_seq: {request.step_seq} is below this session's last step ({kept.seq}): only the last "
                "step can be sent again, and a new step needs a higher number",
            )
        if request != kept.request:
            raise Refused(
                Status.INVALID_ARGUMENT,
                f"step_seq: {kept.seq} numbers another step, already applied: a new step needs a higher number",
            )
        if kept.committed is not None:
            await self._kept_committed(session, kept)
            kept.committed = kept.decisions = None  # in the log: a later resend need not look again
        if kept.error is not None:
            raise Refused(*kept.error)
        return kept.reply

    async def _kept_committed(self, session: Session, kept: KeptStep) -> None:
        """Returns once a kept step's decisions are in the log; Refused while they are not."""
        committed = kept.committed
        if not committed.done():
            try:
                await asyncio.shield(committed)
            except Exception:
                pass  # read below
        if committed.cancelled():  # (only the daemon stopping cancels it)
            raise Refused(_UNAVAILABLE, "decision log: the step's commit was cancelled")
        failure = committed.exception()
        if isinstance(failure, UnwrittenError):
            if self.core.log.write_unwritten():
                return
            if session.unanswered is None and kept.reply is not None and kept.decisions is not None:
                # The first call went (its deadline) before its write failed: it set
                # nothing. As it would have: the same ops, however numbered, get this
                # reply once written; another step sends the decisions on Events.
                session.unanswered = _unanswered(kept.request, kept.reply, kept.decisions, session.engine_id)
            raise Refused(
                _UNAVAILABLE,
                f"decision log: {failure}; this step was applied and its decisions wait to be written: "
                "send it again later",
            )
        if failure is not None:  # the log could not commit: promise nothing
            raise Refused(_UNAVAILABLE, f"decision log: {failure}")

    def _answer_again(self, session: Session, request: engine_pb2.StepRequest) -> engine_pb2.StepResponse | None:
        """The reply of the last step (applied, its decisions kept to be written), if this
        is that step sent again and they are in the log now; None if it is another step,
        to be served as usual. While they still wait: Refused (UNAVAILABLE).

        Another step, once they are written, means the engine moved on without the reply:
        its decisions go out on the Events stream instead (an engine that gave up on the
        step learns which of its requests hold blocks, and can finish or abort them)."""
        unanswered = session.unanswered
        decision_log = self.core.log
        if step_bytes(request) != unanswered.request:
            if decision_log.write_unwritten():
                session.unanswered = None  # this step will be applied
                for decision in unanswered.decisions:
                    session.push_event(decision)
            return None  # (else it is refused with nothing applied: the retry may still come)
        if not decision_log.write_unwritten():
            figures = decision_log.figures()
            raise Refused(
                _UNAVAILABLE,
                f"decision log: {figures.write_error}; this step was applied and its decisions wait to be "
                f"written ({figures.num_unwritten} decisions in all): send it again later",
            )
        session.unanswered = None
        return unanswered.reply


def _read_outcome(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()


def _unanswered(
    request: engine_pb2.StepRequest, reply: engine_pb2.StepResponse, decisions: list[Decision], engine_id: str
) -> UnansweredStep:
    return UnansweredStep(step_bytes(request), reply, tuple(d for d in decisions if d.engine_id == engine_id))


def _too_large(session: Session, kept: KeptStep | None, decisions: list[Decision], size: int) -> None:
    """gRPC would fail the send after the step was applied and logged, and the engine hear
    nothing of it (its retry: ALREADY_EXISTS). Its decisions go out on the Events stream
    instead, and the engine is told to send smaller steps."""
    mine = [d for d in decisions if d.engine_id == session.engine_id]
    for decision in mine:
        session.push_event(decision)
    too_large = (
        Status.RESOURCE_EXHAUSTED,
        f"this step was applied and logged, but its reply ({size} bytes) is past the {MAX_MESSAGE_BYTES} "
        f"byte limit: its {len(mine)} decisions go out on the Events stream instead (the oldest dropped "
        f"past {session.events.maxsize}); send smaller steps",
    )
    if kept is not None:
        kept.reply, kept.error = None, too_large
    raise Refused(*too_large)
