"""Step validation (`core.validation`, on the ops `server.step_request.read_step` reads)
against the rules stated plainly here (`reference_problem`, on the message, as the old
two-pass validator's slow half had them): on every step it refuses what they refuse, with
the same kind and message, in field order, and accepts what they accept; the ops it reads
are the plain reading (`plain_ops`). Hypothesis builds random steps from ids and numbers
chosen to sit on every edge of every rule; the gRPC statuses and field names themselves
are pinned in test_server_bad_input.py.

Standing state (guaranteed: each request reserves cdiv(min(prompt + max_new, 256), 16)
blocks of a 64-block pool):
  engine e1: "run-1".."run-4" running (prompt 40 + 24 = 64 tokens: 4 blocks each; each
             holds 40 slots), "wait" queued (200 + 600, capped at 256: 16 blocks > the 12 left)
  engine e2: "other" running (4 blocks), "fill-1", "fill-2" running (16 blocks each)
  4 x 4 + 4 + 2 x 16 = 52 reserved, 12 left.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController
from kvbudget.daemon.core.records import RequestSpec
from kvbudget.daemon.core.requests import Status
from kvbudget.daemon.core.spec import KV_DTYPES, AttentionSpec, group_layers
from kvbudget.daemon.core.records import MAX_TENANT_CHARS, OTHER_TENANTS, RESERVED_TENANT
from kvbudget.daemon.core.step import StepOps
from kvbudget.daemon.core.validation import MAX_ID_CHARS, MAX_OPS_PER_STEP, Problem, StepRejected, validate_step
from kvbudget.daemon.server.step_request import read_step
from kvbudget.daemon.wire.convert import submit_to_spec
from kvbudget.v1 import engine_pb2

B = 16


def controller() -> AdmissionController:
    layout = group_layers([AttentionSpec(B, 8, 128, KV_DTYPES["bf16"])])
    ctrl = AdmissionController(layout, 64, AdmissionConfig(max_model_len=256, policy="guaranteed"))
    for i in (1, 2, 3, 4):
        ctrl.submit(RequestSpec(f"run-{i}", 40, 24, engine_id="e1"), 0.0)
    ctrl.submit(RequestSpec("other", 40, 24, engine_id="e2"), 0.0)
    for i in (1, 2):
        ctrl.submit(RequestSpec(f"fill-{i}", 200, 600, engine_id="e2"), 0.0)
    ctrl.submit(RequestSpec("wait", 200, 600, engine_id="e1"), 0.0)
    run, wait = ctrl.find("run-3"), ctrl.find("wait")
    assert (run.status, run.num_tokens, run.max_len) == (Status.RUNNING, 40, 64)
    assert (wait.status, wait.max_len) == (Status.WAITING, 256)
    ctrl.check_integrity()
    return ctrl


CTRL = controller()  # read only: validation never changes the controller

IDS = st.sampled_from(["run-1", "run-3", "wait", "other", "new-1", "new-2", "", "x" * 257, "tab\there", "é"])
COUNTS = st.sampled_from([0, 1, 15, 16, 39, 40, 41, 64, 65, 2**32 - 1])
TENANTS = st.sampled_from(["", "t", "x" * 129, "new\nline"])
DEADLINES = st.sampled_from([0.0, 5.0, -1.0, -0.0, math.nan, math.inf, -math.inf])


@st.composite
def submits(draw) -> engine_pb2.Submit:
    prompt = draw(st.sampled_from([0, 1, 15, 16, 32, 300]))
    op = engine_pb2.Submit(
        request_id=draw(IDS),
        prompt_tokens=prompt,
        prefix_hashes=list(range(draw(st.integers(0, 3)))),
        priority=draw(st.integers(-2, 2)),
        tenant=draw(TENANTS),
        deadline_unix_s=draw(DEADLINES),
    )
    max_new = draw(st.sampled_from([None, 0, 1, 16]))
    if max_new is not None:
        op.max_new_tokens = max_new
    return op


STEPS = st.builds(
    engine_pb2.StepRequest,
    session_id=st.just("s"),
    finishes=st.lists(st.builds(engine_pb2.Finish, request_id=IDS), max_size=2),
    aborts=st.lists(st.builds(engine_pb2.Abort, request_id=IDS), max_size=2),
    progress=st.lists(st.builds(engine_pb2.Progress, request_id=IDS, num_computed_tokens=COUNTS), max_size=2),
    grows=st.lists(st.builds(engine_pb2.Grow, request_id=IDS, num_tokens=COUNTS), max_size=2),
    submits=st.lists(submits(), max_size=3),
)


DUPLICATE = object()  # the request id of another op of the same list

# (list, field, value): each puts one field of one op on a rule's edge ("*": any list).
FAULTS = [
    (None, None, None),  # no fault
    *[(name, "request_id", DUPLICATE) for name in ("finishes", "progress", "grows", "submits")],
    *[("*", "request_id", v) for v in ("", "x" * 257, "tab\there", "other", "zzz", "run-1", "run-3", "wait", "new-1")],
    ("submits", "prompt_tokens", 0),
    ("submits", "prompt_tokens", 16),  # 1 full block: fewer than the hashes it may carry
    ("submits", "max_new_tokens", 0),
    ("submits", "prefix_hashes", 3),  # added to 0-2: 32 tokens hold 2 full blocks
    *[("submits", "deadline_unix_s", v) for v in (math.nan, math.inf, -math.inf, -1.0, -0.0, 5.0)],
    *[("submits", "tenant", v) for v in ("x" * 128, "x" * 129, "new\nline", "t")],
    *[("progress", "num_computed_tokens", v) for v in (0, 39, 40, 41, 2**32 - 1)],
    *[("grows", "num_tokens", v) for v in (39, 40, 64, 65, 256, 257)],
]


@st.composite
def near_valid_steps(draw, fault: tuple) -> engine_pb2.StepRequest:
    """A step engine e1 may send, then `fault` (one of FAULTS) applied to one of its ops:
    random steps almost never get past their first op, these reach every rule."""
    target, field, value = fault

    def some(name: str, ops: list) -> list:
        if target == name:  # the list the fault is for has all its ops
            return ops
        return [op for op in ops if draw(st.booleans())]

    step = engine_pb2.StepRequest(
        session_id="s",
        finishes=some("finishes", [engine_pb2.Finish(request_id="run-1"), engine_pb2.Finish(request_id="run-4")]),
        aborts=some("aborts", [engine_pb2.Abort(request_id="run-2")]),
        progress=some("progress", [
            engine_pb2.Progress(request_id="run-3", num_computed_tokens=draw(st.sampled_from([0, 40]))),
            engine_pb2.Progress(request_id="wait", num_computed_tokens=0),
        ]),
        grows=some("grows", [
            engine_pb2.Grow(request_id="run-3", num_tokens=draw(st.sampled_from([40, 64]))),
            engine_pb2.Grow(request_id="wait", num_tokens=40),
        ]),
        submits=some("submits", [
            engine_pb2.Submit(request_id=f"new-{i}", prompt_tokens=32, prefix_hashes=[1, 2][: draw(st.integers(0, 2))])
            for i in (1, 2)
        ]),
    )
    for op in step.submits:
        if draw(st.booleans()):
            op.max_new_tokens = 16
    ops = [op for name in ("finishes", "aborts", "progress", "grows", "submits") if target in ("*", name)
           for op in getattr(step, name)]
    if ops:
        op = draw(st.sampled_from(ops))
        if value is DUPLICATE:
            if len(ops) > 1:
                op.request_id = ops[0].request_id if op is not ops[0] else ops[1].request_id
        elif field == "prefix_hashes":
            op.prefix_hashes.extend(range(value))
        else:
            setattr(op, field, value)
    return step


class Refusal(Exception):
    def __init__(self, kind: Problem, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.kind = kind


def _bad(field: str, message: str) -> Refusal:
    return Refusal(Problem.INVALID, field, message)


def _check_id(field: str, request_id: str) -> None:
    if not request_id:
        raise _bad(field, "required")
    if len(request_id) > MAX_ID_CHARS:
        raise _bad(field, f"at most {MAX_ID_CHARS} characters, got {len(request_id)}")
    if not request_id.isprintable():
        raise _bad(field, "must be printable text")


def _owned(field: str, request_id: str, engine_id: str):
    _check_id(field, request_id)
    live = CTRL.find(request_id)
    if live is None or live.spec.engine_id != engine_id:
        raise Refusal(Problem.NOT_OWNED, field, f"no live request {request_id!r} of this engine")
    return live


def _reference_ops(step: engine_pb2.StepRequest, engine_id: str) -> None:
    """The rules of the finishes, aborts, progress and grows, in field order."""
    ended: set[str] = set()  # finished or aborted in this step
    for name, ops in (("finishes", step.finishes), ("aborts", step.aborts)):
        for i, op in enumerate(ops):
            field = f"{name}[{i}].request_id"
            _owned(field, op.request_id, engine_id)
            if op.request_id in ended:
                raise _bad(field, f"{op.request_id!r} is finished or aborted twice in this step")
            ended.add(op.request_id)
    for name, ops, count in (("progress", step.progress, "num_computed_tokens"), ("grows", step.grows, "num_tokens")):
        seen: set[str] = set()
        for i, op in enumerate(ops):
            field = f"{name}[{i}]"
            live = _owned(f"{field}.request_id", op.request_id, engine_id)
            if op.request_id in ended or op.request_id in seen:
                raise _bad(f"{field}.request_id", f"{op.request_id!r} appears twice in this step")
            seen.add(op.request_id)
            n = getattr(op, count)
            if name == "grows" and n > live.max_len:
                raise _bad(f"{field}.{count}", f"{n} is past the request's maximum length {live.max_len} "
                                               "(prompt + max_new_tokens, capped at max_model_len)")
            if live.status is not Status.RUNNING:
                continue
            if name == "progress" and n > live.num_tokens:
                raise _bad(f"{field}.{count}", f"{n} exceeds the {live.num_tokens} slots the request holds")
            if name == "progress" and n < live.num_computed:
                raise _bad(f"{field}.{count}", f"{n} is below the {live.num_computed} already reported")
            if name == "grows" and n < live.num_tokens:
                raise _bad(f"{field}.{count}", f"{n} is below the {live.num_tokens} slots the request holds")


def _reference_submits(step: engine_pb2.StepRequest) -> None:
    seen: set[str] = set()
    for i, op in enumerate(step.submits):
        field = f"submits[{i}]"
        _check_id(f"{field}.request_id", op.request_id)
        if op.request_id in seen or CTRL.find(op.request_id) is not None:
            raise Refusal(Problem.DUPLICATE, f"{field}.request_id", f"request {op.request_id!r} already exists")
        seen.add(op.request_id)
        if op.prompt_tokens < 1:
            raise _bad(f"{field}.prompt_tokens", "must be at least 1")
        if op.HasField("max_new_tokens") and op.max_new_tokens < 1:
            raise _bad(f"{field}.max_new_tokens", "must be at least 1 when set")
        full_blocks = op.prompt_tokens // B
        if len(op.prefix_hashes) > full_blocks:
            raise _bad(f"{field}.prefix_hashes",
                       f"{len(op.prefix_hashes)} hashes but the prompt has only {full_blocks} full blocks")
        if op.tenant and (len(op.tenant) > MAX_TENANT_CHARS or not op.tenant.isprintable()):
            raise _bad(f"{field}.tenant", f"printable, at most {MAX_TENANT_CHARS} characters")
        if op.tenant == OTHER_TENANTS:
            raise _bad(f"{field}.tenant", RESERVED_TENANT)
        if not math.isfinite(op.deadline_unix_s) or op.deadline_unix_s < 0:
            raise _bad(f"{field}.deadline_unix_s", "must be a finite time >= 0 (0: none)")


def reference_problem(step: engine_pb2.StepRequest, engine_id: str) -> tuple[Problem, str] | None:
    """The rules, stated plainly on the message (each field read where a rule needs it):
    the first problem's (kind, message), or None."""
    total = len(step.submits) + len(step.grows) + len(step.progress) + len(step.finishes) + len(step.aborts)
    try:
        if total > MAX_OPS_PER_STEP:
            raise _bad("submits", f"at most {MAX_OPS_PER_STEP} operations per step, got {total}")
        _reference_ops(step, engine_id)
        _reference_submits(step)
    except Refusal as refusal:
        return refusal.kind, str(refusal)
    return None


