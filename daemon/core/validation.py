"""The rules a step must pass before any of it is applied: all of them, or none applied.

One pass over plain data (`step.StepOps`), in field order; a field name
(`grows[2].num_tokens`) is built only for the first problem found. A problem is a
`StepRejected` with a kind, which the edge turns into a status. "Does not fit" is never
a problem here: that is a decision (REJECT, DENY, ...).
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from kvbudget.daemon.core.policies import contract_broken
from kvbudget.daemon.core.records import MAX_TENANT_CHARS, OTHER_TENANTS, RESERVED_TENANT
from kvbudget.daemon.core.requests import Status
from kvbudget.daemon.core.step import StepOps

MAX_ID_CHARS = 256
MAX_OPS_PER_STEP = 100_000
_RUNNING = Status.RUNNING  # enum member lookups are slow on Python 3.11
_INF = float("inf")

# The controller's `find`: a live request's state, or None.
Find = Callable[[str], "RequestState | None"]


class Problem(enum.Enum):
    INVALID = "invalid"  # a malformed value
    DUPLICATE = "duplicate"  # a request id that exists already
    NOT_OWNED = "not_owned"  # a request id this engine has no live request of


class StepRejected(Exception):
    """The first problem of a step (or of a call's id), naming its field."""

    def __init__(self, kind: Problem, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.kind = kind
        self.field = field


def _invalid(field: str, message: str) -> StepRejected:
    return StepRejected(Problem.INVALID, field, message)


def check_request_id(field: str, request_id: str) -> None:
    """An id (request, engine, replay) is 1 to MAX_ID_CHARS printable characters."""
    if 0 < len(request_id) <= MAX_ID_CHARS and request_id.isprintable():
        return
    if not request_id:
        raise _invalid(field, "required")
    if len(request_id) > MAX_ID_CHARS:
        raise _invalid(field, f"at most {MAX_ID_CHARS} characters, got {len(request_id)}")
    raise _invalid(field, "must be printable text")


def check_op_count(total: int) -> None:
    """A step carries at most MAX_OPS_PER_STEP ops (asked before they are read: reading costs)."""
    if total > MAX_OPS_PER_STEP:
        raise _invalid("submits", f"at most {MAX_OPS_PER_STEP} operations per step, got {total}")


def validate_step(ops: StepOps, engine_id: str, find: Find, block_size: int) -> None:
    """Raises StepRejected for the step's first problem, in field order; None: apply it.

    Each request id appears once among finishes, aborts, progress and grows (a progress
    report and a grow of one request in one step are allowed: report, then grow). A grow
    or progress of a waiting (preempted) request is not a problem: the controller answers
    DENY not_running and ignores the progress, as the engine may not know yet. A running
    guaranteed request may not grow more than F slots ahead of its computed tokens (this
    step's progress counts): the engine contract its reservation is sized for.
    """
    check_op_count(len(ops))
    ended: set[str] = set()  # finished or aborted in this step
    if ops.finishes:
        _check_ends("finishes", ops.finishes, ended, engine_id, find)
    if ops.aborts:
        _check_ends("aborts", ops.aborts, ended, engine_id, find)
    reported: dict[str, int] = {}  # computed tokens reported in this step, applied before grows
    if ops.progress:
        _check_progress(ops.progress, ended, reported, engine_id, find)
    if ops.grows:
        _check_grows(ops.grows, ended, reported, engine_id, find)
    if ops.submits:
        _check_submits(ops, find, block_size)


def _not_owned(name: str, i: int, request_id: str) -> StepRejected:
    """An id that names no live request of this engine: first asked its form (the rules'
    order). A live request's id passed check_request_id when it was submitted, so the form
    is asked only here, of an id that names none."""
    field = f"{name}[{i}].request_id"
    check_request_id(field, request_id)
    return StepRejected(Problem.NOT_OWNED, field, f"no live request {request_id!r} of this engine")


def _check_ends(name: str, ids: list[str], ended: set[str], engine_id: str, find: Find) -> None:
    for i, request_id in enumerate(ids):
        live = find(request_id)
        if live is None or live.spec.engine_id != engine_id:
            raise _not_owned(name, i, request_id)
        if request_id in ended:
            raise _invalid(f"{name}[{i}].request_id", f"{request_id!r} is finished or aborted twice in this step")
        ended.add(request_id)


def _check_progress(
    progress: list[tuple[str, int]], ended: set[str], reported: dict[str, int], engine_id: str, find: Find
) -> None:
    for i, (request_id, computed) in enumerate(progress):
        live = find(request_id)
        if live is None or live.spec.engine_id != engine_id:
            raise _not_owned("progress", i, request_id)
        if request_id in ended or request_id in reported:
            raise _invalid(f"progress[{i}].request_id", f"{request_id!r} appears twice in this step")
        reported[request_id] = computed
        if live.status is not _RUNNING or live.num_computed <= computed <= live.num_tokens:
            continue
        if computed > live.num_tokens:
            raise _invalid(f"progress[{i}].num_computed_tokens",
                           f"{computed} exceeds the {live.num_tokens} slots the request holds")
        raise _invalid(f"progress[{i}].num_computed_tokens",
                       f"{computed} is below the {live.num_computed} already reported")


def _check_grows(
    grows: list[tuple[str, int]], ended: set[str], reported: dict[str, int], engine_id: str, find: Find
) -> None:
    grown: set[str] = set()
    for i, (request_id, num_tokens) in enumerate(grows):
        live = find(request_id)
        if live is None or live.spec.engine_id != engine_id:
            raise _not_owned("grows", i, request_id)
        if request_id in ended or request_id in grown:
            raise _invalid(f"grows[{i}].request_id", f"{request_id!r} appears twice in this step")
        grown.add(request_id)
        if num_tokens > live.max_len:
            raise _invalid(
                f"grows[{i}].num_tokens",
                f"{num_tokens} is past the request's maximum length {live.max_len} "
                "(prompt + max_new_tokens, capped at max_model_len)",
            )
        if live.status is not _RUNNING:
            continue
        if num_tokens < live.num_tokens:
            raise _invalid(f"grows[{i}].num_tokens", f"{num_tokens} is below the {live.num_tokens} slots the request holds")
        # Guaranteed: its window groups' reservation covers slots at most F ahead of what is
        # computed (budget._worst_sliding); further is refused, so it is never denied instead.
        limit = live.ahead_limit
        if limit:
            computed = reported.get(request_id, live.num_computed)
            if num_tokens - computed > limit:
                raise _invalid(f"grows[{i}].num_tokens", contract_broken(num_tokens, computed, limit))


def _check_submits(ops: StepOps, find: Find, block_size: int) -> None:
    """A submit's max_new_tokens is None when not set (0: set to 0), its deadline None for 0."""
    seen: set[str] = set()
    for i, spec in enumerate(ops.submits):
        request_id = spec.request_id
        check_request_id(f"submits[{i}].request_id", request_id)
        if request_id in seen or find(request_id) is not None:
            raise StepRejected(Problem.DUPLICATE, f"submits[{i}].request_id", f"request {request_id!r} already exists")
        seen.add(request_id)
        prompt_tokens, max_new_tokens, tenant = spec.prompt_tokens, spec.max_new_tokens, spec.tenant
        if prompt_tokens < 1:
            raise _invalid(f"submits[{i}].prompt_tokens", "must be at least 1")
        if max_new_tokens is not None and max_new_tokens < 1:
            raise _invalid(f"submits[{i}].max_new_tokens", "must be at least 1 when set")
        if spec.prefix_hashes and len(spec.prefix_hashes) > prompt_tokens // block_size:
            raise _invalid(
                f"submits[{i}].prefix_hashes",
                f"{len(spec.prefix_hashes)} hashes but the prompt has only {prompt_tokens // block_size} full blocks",
            )
        if tenant and (len(tenant) > MAX_TENANT_CHARS or not tenant.isprintable()):
            raise _invalid(f"submits[{i}].tenant", f"printable, at most {MAX_TENANT_CHARS} characters")
        if tenant == OTHER_TENANTS:
            raise _invalid(f"submits[{i}].tenant", RESERVED_TENANT)
        deadline = spec.deadline_s
        if deadline is not None and not 0.0 <= deadline < _INF:  # (also refuses NaN)
            raise _invalid(f"submits[{i}].deadline_unix_s", "must be a finite time >= 0 (0: none)")
