"""Offline replay applies an engine step as the daemon's Step does (the core's apply_step),
so offline and live replays of one trace count the same decisions of each kind: a grow of
a request an earlier grow of the same step preempted is answered DENY not_running there."""

from __future__ import annotations

import pytest

from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController, AdmissionError
from kvbudget.daemon.core.records import RequestSpec
from kvbudget.daemon.core.step import StepOps, apply_step
from kvbudget.traces.replay import ControllerBackend

from test_admission_support import SMALL_LAYOUTS, kinds

FULL = SMALL_LAYOUTS["full"]  # one group, B = 8


def _two_running() -> AdmissionController:
    config = AdmissionConfig(max_model_len=64, max_num_batched_tokens=64, policy="optimistic", watermark=0.0)
    ctrl = AdmissionController(FULL, 4, config)
    for rid in ("a", "b"):  # 16 tokens = 2 blocks each: the pool is full
        ctrl.submit(RequestSpec(rid, 16, 16), 0.0)  # L 32: 4 blocks at worst
        ctrl.progress(rid, 16, 0.0)
    return ctrl


def test_offline_step_answers_a_grow_of_a_request_preempted_in_the_same_step_as_the_daemon():
    ops = StepOps(grows=[("a", 17), ("b", 17)])  # a's grow preempts b (the latest arrival)
    live = kinds(apply_step(_two_running(), ops, 1.0))
    assert live == [("preempt", "growth", "b"), ("grow", "fits", "a"), ("deny", "not_running", "b")]
    offline = kinds(ControllerBackend(_two_running()).step("e", ops, 1.0))
    assert offline == live


def test_an_op_the_controller_refuses_is_its_own_error_offline():
    # Offline nothing validates a step first: the controller's refusal reaches the caller
    # as the AdmissionError that names the field (the CLI prints it in one line).
    ctrl = _two_running()
    with pytest.raises(AdmissionError) as refused:
        ControllerBackend(ctrl).step("e", StepOps(finishes=["a"], grows=[("nope", 17)]), 1.0)
    assert refused.value.field == "request_id"
