"""Step validation: the fast screen (`_all_clear`) and the rules (`_first_problem`) agree.

`validate_step` trusts `_all_clear` to let a step through without running the rules, so
`_all_clear` must never pass a step the rules refuse; and it should pass every step the
rules accept, or the daemon pays for both passes. What it passes, it also reads out (the
ops `apply_step` applies): they must be what the plain reading (`read_ops`) gives. Hypothesis builds random steps from ids
and numbers chosen to sit on every edge of every rule; the gRPC statuses and field names
themselves are pinned in test_server_bad_input.py.

Standing state (guaranteed: each request reserves cdiv(min(prompt + max_new, 256), 16)
blocks of a 64-block pool):
  engine e1: "run-1".."run-4" running (prompt 40 + 24 = 64 tokens: 4 blocks each; each
             holds 40 slots), "wait" queued (200 + 600, capped at 256: 16 blocks > the 12 left)
  engine e2: "other" running (4 blocks), "fill-1", "fill-2" running (16 blocks each)
  4 x 4 + 4 + 2 x 16 = 52 reserved, 12 left.
"""

from __future__ import annotations

import math

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController
from kvbudget.daemon.core.records import RequestSpec
from kvbudget.daemon.core.requests import Status
from kvbudget.daemon.core.spec import KV_DTYPES, AttentionSpec, group_layers
from kvbudget.daemon.server.step_validation import StepRejected, _all_clear, _first_problem, read_ops, validate_step
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


def rules_accept(step: engine_pb2.StepRequest, engine_id: str) -> bool:
    try:
        _first_problem(step, engine_id, CTRL.find, B)
    except StepRejected:
        return False
    return True


@given(step=STEPS, engine_id=st.sampled_from(["e1", "e2"]))
def test_the_fast_screen_passes_exactly_what_the_rules_accept(step, engine_id) -> None:
    ops = _all_clear(step, engine_id, CTRL.find, B, 3.5)
    assert (ops is not None) == rules_accept(step, engine_id)
    if ops is not None:
        assert ops == read_ops(step, engine_id, 3.5)
        assert validate_step(step, engine_id, CTRL.find, B, 3.5) == ops


@pytest.mark.parametrize("fault", FAULTS, ids=[f"{t}.{f}={v!r:.12}" for t, f, v in FAULTS])
@settings(max_examples=15)
@given(data=st.data())
def test_the_fast_screen_agrees_on_steps_one_fault_away(fault, data) -> None:
    step = data.draw(near_valid_steps(fault))
    ops = _all_clear(step, "e1", CTRL.find, B, 3.5)
    assert (ops is not None) == rules_accept(step, "e1")
    if ops is not None:
        assert ops == read_ops(step, "e1", 3.5)


@given(step=st.sampled_from(FAULTS).flatmap(near_valid_steps))
def test_validate_step_raises_what_the_rules_raise(step) -> None:
    try:
        _first_problem(step, "e1", CTRL.find, B)
        expected = None
    except StepRejected as exc:
        expected = (exc.code, str(exc))
    try:
        validate_step(step, "e1", CTRL.find, B)
        got = None
    except StepRejected as exc:
        got = (exc.code, str(exc))
    assert got == expected


def test_a_typical_step_is_all_clear_and_each_rule_names_its_field() -> None:
    step = engine_pb2.StepRequest(
        finishes=[engine_pb2.Finish(request_id="run-1")],
        grows=[engine_pb2.Grow(request_id="wait", num_tokens=200)],  # waiting: no slot check
        submits=[engine_pb2.Submit(request_id="new-1", prompt_tokens=32, max_new_tokens=8, prefix_hashes=[1, 2])],
    )
    ops = _all_clear(step, "e1", CTRL.find, B, 7.0)
    assert ops is not None
    assert validate_step(step, "e1", CTRL.find, B, 7.0) == ops
    assert ops.finishes == ["run-1"] and ops.aborts == [] and ops.progress == []
    assert ops.grows == [("wait", 200)]
    assert ops.submits == [
        RequestSpec("new-1", 32, 8, prefix_hashes=(1, 2), engine_id="e1", arrival_s=7.0)
    ]
    # prompt 32 = 2 full blocks of 16: a third hash cannot be right.
    step.submits[0].prefix_hashes.append(3)
    assert _all_clear(step, "e1", CTRL.find, B) is None
    with pytest.raises(StepRejected) as info:
        validate_step(step, "e1", CTRL.find, B)
    assert (info.value.code, info.value.field) == (grpc.StatusCode.INVALID_ARGUMENT, "submits[0].prefix_hashes")
    # "run-3" holds 40 slots: progress to 41 is past them.
    bad = engine_pb2.StepRequest(progress=[engine_pb2.Progress(request_id="run-3", num_computed_tokens=41)])
    with pytest.raises(StepRejected) as info:
        validate_step(bad, "e1", CTRL.find, B)
    assert str(info.value) == "progress[0].num_computed_tokens: 41 exceeds the 40 slots the request holds"
    # Another engine's request is not found, whatever the list.
    for field in ("finishes", "aborts"):
        op = engine_pb2.Finish(request_id="other") if field == "finishes" else engine_pb2.Abort(request_id="other")
        with pytest.raises(StepRejected) as info:
            validate_step(engine_pb2.StepRequest(**{field: [op]}), "e1", CTRL.find, B)
        assert (info.value.code, info.value.field) == (grpc.StatusCode.NOT_FOUND, f"{field}[0].request_id")


def test_the_tenant_name_the_snapshot_sums_the_rest_under_is_refused() -> None:
    # "(other)" stands for the tenants past the snapshot's list (and /metrics'): a tenant of
    # that name would be summed in with them, and its quota read as theirs.
    from kvbudget.v1 import engine_pb2

    step = engine_pb2.StepRequest(submits=[engine_pb2.Submit(request_id="r", prompt_tokens=8, tenant="(other)")])
    with pytest.raises(StepRejected) as info:
        validate_step(step, "e1", CTRL.find, B)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert str(info.value).startswith("submits[0].tenant: '(other)' is reserved")
