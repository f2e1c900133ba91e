"""What an EngineClient built with `resubmit=True` knows of its engine's open requests, and
the step that submits them again to a new session (issue 30, point 5).

A daemon that restarted, or a lease that lapsed, leaves the engine with requests the new
session does not know. The client keeps each request it submitted until the engine
finishes or aborts it, or the daemon ends it for good (a release, a reject other than
`draining`), with the tokens the engine said it computed: a resubmission is a new request
of that many prompt tokens (its KV is recomputed or found through its prefix hashes).
Pure bookkeeping, no grpc. docs/engine-integration.md, "The daemon stopped or restarted".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kvbudget.daemon.core.records import Decision, DecisionKind, Reason
from kvbudget.v1 import engine_pb2


@dataclass(frozen=True)
class Resubmitted:
    """What the client did when it found its session gone: `reason` (the daemon's words),
    the session lost and the new one, the requests submitted again (oldest first) and the
    decisions the new daemon took for them and for the step that found the loss."""

    reason: str
    old_session_id: str
    session_id: str
    request_ids: tuple[str, ...]
    decisions: tuple[Decision, ...]


class OpenRequests:
    """Per request id, its Submit as first sent and the tokens computed last reported."""

    def __init__(self) -> None:
        self._submits: dict[str, engine_pb2.Submit] = {}
        self._computed: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._submits)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._submits

    def sent(self, request: engine_pb2.StepRequest) -> None:
        """A step the daemon applied: its submits open, its finishes and aborts end."""
        for submit in request.submits:
            self._submits[submit.request_id] = submit
        for op in request.progress:
            if op.request_id in self._submits:
                self._computed[op.request_id] = op.num_computed_tokens
        for op in (*request.finishes, *request.aborts):
            self._end(op.request_id)

    def heard(self, decisions: Iterable[Decision]) -> None:
        """Decisions the engine gets: a release, or a reject not caused by a stop, ends the
        request. An expire or a `draining` reject does not: the daemon took it back, the
        engine still has it, and it goes to the next session."""
        for decision in decisions:
            if decision.kind == DecisionKind.RELEASE or (
                decision.kind == DecisionKind.REJECT and decision.reason != Reason.DRAINING
            ):
                self._end(decision.request_id)

    def _end(self, request_id: str) -> None:
        self._submits.pop(request_id, None)
        self._computed.pop(request_id, None)

    def resubmission(self, failed: engine_pb2.StepRequest) -> engine_pb2.StepRequest:
        """One step for a new session: every open request, and the step that found the loss
        folded in (its submits new, its progress counted, its finishes and aborts ended,
        its grows dropped: a resubmitted request is admitted whole). No admit bound: these
        requests were running already."""
        self.sent(engine_pb2.StepRequest(progress=failed.progress, finishes=failed.finishes, aborts=failed.aborts))
        message = engine_pb2.StepRequest()
        sent_again = {submit.request_id for submit in failed.submits}  # the newest of those
        for request_id, submit in self._submits.items():
            if request_id in sent_again:
                continue
            message.submits.append(self._with_progress(submit, self._computed.get(request_id, 0)))
        message.submits.extend(failed.submits)
        return message

    @staticmethod
    def _with_progress(submit: engine_pb2.Submit, computed: int) -> engine_pb2.Submit:
        """The request as it stands: what it computed becomes its prompt, and what it may
        still generate shrinks by as much."""
        again = engine_pb2.Submit()
        again.CopyFrom(submit)
        extra = computed - submit.prompt_tokens
        if extra > 0:
            again.prompt_tokens = computed
            if submit.HasField("max_new_tokens"):
                again.max_new_tokens = max(1, submit.max_new_tokens - extra)
        return again
