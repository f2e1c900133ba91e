"""The routing answer is the queue pass's own decision: for random controller states, the
answer's admit_now, reason and final are exactly what a submit of that shape in the same
state gets (on a controller rebuilt by the same calls), and asking changes nothing that
any later decision could see (core/outlook.py, docs/routing.md)."""

from __future__ import annotations

from dataclasses import fields

from hypothesis import given, strategies as st

from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController
from kvbudget.daemon.core.outlook import Shape, outlook
from kvbudget.daemon.core.predictor import OutputLengthPredictor
from kvbudget.daemon.core.records import DecisionKind, RequestSpec
from kvbudget.daemon.core.requests import Status

from test_admission_support import SMALL_LAYOUTS, engine_step

TENANTS = ("a", "b", "c")
SETTINGS = st.fixed_dictionaries({
    "policy": st.sampled_from(["optimistic", "guaranteed", "predictive"]),
    "optimistic_peak": st.booleans(),
    "predictive_admission": st.sampled_from(["peak", "peak", "reserve"]),
    "backfill_depth": st.sampled_from([0, 1, 3, 16]),
    "max_head_wait_s": st.sampled_from([0.0, 0.0, 2.5]),
    "fair_share": st.booleans(),
    "max_queue_len": st.sampled_from([0, 0, 4]),
    "watermark": st.sampled_from([0.0, 0.1]),
    "admit_on": st.sampled_from(["whole_prompt", "first_chunk"]),
    "reject_over_quota": st.booleans(),
})  # fmt: skip
QUOTAS = st.dictionaries(st.sampled_from(TENANTS), st.sampled_from([0.25, 0.5, 0.75]), max_size=2)
LAYOUTS = st.sampled_from(["full", "full", "hybrid", "mla"])


def build(layout: str, settings: dict, quotas: dict, blocks: int) -> AdmissionController:
    config = AdmissionConfig(max_model_len=64, max_num_batched_tokens=16, **settings)
    ctrl = AdmissionController(SMALL_LAYOUTS[layout], blocks, config, predictor=OutputLengthPredictor(min_samples=2))
    for tenant, share in quotas.items():
        ctrl.set_tenant_quota(tenant, share)
    return ctrl


def states(ctrl: AdmissionController) -> list[tuple]:
    """Every field of every running and waiting request, in the queue's order."""
    return [tuple(getattr(r, f.name) for f in fields(r)) for r in ctrl.running_requests() + ctrl.waiting_requests()]


def spec_of(rid: str, shape: Shape) -> RequestSpec:
    return RequestSpec(rid, shape.prompt_tokens, shape.max_new_tokens, shape.prefix_hashes, shape.priority, shape.tenant)


@st.composite
def shapes(draw) -> Shape:
    prompt = draw(st.integers(1, 40))
    hashes = tuple(range(draw(st.integers(0, prompt // 8))))  # a prefix others may share
    return Shape(prompt, draw(st.one_of(st.none(), st.integers(0, 24))), draw(st.sampled_from(TENANTS)),
                 draw(st.sampled_from([0, 0, 0, -1, 1])), hashes)  # fmt: skip


def apply(ctrl: AdmissionController, op: tuple) -> list:
    name, args = op[0], op[1:]
    if name == "step":
        return engine_step(ctrl, *args)
    return getattr(ctrl, name)(*args)


def next_op(data, ctrl: AdmissionController, n: int, now: float) -> tuple:
    running = sorted(r.request_id for r in ctrl.running_requests())
    waiting = sorted(r.request_id for r in ctrl.waiting_requests())
    kind = data.draw(st.sampled_from(["submit", "submit", "step", "step", "step", "finish", "abort"]))
    if kind == "step" and running:
        rid = data.draw(st.sampled_from(running))
        r = ctrl.request(rid)
        return "step", rid, data.draw(st.integers(r.spec.prompt_tokens, r.max_len)), now
    if kind == "finish" and running:
        return "finish", data.draw(st.sampled_from(running)), now
    if kind == "abort" and waiting:
        return "abort", data.draw(st.sampled_from(waiting)), now
    return "submit", spec_of(f"r{n}", data.draw(shapes())), now


def submitted(ops: list, setup: tuple, shape: Shape, now: float) -> list:
    """What a submit of `shape` now gets on a controller rebuilt by the same calls."""
    twin = build(*setup)
    for op in ops:
        apply(twin, op)
    return twin.submit(spec_of("asked", shape), now)


@given(LAYOUTS, SETTINGS, QUOTAS, st.integers(12, 40), st.data())
def test_the_answer_is_what_a_submit_now_gets_and_asking_changes_nothing(layout, settings, quotas, blocks, data):
    setup = (layout, settings, quotas, blocks)
    asked, quiet = build(*setup), build(*setup)  # the same calls; only `asked` is asked
    ops: list[tuple] = []
    now = 0.0
    for n in range(data.draw(st.integers(4, 40))):
        now += data.draw(st.sampled_from([0.0, 0.0, 0.5, 2.0]))
        if data.draw(st.integers(0, 3)) == 0:
            shape = data.draw(shapes())
            answer = outlook(asked, shape, now)
            decisions = submitted(ops, setup, shape, now)
            first = decisions[0]
            admitted = [d for d in decisions if d.request_id == "asked" and d.kind is DecisionKind.ADMIT]
            assert answer.admit_now == bool(admitted), (answer, decisions)
            assert answer.reason == first.reason.value, (answer, decisions)
            assert answer.final == (first.kind is DecisionKind.REJECT)
            if answer.final:
                assert answer.detail == first.detail
            # Nothing a later decision reads moved: every request's state, every count.
            assert states(asked) == states(quiet)
            assert asked.snapshot(now) == quiet.snapshot(now)
        op = next_op(data, asked, n, now)
        ops.append(op)
        assert apply(asked, op) == apply(quiet, op)
    asked.check_integrity()
    for rid in [r.request_id for r in asked.running_requests()]:  # what runs ends the same, asked or not
        r = asked.find(rid)
        if r is not None and r.status is Status.RUNNING:  # (not preempted by the one before)
            assert engine_step(asked, rid, 64, now + 1) == engine_step(quiet, rid, 64, now + 1)