def plain_ops(step: engine_pb2.StepRequest, engine_id: str, now: float) -> StepOps:
    """The ops of a step, read the plain way (what `read_step` returns)."""
    return StepOps(
        [op.request_id for op in step.finishes],
        [op.request_id for op in step.aborts],
        [(op.request_id, op.num_computed_tokens) for op in step.progress],
        [(op.request_id, op.num_tokens) for op in step.grows],
        [submit_to_spec(op, engine_id, now) for op in step.submits],
    )


def validate(step: engine_pb2.StepRequest, engine_id: str, now: float = 0.0) -> StepOps:
    """What the daemon does with a step: read it once, then validate the plain ops."""
    ops = read_step(step, engine_id, now)
    validate_step(ops, engine_id, CTRL.find, B)
    return ops


def problem_of(step: engine_pb2.StepRequest, engine_id: str) -> tuple[Problem, str] | None:
    try:
        ops = validate(step, engine_id, 3.5)
    except StepRejected as exc:
        return exc.kind, str(exc)
    assert ops == plain_ops(step, engine_id, 3.5)
    return None


@given(step=STEPS, engine_id=st.sampled_from(["e1", "e2"]))
def test_validation_refuses_what_the_rules_refuse_and_reads_the_plain_ops(step, engine_id) -> None:
    assert problem_of(step, engine_id) == reference_problem(step, engine_id)


