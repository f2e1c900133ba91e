"""Validation of a whole Step before any of it is applied.

A Step either passes every check here and is applied, or fails one and changes nothing.
Each failure names the offending field (`grows[2].num_tokens`) and carries the gRPC
status it deserves: INVALID_ARGUMENT for malformed values, ALREADY_EXISTS for a duplicate
request id, NOT_FOUND for an id this engine does not own. The request states come from
the controller itself (`Lookup`), so validation and application cannot disagree.

"Does not fit" is never an error: a prompt longer than max_model_len, a request larger
than the pool, a grow the pool cannot serve are all decisions (REJECT, DENY, ...).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import grpc

from kvbudget.v1 import engine_pb2

MAX_ID_CHARS = 256
MAX_TENANT_CHARS = 128
MAX_OPS_PER_STEP = 100_000


class RequestView(NamedTuple):
    """What validation needs to know of one live request (read from the controller).

    A NamedTuple, not a frozen dataclass: one is built per op of every step, and a tuple
    is built several times faster; it is just as immutable."""

    engine_id: str
    running: bool
    num_tokens: int
    num_computed: int
    max_len: int  # prompt + max new tokens, capped at max_model_len


Lookup = Callable[[str], "RequestView | None"]


class StepRejected(Exception):
    def __init__(self, code: grpc.StatusCode, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.code = code
        self.field = field


def _invalid(field: str, message: str) -> StepRejected:
    return StepRejected(grpc.StatusCode.INVALID_ARGUMENT, field, message)


def check_request_id(field: str, request_id: str) -> None:
    if not request_id:
        raise _invalid(field, "required")
    if len(request_id) > MAX_ID_CHARS:
        raise _invalid(field, f"at most {MAX_ID_CHARS} characters, got {len(request_id)}")
    if not request_id.isprintable():
        raise _invalid(field, "must be printable text")


def _plain_id(request_id: str) -> bool:
    """What check_request_id accepts, without building a field name (the fast path)."""
    return 0 < len(request_id) <= MAX_ID_CHARS and request_id.isprintable()


def _progress_error(field: str, num_computed_tokens: int, live: RequestView) -> None:
    if num_computed_tokens > live.num_tokens:
        raise _invalid(
            f"{field}.num_computed_tokens",
            f"{num_computed_tokens} exceeds the {live.num_tokens} slots the request holds",
        )
    raise _invalid(
        f"{field}.num_computed_tokens",
        f"{num_computed_tokens} is below the {live.num_computed} already reported",
    )


def validate_step(step: engine_pb2.StepRequest, engine_id: str, lookup: Lookup, block_size: int) -> None:
    """Raises StepRejected for the first problem, in field order; returns None if all is well.

    Ops run in the order finishes, aborts, progress, grows, submits, and each request id
    may appear once among finishes, aborts, progress and grows (once per list for
    progress + grows together is allowed: report progress, then grow). A grow or progress
    of a request that is waiting (preempted) is not an error: the controller answers a
    grow with DENY not_running and ignores the progress, as the engine may not know yet.
    """
    total = len(step.submits) + len(step.grows) + len(step.progress)
    total += len(step.finishes) + len(step.aborts)
    if total > MAX_OPS_PER_STEP:
        raise _invalid("submits", f"at most {MAX_OPS_PER_STEP} operations per step, got {total}")

    def owned_request(field: str, request_id: str) -> RequestView:
        check_request_id(field, request_id)
        live = lookup(request_id)
        if live is None or live.engine_id != engine_id:
            raise StepRejected(
                grpc.StatusCode.NOT_FOUND, field, f"no live request {request_id!r} of this engine"
            )
        return live

    # Field names ("finishes[3].request_id") are formatted only on the way to an error:
    # a step may carry thousands of ops and the common case has none.
    ended: set[str] = set()  # finished or aborted in this step
    for name, ops in (("finishes", step.finishes), ("aborts", step.aborts)):
        for i, op in enumerate(ops):
            request_id = op.request_id
            live = lookup(request_id) if _plain_id(request_id) else None
            if live is None or live.engine_id != engine_id:
                owned_request(f"{name}[{i}].request_id", request_id)  # raises, naming the field
            if request_id in ended:
                raise _invalid(f"{name}[{i}].request_id", f"{request_id!r} is finished or aborted twice in this step")
            ended.add(request_id)

    computed: dict[str, int] = {}
    for i, op in enumerate(step.progress):
        request_id = op.request_id
        live = lookup(request_id) if _plain_id(request_id) else None
        if live is None or live.engine_id != engine_id:
            live = owned_request(f"progress[{i}].request_id", request_id)  # raises, naming the field
        if request_id in ended or request_id in computed:
            raise _invalid(f"progress[{i}].request_id", f"{request_id!r} appears twice in this step")
        computed[request_id] = op.num_computed_tokens
        if not live.running:
            continue
        if not live.num_computed <= op.num_computed_tokens <= live.num_tokens:
            _progress_error(f"progress[{i}]", op.num_computed_tokens, live)

    grown: set[str] = set()
    for i, op in enumerate(step.grows):
        request_id = op.request_id
        live = lookup(request_id) if _plain_id(request_id) else None
        if live is None or live.engine_id != engine_id:
            live = owned_request(f"grows[{i}].request_id", request_id)  # raises, naming the field
        if request_id in ended or request_id in grown:
            raise _invalid(f"grows[{i}].request_id", f"{request_id!r} appears twice in this step")
        grown.add(request_id)
        if op.num_tokens > live.max_len:
            raise _invalid(
                f"grows[{i}].num_tokens",
                f"{op.num_tokens} is past the request's maximum length {live.max_len} "
                "(prompt + max_new_tokens, capped at max_model_len)",
            )
        if live.running and op.num_tokens < live.num_tokens:
            raise _invalid(
                f"grows[{i}].num_tokens",
                f"{op.num_tokens} is below the {live.num_tokens} slots the request holds",
            )

    seen: set[str] = set()
    for i, op in enumerate(step.submits):
        request_id = op.request_id
        if not _plain_id(request_id):
            check_request_id(f"submits[{i}].request_id", request_id)  # raises, naming the field
        if request_id in seen or lookup(request_id) is not None:
            raise StepRejected(
                grpc.StatusCode.ALREADY_EXISTS,
                f"submits[{i}].request_id",
                f"request {request_id!r} already exists",
            )
        seen.add(request_id)
        if op.prompt_tokens < 1:
            raise _invalid(f"submits[{i}].prompt_tokens", "must be at least 1")
        if op.HasField("max_new_tokens") and op.max_new_tokens < 1:
            raise _invalid(f"submits[{i}].max_new_tokens", "must be at least 1 when set")
        full_blocks = op.prompt_tokens // block_size
        if len(op.prefix_hashes) > full_blocks:
            raise _invalid(
                f"submits[{i}].prefix_hashes",
                f"{len(op.prefix_hashes)} hashes but the prompt has only {full_blocks} full blocks",
            )
        tenant = op.tenant
        if tenant and (len(tenant) > MAX_TENANT_CHARS or not tenant.isprintable()):
            raise _invalid(f"submits[{i}].tenant", f"printable, at most {MAX_TENANT_CHARS} characters")
        if not math.isfinite(op.deadline_unix_s) or op.deadline_unix_s < 0:
            raise _invalid(f"submits[{i}].deadline_unix_s", "must be a finite time >= 0 (0: none)")
