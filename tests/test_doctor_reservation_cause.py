"""The doctor's reservations cause: shared prefix blocks, and models whose groups are not all full attention."""

from __future__ import annotations

from kvbudget.cli import doctor, doctor_samples
from kvbudget.cli.doctor_samples import PlanView, PoolSample, Status
from kvbudget.v1 import common_pb2

# max_model_len 2048 in 16-token blocks: cdiv(2048, 16) = 128 blocks a request at most.
PLAN_2K = PlanView(num_blocks=2000, bytes_per_block=2 << 20, block_size=16, max_model_len=2048)


def _finding(sample: PoolSample) -> doctor_samples.Finding:
    (found,) = [f for f in doctor.diagnose([sample]).findings if f.check == "reservations"]
    assert found.status is Status.WARN
    return found


def _sample(*, held: int, reserved: int, running: int) -> PoolSample:
    return PoolSample(time_s=1000.0, policy="guaranteed", num_blocks=2000, free=2000 - held, held=held,
                      reserved=reserved, running=running, waiting=0, preemptions=0, admits=running, plan=PLAN_2K)


def test_requests_sharing_a_long_prompt_are_not_said_to_send_max_new_tokens() -> None:
    # A real daemon (llama-3.1-8b, --max-model-len 2048, guaranteed, prefix caching on): 20
    # requests with no max new tokens, each charged 128 blocks, sharing a 1,136-token prompt
    # (71 blocks: the first holds all 71, the 19 others hit 70 and hold 1 of their own).
    # held = 71 + 19 = 90; reserved = 20 x (128 - 71) = 1,140 (12.7x); committed 1,230 <=
    # 20 x 128 / 2 = 1,280, which the doctor read as "at most half at max_model_len" and named
    # the clients' max new tokens -- every one of the 20 is at max_model_len.
    # Bounds sharing cannot move: k x 128 <= 1,140 + 20 x 90 = 2,940 -> k <= 22; held 90 < 128:
    # k x (128 - 90) <= 1,140 -> k <= 30; so up to min(20, 22, 30) = 20 may be: not named.
    found = _finding(_sample(held=90, reserved=1140, running=20))
    assert found.data["cause"] == "unknown"
    assert found.summary == (
        "1140 blocks reserved for only 90 held (12.7x): reservations sized by the clients' max new tokens "
        "if the requests share no long prompt prefix (1230 blocks committed to 20 requests, 61.5 each; "
        "max_model_len 2048 takes cdiv(2048, 16) = 128; prefix blocks they share count once: up to 20 "
        "of them may be at max_model_len)"
    )


def test_max_new_tokens_still_named_when_sharing_could_not_explain_the_totals() -> None:
    # 20 requests holding 4 blocks each: held = 80, reserved = 20 x 60 = 1,200 (15.0x),
    # committed 1,280 = 20 x 128 / 2 (the committed total alone said max new tokens).
    # k x (128 - 80) <= 1,200 -> k <= 25; k x 128 <= 1,200 + 20 x 80 = 2,800 -> k <= 21: up to
    # 20, more than half: not provable, so "unknown" (sharing could hide max_model_len ones).
    assert _finding(_sample(held=80, reserved=1200, running=20)).data["cause"] == "unknown"
    # Few blocks held: 20 requests, 1 block each, held = 20, reserved = 20 x 39 = 780 (39.0x):
    # k x (128 - 20) <= 780 -> k <= 7; k x 128 <= 780 + 20 x 20 = 1,180 -> k <= 9; at most
    # 7 <= 20 / 2 at max_model_len, whatever they share: the clients' max new tokens.
    found = _finding(_sample(held=20, reserved=780, running=20))
    assert found.data["cause"] == "max_new_tokens"
    assert found.summary == (
        "780 blocks reserved for only 20 held (39.0x): reservations sized by the clients' max new tokens "
        "(800 blocks committed to 20 requests, 40 each; max_model_len 2048 takes cdiv(2048, 16) = 128)"
    )


