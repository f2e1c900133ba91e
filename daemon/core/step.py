"""One engine step applied to the admission controller: the one place its order is written.

The daemon's Step RPC, the offline replayer and any engine adapter call `apply_step`, so
they count the same decisions. Order: finishes, aborts, progress, grows, then the queue,
then the submits (docs/architecture.md, "One request's path").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvbudget.daemon.core.admission import AdmissionError
from kvbudget.daemon.core.records import Decision, RequestSpec

if TYPE_CHECKING:
    from kvbudget.daemon.core.admission import AdmissionController


@dataclass(slots=True)
class StepOps:
    """One engine step's asks, as one `Step` call carries them, in the order applied."""

    finishes: list[str] = field(default_factory=list)
    aborts: list[str] = field(default_factory=list)
    progress: list[tuple[str, int]] = field(default_factory=list)  # (request id, computed tokens)
    grows: list[tuple[str, int]] = field(default_factory=list)  # (request id, total tokens)
    submits: list[RequestSpec] = field(default_factory=list)
    # What the engine can still start this step once its running requests are scheduled
    # (tokens of its token budget, sequences): the step admits no more than that, and
    # allocates an admitted request's first chunk within it. None: no bound.
    admit_tokens: int | None = None
    admit_seqs: int | None = None

    def __bool__(self) -> bool:
        return bool(self.finishes or self.aborts or self.progress or self.grows or self.submits)

    def __len__(self) -> int:
        return len(self.finishes) + len(self.aborts) + len(self.progress) + len(self.grows) + len(self.submits)


class BrokenStep(Exception):
    """The controller refused an op of a step that validation passed: a broken invariant.

    `decisions` are those the ops before it made. They stand (the pool has them), so the
    caller logs them, then reports the step as an internal error."""

    def __init__(self, error: AdmissionError, op: str, decisions: list[Decision]) -> None:
        super().__init__(f"{op}: {error}")
        self.op = op
        self.decisions = decisions


def apply_step(controller: AdmissionController, ops: StepOps, now: float) -> list[Decision]:
    """Applies a validated step and returns every decision it caused, any engine's.

    Freeing first lets this step's own submits use the blocks. Queued requests are tried
    once the running requests' ops are in, before the submits (the queue is held meanwhile:
    `hold_queue`). As vLLM's scheduler, a step whose grows preempted admits nothing (its
    submits queue), and a step admits no more than its `admit_tokens` / `admit_seqs` can
    start; what it leaves waits for the next step (`deferred`: a tick between steps admits
    only into an idle pool). An op meets the requests as the engine last heard of them, but
    for those an earlier op of the step preempted: a grow of a waiting request is answered
    DENY not_running, its progress is ignored, and a finish ends it in the queue."""
    c = controller
    c.deferred = False
    decisions: list[Decision] = []
    held = bool(ops.finishes or ops.aborts or ops.progress or ops.grows)
    if held:
        c.hold_queue()
    bounded = ops.admit_tokens is not None or ops.admit_seqs is not None
    if bounded:
        c.set_step_budget(ops.admit_tokens, ops.admit_seqs)
    admit, name, i = True, "", 0  # (name, i: the op being applied, named only if it fails)
    try:
        if ops.finishes:
            name, finish = "finishes", c.finish
            for i, request_id in enumerate(ops.finishes):
                decisions += finish(request_id, now)
        if ops.aborts:
            name = "aborts"
            for i, request_id in enumerate(ops.aborts):
                decisions += c.abort(request_id, now)
        if ops.progress:
            name = "progress"
            for i, (request_id, num_computed) in enumerate(ops.progress):
                decisions += c.progress(request_id, num_computed, now)
        if ops.grows:
            name = "grows"
            for i, (request_id, num_tokens) in enumerate(ops.grows):
                decisions += c.grow(request_id, num_tokens, now)
        if held:
            held, admit = False, not c.preempted_while_held
            if admit:
                decisions += c.release_queue(now)
            else:  # the step preempted: the hold ends without a pass (the next one makes it)
                c.hold_queue(False)
        if ops.submits:
            name, submit = "submits", c.submit
            for i, spec in enumerate(ops.submits):
                decisions += submit(spec, now, admit)
        c.deferred = not admit or c.step_budget_spent()
    except AdmissionError as exc:
        if held:  # what was applied stands, and so does what it made room for
            decisions += c.release_queue(now)
        raise BrokenStep(exc, f"{name}[{i}].{exc.field}", decisions) from exc
    except BaseException:
        c.hold_queue(False)  # never leave the queue held (a bug); the next tick admits
        raise
    finally:
        if bounded:
            c.set_step_budget(None, None)
    return decisions
