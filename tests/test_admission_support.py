"""Small layouts and a toy engine shared by the admission tests (no tests here)."""

from __future__ import annotations

from kvbudget.daemon.core.admission import AdmissionController
from kvbudget.daemon.core.records import Decision, DecisionKind
from kvbudget.daemon.core.requests import Status
from kvbudget.daemon.core.spec import (
    KV_DTYPES,
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    KVCacheLayout,
    MambaSpec,
    MLASpec,
    SlidingWindowSpec,
    group_layers,
)

BF16 = KV_DTYPES["bf16"]
B = 8  # block size of the small test layouts


def full_spec(block_size: int = B) -> AttentionSpec:
    return AttentionSpec(block_size, 1, 8, BF16)


def sliding_spec(window: int, block_size: int = B) -> SlidingWindowSpec:
    return SlidingWindowSpec(block_size, 1, 8, BF16, sliding_window=window)


SMALL_LAYOUTS: dict[str, KVCacheLayout] = {
    "full": group_layers([full_spec(), full_spec()]),
    # two sliding groups and one full group (group_size 1)
    "hybrid": group_layers([sliding_spec(16), sliding_spec(16), full_spec()]),
    "chunked": group_layers([ChunkedLocalAttentionSpec(B, 1, 8, BF16, attention_chunk_size=16), full_spec()]),
    "mla": group_layers([MLASpec(B, 16, 8, BF16)]),
    "mamba": group_layers([MambaSpec(B, state_bytes=64, pages_per_request=1), full_spec()]),
}


def kinds(decisions: list[Decision]) -> list[tuple[str, str, str]]:
    return [(d.kind.value, d.reason.value, d.request_id) for d in decisions]


def engine_step(ctrl: AdmissionController, request_id: str, goal: int, now: float) -> list[Decision]:
    """One scheduler step of a toy engine for one running request.

    Computes every slot it holds, then finishes once it reached `goal` tokens, else asks
    for the next chunk: up to F prompt tokens (or recompute after a preemption), then one
    decode token — never more than F slots ahead of what is computed.
    """
    r = ctrl.request(request_id)
    assert r.status is Status.RUNNING
    decisions = ctrl.progress(request_id, r.num_tokens, now)
    if r.status is not Status.RUNNING:
        return decisions
    if r.num_tokens >= goal:
        return decisions + ctrl.finish(request_id, now)
    prefill_to = max(r.spec.prompt_tokens, r.resume_len)
    if r.num_tokens < prefill_to:
        target = min(prefill_to, r.num_tokens + ctrl.config.max_num_batched_tokens)
    else:
        target = r.num_tokens + 1
    return decisions + ctrl.grow(request_id, min(target, r.max_len, max(goal, r.num_tokens)), now)


def by_kind(decisions: list[Decision], kind: DecisionKind) -> list[Decision]:
    return [d for d in decisions if d.kind is kind]


def drain(machine, max_model_len: int) -> None:
    """A stateful machine's teardown: ticks and steps until nothing runs or waits (no
    deadlock, no livelock, nobody waits for ever), the integrity checked after each step.
    A running request needs at most `max_model_len` steps, so a long stretch without any
    request leaving means something loops. `machine` has ctrl, now, _observe, step_all."""
    ctrl = machine.ctrl
    last_progress, last_count = 0, -1
    for step in range(100_000):
        if not ctrl.num_running and not ctrl.num_waiting:
            break
        kinds = ctrl.snapshot(machine.now).decisions_by_kind
        count = kinds.get("release", 0) + kinds.get("reject", 0)
        if count != last_count:
            last_progress, last_count = step, count
        assert step - last_progress < 4 * max_model_len, "no request finished in a long while"
        machine.now += 1.0
        machine._observe(ctrl.schedule(machine.now))
        machine.step_all()
        ctrl.check_integrity()
    assert not ctrl.num_running and not ctrl.num_waiting, "requests never finished"
