"""Validation of a whole Step before any of it is applied.

A Step either passes every check here and is applied, or fails one and changes nothing.
Each failure names the offending field (`grows[2].num_tokens`) and carries the gRPC
status it deserves: INVALID_ARGUMENT for malformed values, ALREADY_EXISTS for a duplicate
request id, NOT_FOUND for an id this engine does not own. The request states come from
the controller itself (`Find`: its live `RequestState`s, read only), so validation and
application cannot disagree.

"Does not fit" is never an error: a prompt longer than max_model_len, a request larger
than the pool, a grow the pool cannot serve are all decisions (REJECT, DENY, ...).

Two passes, one set of rules. `_first_problem` is the rules, in field order, each check
naming its field. Every Step of every engine goes through here and almost none is wrong,
so `validate_step` first runs `_all_clear`: the same checks with no field names, no
indexes and each field read once (each read of a upb field builds an object), which
also reads the ops out into a `StepOps` for `apply_step`, so no field is read twice.
It must pass exactly what the rules accept: a step it passed wrongly would be applied,
one it failed wrongly costs both passes (the rules then have the last word). Tests
check the two agree on random steps one fault away from valid, and that the ops it
reads are the plain reading's (`read_ops`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import grpc

from kvbudget.daemon.wire.convert import submit_to_spec
from kvbudget.daemon.core.records import MAX_TENANT_CHARS, OTHER_TENANTS, RESERVED_TENANT, RequestSpec, new_request_spec
from kvbudget.daemon.core.requests import RequestState, Status
from kvbudget.v1 import engine_pb2

MAX_ID_CHARS = 256
MAX_OPS_PER_STEP = 100_000
_RUNNING = Status.RUNNING  # enum member lookups are slow on Python 3.11
_INF = math.inf


# The controller's `find`: a live request's state, or None.
Find = Callable[[str], "RequestState | None"]


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


class StepOps(NamedTuple):
    """A validated step, read out of its message once: what `CoreService.apply_step` applies.

    Request ids of the finishes and aborts, (request id, tokens) of the progress reports
    and grows, and the submits as the controller takes them."""

    finishes: list[str]
    aborts: list[str]
    progress: list[tuple[str, int]]  # (request_id, num_computed_tokens)
    grows: list[tuple[str, int]]  # (request_id, num_tokens)
    submits: list[RequestSpec]


def validate_step(
    step: engine_pb2.StepRequest, engine_id: str, find: Find, block_size: int, now: float = 0.0
) -> StepOps:
    """The step's ops, or StepRejected for the first problem, in field order.

    Ops run in the order finishes, aborts, progress, grows, submits, and each request id
    may appear once among finishes, aborts, progress and grows (once per list for
    progress + grows together is allowed: report progress, then grow). A grow or progress
    of a request that is waiting (preempted) is not an error: the controller answers a
    grow with DENY not_running and ignores the progress, as the engine may not know yet.
    `now` is the submits' arrival time.
    """
    ops = _all_clear(step, engine_id, find, block_size, now)
    if ops is None:
        _first_problem(step, engine_id, find, block_size)
        ops = read_ops(step, engine_id, now)  # the screen was over-cautious: the rules passed it
    return ops


def read_ops(step: engine_pb2.StepRequest, engine_id: str, now: float) -> StepOps:
    """The ops of a step the rules accept, read the plain way (what `_all_clear` returns)."""
    return StepOps(
        [op.request_id for op in step.finishes],
        [op.request_id for op in step.aborts],
        [(op.request_id, op.num_computed_tokens) for op in step.progress],
        [(op.request_id, op.num_tokens) for op in step.grows],
        [submit_to_spec(op, engine_id, now) for op in step.submits],
    )


def _all_clear(
    step: engine_pb2.StepRequest, engine_id: str, find: Find, block_size: int, now: float = 0.0
) -> StepOps | None:
    """The step's ops if `_first_problem` would find nothing; None: let it look.

    Each field of each op is read once, here, and handed on: every read of a upb field
    builds a new object, and a repeated field's wrapper costs about as much as a dict
    lookup. A upb repeated field has no __iter__ either: a for loop over one indexes it
    until IndexError, and that exception costs more than the loop's body. A slice is a
    plain list."""
    finishes, aborts, progress, grows, submits = step.finishes, step.aborts, step.progress, step.grows, step.submits
    if len(finishes) + len(aborts) + len(progress) + len(grows) + len(submits) > MAX_OPS_PER_STEP:
        return None
    # A found id is one of a live request, but the id check stays: it is a few string tests.
    ended: set[str] = set()  # ids of the finishes and aborts
    finished: list[str] = []
    aborted: list[str] = []
    for ops, ids in ((finishes, finished), (aborts, aborted)):
        if ops:
            for op in ops[:]:
                request_id = op.request_id
                live = find(request_id)
                if (
                    live is None
                    or live.spec.engine_id != engine_id
                    or request_id in ended
                    or not (len(request_id) <= MAX_ID_CHARS and request_id.isprintable())
                ):
                    return None
                ended.add(request_id)
                ids.append(request_id)
    reports: list[tuple[str, int]] = []
    if progress:
        reported: set[str] = set()
        for op in progress[:]:
            request_id = op.request_id
            live = find(request_id)
            if (
                live is None
                or live.spec.engine_id != engine_id
                or request_id in ended
                or request_id in reported
                or not (len(request_id) <= MAX_ID_CHARS and request_id.isprintable())
            ):
                return None
            reported.add(request_id)
            computed = op.num_computed_tokens
            if live.status is _RUNNING and not live.num_computed <= computed <= live.num_tokens:
                return None
            reports.append((request_id, computed))
    growths: list[tuple[str, int]] = []
    if grows:
        grown: set[str] = set()
        for op in grows[:]:
            request_id = op.request_id
            live = find(request_id)
            if (
                live is None
                or live.spec.engine_id != engine_id
                or request_id in ended
                or request_id in grown
                or not (len(request_id) <= MAX_ID_CHARS and request_id.isprintable())
            ):
                return None
            grown.add(request_id)
            num_tokens = op.num_tokens
            if num_tokens > live.max_len or (live.status is _RUNNING and num_tokens < live.num_tokens):
                return None
            growths.append((request_id, num_tokens))
    specs: list[RequestSpec] = []
    if submits:
        seen: set[str] = set()
        for op in submits[:]:
            request_id = op.request_id
            prompt_tokens = op.prompt_tokens
            max_new_tokens = op.max_new_tokens
            hashes = op.prefix_hashes
            tenant = op.tenant
            deadline = op.deadline_unix_s
            if (
                not 0 < len(request_id) <= MAX_ID_CHARS
                or request_id in seen
                or find(request_id) is not None
                or not request_id.isprintable()
                or prompt_tokens < 1
                or (max_new_tokens < 1 and op.HasField("max_new_tokens"))
                or len(hashes) > prompt_tokens // block_size
                or (tenant and (len(tenant) > MAX_TENANT_CHARS or not tenant.isprintable() or tenant == OTHER_TENANTS))
                or not 0.0 <= deadline < _INF  # also refuses NaN
            ):
                return None
            seen.add(request_id)
            # convert.submit_to_spec, with the fields already read: a set max_new_tokens
            # is at least 1 (checked above), so 0 means "not set".
            specs.append(
                new_request_spec(
                    request_id, prompt_tokens, max_new_tokens or None, tuple(hashes) if hashes else (),
                    op.priority, tenant, engine_id, deadline or None, now,
                )
            )
    return StepOps(finished, aborted, reports, growths, specs)


def _owned(field: str, request_id: str, engine_id: str, find: Find) -> RequestState:
    check_request_id(field, request_id)
    live = find(request_id)
    if live is None or live.spec.engine_id != engine_id:
        raise StepRejected(grpc.StatusCode.NOT_FOUND, field, f"no live request {request_id!r} of this engine")
    return live


def _first_problem(step: engine_pb2.StepRequest, engine_id: str, find: Find, block_size: int) -> None:
    """The rules: raises StepRejected naming the first offending field, in field order."""
    total = len(step.submits) + len(step.grows) + len(step.progress)
    total += len(step.finishes) + len(step.aborts)
    if total > MAX_OPS_PER_STEP:
        raise _invalid("submits", f"at most {MAX_OPS_PER_STEP} operations per step, got {total}")

    ended: set[str] = set()  # finished or aborted in this step
    for name, ops in (("finishes", step.finishes), ("aborts", step.aborts)):
        for i, op in enumerate(ops):
            field = f"{name}[{i}].request_id"
            _owned(field, op.request_id, engine_id, find)
            if op.request_id in ended:
                raise _invalid(field, f"{op.request_id!r} is finished or aborted twice in this step")
            ended.add(op.request_id)

    computed: set[str] = set()
    for i, op in enumerate(step.progress):
        field = f"progress[{i}]"
        live = _owned(f"{field}.request_id", op.request_id, engine_id, find)
        if op.request_id in ended or op.request_id in computed:
            raise _invalid(f"{field}.request_id", f"{op.request_id!r} appears twice in this step")
        computed.add(op.request_id)
        if live.status is not _RUNNING:
            continue
        if op.num_computed_tokens > live.num_tokens:
            raise _invalid(
                f"{field}.num_computed_tokens",
                f"{op.num_computed_tokens} exceeds the {live.num_tokens} slots the request holds",
            )
        if op.num_computed_tokens < live.num_computed:
            raise _invalid(
                f"{field}.num_computed_tokens",
                f"{op.num_computed_tokens} is below the {live.num_computed} already reported",
            )

    grown: set[str] = set()
    for i, op in enumerate(step.grows):
        field = f"grows[{i}]"
        live = _owned(f"{field}.request_id", op.request_id, engine_id, find)
        if op.request_id in ended or op.request_id in grown:
            raise _invalid(f"{field}.request_id", f"{op.request_id!r} appears twice in this step")
        grown.add(op.request_id)
        if op.num_tokens > live.max_len:
            raise _invalid(
                f"{field}.num_tokens",
                f"{op.num_tokens} is past the request's maximum length {live.max_len} "
                "(prompt + max_new_tokens, capped at max_model_len)",
            )
        if live.status is _RUNNING and op.num_tokens < live.num_tokens:
            raise _invalid(
                f"{field}.num_tokens",
                f"{op.num_tokens} is below the {live.num_tokens} slots the request holds",
            )

    seen: set[str] = set()
    for i, op in enumerate(step.submits):
        field = f"submits[{i}]"
        check_request_id(f"{field}.request_id", op.request_id)
        if op.request_id in seen or find(op.request_id) is not None:
            raise StepRejected(
                grpc.StatusCode.ALREADY_EXISTS, f"{field}.request_id", f"request {op.request_id!r} already exists"
            )
        seen.add(op.request_id)
        if op.prompt_tokens < 1:
            raise _invalid(f"{field}.prompt_tokens", "must be at least 1")
        if op.HasField("max_new_tokens") and op.max_new_tokens < 1:
            raise _invalid(f"{field}.max_new_tokens", "must be at least 1 when set")
        full_blocks = op.prompt_tokens // block_size
        if len(op.prefix_hashes) > full_blocks:
            raise _invalid(
                f"{field}.prefix_hashes",
                f"{len(op.prefix_hashes)} hashes but the prompt has only {full_blocks} full blocks",
            )
        if op.tenant and (len(op.tenant) > MAX_TENANT_CHARS or not op.tenant.isprintable()):
            raise _invalid(f"{field}.tenant", f"printable, at most {MAX_TENANT_CHARS} characters")
        if op.tenant == OTHER_TENANTS:
            raise _invalid(f"{field}.tenant", RESERVED_TENANT)
        if not math.isfinite(op.deadline_unix_s) or op.deadline_unix_s < 0:
            raise _invalid(f"{field}.deadline_unix_s", "must be a finite time >= 0 (0: none)")
