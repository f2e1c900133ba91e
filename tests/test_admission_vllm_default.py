"""Optimistic admits as vLLM 0.33's scheduler does by default (issue 28, point 1): only
once the whole prompt fits (`scheduler_reserve_full_isl`), nothing in a step that
preempted, no more than the step can start, and the victim is the latest admitted.
`admit_on="first_chunk"` keeps the former admission on the first prefill chunk."""

from __future__ import annotations

from kvbudget.client import step_message
from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController
from kvbudget.daemon.core.records import DecisionKind, RequestSpec
from kvbudget.daemon.core.step import StepOps, apply_step
from kvbudget.daemon.server.step_request import read_step

from test_admission_support import SMALL_LAYOUTS, kinds

FULL = SMALL_LAYOUTS["full"]  # one group, B = 8


def make(num_blocks: int, **kw) -> AdmissionController:
    settings = {"max_model_len": 128, "max_num_batched_tokens": 16, "watermark": 0.0, "backfill_depth": 0, **kw}
    return AdmissionController(FULL, num_blocks, AdmissionConfig(**settings))


def test_a_prompt_waits_until_all_of_it_fits_and_then_gets_its_first_chunk() -> None:
    # 6 blocks; "a" holds 2. "b": 40 tokens = 5 blocks, its first chunk (F = 16) 2 blocks.
    ctrl = make(6)
    ctrl.submit(RequestSpec("a", 16, 8), 0.0)
    assert kinds(ctrl.submit(RequestSpec("b", 40, 8), 0.0)) == [("queue", "pool_full", "b")]
    [_, admit] = ctrl.finish("a", 1.0)
    assert (admit.kind, admit.request_id, admit.num_tokens, admit.blocks_held) == (DecisionKind.ADMIT, "b", 16, (2,))
    assert ctrl.request("b").base == [0]  # checked, not reserved
    ctrl.check_integrity()


def test_first_chunk_admission_stays_a_setting() -> None:
    ctrl = make(6, admit_on="first_chunk")
    ctrl.submit(RequestSpec("a", 16, 8), 0.0)
    [admit] = ctrl.submit(RequestSpec("b", 40, 8), 0.0)
    assert (admit.kind, admit.num_tokens, admit.blocks_held) == (DecisionKind.ADMIT, 16, (2,))


def test_a_preempted_request_comes_back_when_its_length_fits_and_reserves_nothing() -> None:
    ctrl = make(4)
    for rid in ("a", "b"):  # 2 blocks each: the pool is full
        ctrl.submit(RequestSpec(rid, 16, 16), 0.0)
        ctrl.progress(rid, 16, 0.0)
    assert kinds(ctrl.grow("a", 17, 1.0)) == [("preempt", "growth", "b"), ("grow", "fits", "a")]
    assert ctrl.request("b").resume_len == 16
    [_, admit] = ctrl.finish("a", 2.0)
    assert (admit.kind, admit.request_id, admit.num_tokens) == (DecisionKind.ADMIT, "b", 16)
    assert ctrl.request("b").base == [0]


def test_the_victim_is_the_latest_admitted_not_the_latest_arrival() -> None:
    # c (priority 1) is preempted, d (priority 1, arrived after c) admitted past it, then c
    # readmitted: c arrived before d but was admitted after it, so c is the victim.
    ctrl = make(7, backfill_depth=2)
    for rid, priority in (("a", 0), ("b", 0), ("c", 1)):
        ctrl.submit(RequestSpec(rid, 16, 40, priority=priority), 0.0)
        ctrl.progress(rid, 16, 0.0)
    assert kinds(ctrl.grow("a", 24, 1.0)) == [("grow", "fits", "a")]  # the 7th block
    assert kinds(ctrl.grow("a", 25, 1.0)) == [("preempt", "priority", "c"), ("grow", "fits", "a")]
    assert kinds(ctrl.submit(RequestSpec("d", 8, 8, priority=1), 2.0)) == [("admit", "fits", "d")]
    assert kinds(ctrl.finish("b", 3.0)) == [("release", "finished", "b"), ("admit", "fits", "c")]
    assert kinds(ctrl.grow("a", 33, 4.0)) == [("preempt", "priority", "c"), ("grow", "fits", "a")]
    ctrl.check_integrity()


