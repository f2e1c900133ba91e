"""A StepRequest read once into plain ops (`core.step.StepOps`), for the core to validate and apply.

Each field of each op is read once: every read of a upb field builds a new object. A upb
repeated field has no __iter__ either (a for loop indexes it until IndexError, which costs
more than the loop's body); a slice is a plain list.
"""

from __future__ import annotations

from kvbudget.daemon.core.step import StepOps
from kvbudget.daemon.core.validation import Problem, StepRejected, check_op_count
from kvbudget.daemon.wire.convert import submit_to_spec
from kvbudget.v1 import engine_pb2


def read_step(
    step: engine_pb2.StepRequest, engine_id: str, now: float, max_ops: int | None = None,
) -> StepOps:
    """The step's ops, as sent (`core.validation` judges them); `now` is the submits' arrival.

    Raises StepRejected (too many ops: the core's cap, or `max_ops`, the daemon's
    server.max_ops_per_step) before reading any. The submits as
    `wire.convert.submit_to_spec` reads them."""
    finishes, aborts, progress, grows, submits = step.finishes, step.aborts, step.progress, step.grows, step.submits
    total = len(finishes) + len(aborts) + len(progress) + len(grows) + len(submits)
    check_op_count(total)
    if max_ops is not None and total > max_ops:  # (one step holds the event loop while it is applied)
        raise StepRejected(Problem.INVALID, "submits", f"at most {max_ops:,} operations per step "
                           f"(server.max_ops_per_step), got {total:,}: send them in smaller steps")
    return StepOps(
        [op.request_id for op in finishes[:]] if finishes else [],
        [op.request_id for op in aborts[:]] if aborts else [],
        [(op.request_id, op.num_computed_tokens) for op in progress[:]] if progress else [],
        [(op.request_id, op.num_tokens) for op in grows[:]] if grows else [],
        [submit_to_spec(op, engine_id, now) for op in submits[:]] if submits else [],
        step.admit_tokens if step.HasField("admit_tokens") else None,
        step.admit_seqs if step.HasField("admit_seqs") else None,
    )


def step_bytes(step: engine_pb2.StepRequest) -> bytes:
    """A step's ops as bytes, without its number: an engine told "send the same step again"
    may send the same ops under a new step_seq (EngineClient numbers every call)."""
    seq = step.step_seq
    if not seq:
        return step.SerializeToString(deterministic=True)
    step.step_seq = 0
    try:
        return step.SerializeToString(deterministic=True)
    finally:
        step.step_seq = seq