def test_shared_prefix_from_a_real_controller_is_not_named_max_new_tokens() -> None:
    from kvbudget.daemon.wire import convert
    from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController
    from kvbudget.daemon.core.records import DecisionKind, RequestSpec
    from test_admission_support import SMALL_LAYOUTS

    # One full-attention group, 8-token blocks; max_model_len 256: cdiv(256, 8) = 32 blocks.
    plan = common_pb2.PoolPlan(block_size_tokens=8, num_blocks=400, max_model_len_tokens=256)
    config = AdmissionConfig(max_model_len=256, max_num_batched_tokens=256, watermark=0.0, policy="guaranteed")
    ctrl = AdmissionController(SMALL_LAYOUTS["full"], 400, config)
    hashes = tuple(range(1, 19))  # a 144-token prompt: 18 full blocks
    # No max new tokens: every request is charged max_model_len, 32 blocks.
    assert ctrl.submit(RequestSpec("a", 144, prefix_hashes=hashes), 0.0)[0].kind is DecisionKind.ADMIT
    ctrl.progress("a", 144, 0.0)  # its 18 blocks computed: cached, others hit them
    for i in range(19):
        assert ctrl.submit(RequestSpec(f"b{i}", 144, prefix_hashes=hashes), 0.0)[0].kind is DecisionKind.ADMIT
    ctrl.check_integrity()
    snapshot = convert.snapshot_to_proto(ctrl.snapshot(0.0), plan=plan)
    # a holds 18; each other hits 17 (the last prompt token is recomputed) and holds 1 more:
    # held 18 + 19 = 37, reserved 20 x (32 - 18) = 280; committed 317 <= 20 x 32 / 2 = 320.
    assert (snapshot.num_held_blocks, snapshot.num_reserved_blocks, snapshot.num_running) == (37, 280, 20)
    (found,) = [
        f for f in doctor.diagnose([doctor_samples.sample_from_snapshot(snapshot)]).findings
        if f.check == "reservations"
    ]
    assert found.status is Status.WARN
    # every one of the 20 is at max_model_len: max new tokens must not be named
    assert found.data["cause"] == "unknown"


def test_a_sliding_window_model_at_max_model_len_is_read_on_its_own_groups() -> None:
    # mistral-7b-v0.1: every layer sliding, W = 4096; max_model_len 32768, 8192 batched tokens.
    # A request at max_model_len commits cdiv(4096 - 1 + 8192, 16) + 1 = 768 + 1 = 769 blocks
    # (the window caps it), not cdiv(32768, 16) = 2048. Two requests sending no max new tokens:
    # 1,538 committed (142 held, 1,396 reserved) = 2 x 769, every one at max_model_len. Read
    # against 2048 a request, 1,538 <= 2 x 2048 / 2 and the doctor named max new tokens.
    from kvbudget.daemon.wire.convert import plan_to_proto
    from kvbudget.daemon.config.hf_config import load_model

    layout = load_model("mistral-7b-v0.1").layout
    plan = plan_to_proto(layout, 4000, max_model_len=32768, max_num_batched_tokens=8192)
    snapshot = common_pb2.Snapshot(num_blocks=4000, num_free_blocks=4000 - 142, num_held_blocks=142,
                                   num_reserved_blocks=1396, num_running=2, plan=plan,
                                   policy=common_pb2.POLICY_GUARANTEED)
    sample = doctor_samples.sample_from_snapshot(snapshot)
    assert sample.plan is not None and sample.plan.blocks_at_max_model_len == 769
    found = _finding(sample)
    assert found.data["cause"] == "max_model_len"
    assert "(1538 blocks committed to 2 requests, 769 each; max_model_len 32768 takes 769 in all its " \
           "KV-cache groups: clients send no max new tokens, or ones that reach it)" in found.summary

