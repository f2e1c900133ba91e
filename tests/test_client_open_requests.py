"""What EngineClient(resubmit=True) resubmits to a new session (kvbudget.client.resubmit):
the requests still open, as they stand, with the step that found the loss folded in."""

from __future__ import annotations

from kvbudget.client.messages import step_message
from kvbudget.client.resubmit import OpenRequests
from kvbudget.daemon.core.records import Decision, DecisionKind, Reason, RequestSpec


def decision(kind: DecisionKind, reason: Reason, request_id: str) -> Decision:
    return Decision(seq=1, time_s=0.0, kind=kind, reason=reason, request_id=request_id)


def submitted(step) -> list[tuple]:
    return [(s.request_id, s.prompt_tokens, s.max_new_tokens if s.HasField("max_new_tokens") else None)
            for s in step.submits]


def test_open_requests_are_resubmitted_with_their_progress_and_ended_ones_are_not() -> None:
    known = OpenRequests()
    known.sent(step_message("s", submits=[RequestSpec(f"r{i}", 100, 50) for i in range(6)]
                            + [RequestSpec("free", 100)]))
    known.sent(step_message("s", progress=[("r0", 130), ("free", 160)], finishes=["r1"]))
    known.heard([
        decision(DecisionKind.RELEASE, Reason.ABORTED, "r2"),  # ended by the daemon
        decision(DecisionKind.REJECT, Reason.DEADLINE, "r3"),  # refused for good
        decision(DecisionKind.REJECT, Reason.DRAINING, "r4"),  # the stop's: still the engine's
        decision(DecisionKind.EXPIRE, Reason.LEASE_EXPIRED, "r5"),  # taken back, still the engine's
    ])
    assert len(known) == 4
    failed = step_message("s", submits=[RequestSpec("new", 10, 5), RequestSpec("r5", 100, 40)],
                          grows=[("r4", 120)], progress=[("r4", 110)], aborts=["r0"])
    again = known.resubmission(failed)
    # r0 aborted by the failed step; r4: 110 computed, 50 - 10 left; "free": 160 computed,
    # no max_new_tokens (still up to max_model_len); r5 as the engine sent it again; then "new".
    assert submitted(again) == [("r4", 110, 40), ("free", 160, None), ("new", 10, 5), ("r5", 100, 40)]
    assert not again.grows and not again.progress and not again.HasField("admit_tokens")
    assert "r0" not in known and "r4" in known


def test_a_request_past_its_last_token_keeps_one_to_generate() -> None:
    known = OpenRequests()
    known.sent(step_message("s", submits=[RequestSpec("r0", 16, 4)]))
    known.sent(step_message("s", progress=[("r0", 21)]))  # 5 past the prompt, 4 allowed
    assert submitted(known.resubmission(step_message("s"))) == [("r0", 21, 1)]