@pytest.mark.parametrize("fault", FAULTS, ids=[f"{t}.{f}={v!r:.12}" for t, f, v in FAULTS])
@settings(max_examples=15)
@given(data=st.data())
def test_validation_agrees_with_the_rules_on_steps_one_fault_away(fault, data) -> None:
    step = data.draw(near_valid_steps(fault))
    assert problem_of(step, "e1") == reference_problem(step, "e1")


def test_a_typical_step_passes_and_each_rule_names_its_field() -> None:
    step = engine_pb2.StepRequest(
        finishes=[engine_pb2.Finish(request_id="run-1")],
        grows=[engine_pb2.Grow(request_id="wait", num_tokens=200)],  # waiting: no slot check
        submits=[engine_pb2.Submit(request_id="new-1", prompt_tokens=32, max_new_tokens=8, prefix_hashes=[1, 2])],
    )
    ops = validate(step, "e1", 7.0)
    assert ops.finishes == ["run-1"] and ops.aborts == [] and ops.progress == []
    assert ops.grows == [("wait", 200)]
    assert ops.submits == [
        RequestSpec("new-1", 32, 8, prefix_hashes=(1, 2), engine_id="e1", arrival_s=7.0)
    ]
    # prompt 32 = 2 full blocks of 16: a third hash cannot be right.
    step.submits[0].prefix_hashes.append(3)
    with pytest.raises(StepRejected) as info:
        validate(step, "e1")
    assert (info.value.kind, info.value.field) == (Problem.INVALID, "submits[0].prefix_hashes")
    # "run-3" holds 40 slots: progress to 41 is past them.
    bad = engine_pb2.StepRequest(progress=[engine_pb2.Progress(request_id="run-3", num_computed_tokens=41)])
    with pytest.raises(StepRejected) as info:
        validate(bad, "e1")
    assert str(info.value) == "progress[0].num_computed_tokens: 41 exceeds the 40 slots the request holds"
    # Another engine's request is not found, whatever the list.
    for field in ("finishes", "aborts"):
        op = engine_pb2.Finish(request_id="other") if field == "finishes" else engine_pb2.Abort(request_id="other")
        with pytest.raises(StepRejected) as info:
            validate(engine_pb2.StepRequest(**{field: [op]}), "e1")
        assert (info.value.kind, info.value.field) == (Problem.NOT_OWNED, f"{field}[0].request_id")


def test_too_many_ops_are_refused_before_any_is_read() -> None:
    step = engine_pb2.StepRequest(finishes=[engine_pb2.Finish(request_id="")] * (MAX_OPS_PER_STEP + 1))
    with pytest.raises(StepRejected) as info:
        read_step(step, "e1", 0.0)  # (were they read, the first would be refused: "required")
    assert str(info.value) == f"submits: at most {MAX_OPS_PER_STEP} operations per step, got {MAX_OPS_PER_STEP + 1}"


def test_the_tenant_name_the_snapshot_sums_the_rest_under_is_refused() -> None:
    # "(other)" stands for the tenants past the snapshot's list (and /metrics'): a tenant of
    # that name would be summed in with them, and its quota read as theirs.
    step = engine_pb2.StepRequest(submits=[engine_pb2.Submit(request_id="r", prompt_tokens=8, tenant="(other)")])
    with pytest.raises(StepRejected) as info:
        validate(step, "e1")
    assert info.value.kind == Problem.INVALID
    assert str(info.value).startswith("submits[0].tenant: '(other)' is reserved")