def test_a_step_that_preempted_admits_nothing_and_its_submits_queue() -> None:
    ctrl = make(4, backfill_depth=2)
    for rid in ("a", "b"):  # 2 blocks each: the pool is full
        ctrl.submit(RequestSpec(rid, 16, 16), 0.0)
        ctrl.progress(rid, 16, 0.0)
    assert kinds(ctrl.submit(RequestSpec("c", 8, 8), 0.0)) == [("queue", "pool_full", "c")]
    # a's grow preempts b (2 blocks back, a takes 1): the block left would fit c or d, yet
    # nothing is admitted in this step.
    out = apply_step(ctrl, StepOps(grows=[("a", 17)], submits=[RequestSpec("d", 8, 8)]), 1.0)
    assert kinds(out) == [("preempt", "growth", "b"), ("grow", "fits", "a"), ("queue", "pool_full", "d")]
    # The next step's pass admits c past b (which needs 2 blocks), as backfill allows.
    assert kinds(apply_step(ctrl, StepOps(progress=[("a", 17)]), 2.0)) == [("admit", "fits", "c")]
    ctrl.check_integrity()


def test_a_pass_between_steps_leaves_to_the_next_step_what_the_last_one_deferred() -> None:
    # The daemon's tick (schedule outside a step) must not admit what a step that preempted
    # left waiting while requests run: the engine's next step admits it, so live and
    # offline replays decide alike whatever the tick's timing.
    ctrl = make(4, backfill_depth=2)
    for rid in ("a", "b"):
        ctrl.submit(RequestSpec(rid, 16, 16), 0.0)
        ctrl.progress(rid, 16, 0.0)
    ctrl.submit(RequestSpec("c", 8, 8), 0.0)
    apply_step(ctrl, StepOps(grows=[("a", 17)]), 1.0)  # preempts b; 1 block free, fits c
    assert ctrl.deferred and ctrl.schedule(1.5) == []
    assert kinds(apply_step(ctrl, StepOps(progress=[("a", 17)]), 2.0)) == [("admit", "fits", "c")]
    assert not ctrl.deferred
    # Into an idle pool a pass between steps admits (else a queue whose last running
    # request ended outside a step would wait for a step that never comes).
    idle = make(2)
    idle.submit(RequestSpec("a", 8, 8), 0.0)
    assert kinds(idle.submit(RequestSpec("b", 16, 0), 0.0)) == [("queue", "pool_full", "b")]
    idle.deferred = True
    assert kinds(idle.finish("a", 1.0)) == [("release", "finished", "a"), ("admit", "fits", "b")]


def test_a_step_admits_no_more_than_it_can_start() -> None:
    ctrl = make(20)
    ops = StepOps(submits=[RequestSpec("x", 40, 8), RequestSpec("y", 8, 8)], admit_tokens=10, admit_seqs=4)
    out = apply_step(ctrl, ops, 0.0)
    assert kinds(out) == [("admit", "fits", "x"), ("queue", "queue_ahead", "y")]
    assert out[0].num_tokens == 10  # the first chunk within the 10 tokens left
    # One sequence left: one admission.
    assert ctrl.deferred and ctrl.schedule(0.5) == []  # y waits for the next step
    out = apply_step(ctrl, StepOps(progress=[("x", 10)], admit_tokens=100, admit_seqs=1), 1.0)
    assert kinds(out) == [("admit", "fits", "y")]
    # The bound ends with the step: a submit outside one gets a whole first chunk (F = 16).
    [admit] = ctrl.submit(RequestSpec("z", 40, 8), 2.0)
    assert (admit.kind, admit.num_tokens) == (DecisionKind.ADMIT, 16)


def test_the_step_budget_crosses_the_wire() -> None:
    message = step_message("s", admit_tokens=-3, admit_seqs=7)
    ops = read_step(message, "e", 0.0)
    assert (ops.admit_tokens, ops.admit_seqs) == (0, 7)
    ops = read_step(step_message("s"), "e", 0.0)
    assert (ops.admit_tokens, ops.admit_seqs) == (None, None)
