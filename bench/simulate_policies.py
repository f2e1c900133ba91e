"""Each admission policy on the same fixed synthetic trace, through a toy engine loop.

    python bench/simulate_policies.py [--requests 400] [--seed 7] [--num-blocks 12000]

The model is Gemma-3-like (5 sliding-window groups, W = 1024, and 1 full group, B = 16).
The trace (seeded, so every run prints the same figures): Poisson arrivals, prompts of
200-3000 tokens, `max_new_tokens` 1024 for everyone (a loose cap, as clients send) while
real outputs are mostly short (exponential, mean 200). The engine, per step, computes every
slot a running request holds, finishes it at its real length, else asks for the next
prefill chunk (up to F tokens) or one decode token. A preempted request recomputes.

Printed per policy: running requests per step (mean and peak), preemptions, queue wait in
steps (mean, p95), steps until the trace drained, mean pool usage.
"""

from __future__ import annotations

import argparse
import random
import statistics
from dataclasses import dataclass

from kvbudget.daemon.core.admission import POLICIES, AdmissionConfig, AdmissionController
from kvbudget.daemon.core.records import Decision, DecisionKind, RequestSpec
from kvbudget.daemon.core.requests import Status
from kvbudget.daemon.core.spec import KV_DTYPES, AttentionSpec, SlidingWindowSpec, group_layers

F = 512  # max_num_batched_tokens
MAX_MODEL_LEN = 8192


@dataclass(frozen=True)
class TraceRequest:
    request_id: str
    arrival_step: int
    prompt: int
    max_new: int
    output: int  # what the model really generates


def make_trace(n: int, seed: int) -> list[TraceRequest]:
    rng = random.Random(seed)
    step, trace = 0, []
    for i in range(n):
        step += int(rng.expovariate(1 / 8))  # one arrival every 8 steps on average
        prompt = rng.randint(200, 3000)
        output = min(1024, 1 + int(rng.expovariate(1 / 200)))
        trace.append(TraceRequest(f"r{i}", step, prompt, 1024, output))
    return trace


def gemma3_like():
    bf16 = KV_DTYPES["bf16"]
    sliding = SlidingWindowSpec(16, 8, 128, bf16, sliding_window=1024)
    full = AttentionSpec(16, 8, 128, bf16)
    return group_layers(([sliding] * 5 + [full]) * 2, model_name="gemma3-like")


@dataclass
class Result:
    policy: str
    mean_running: float
    peak_running: int
    preemptions: int
    mean_wait: float
    p95_wait: float
    steps: int
    mean_usage: float
    finished: int


def simulate(policy: str, trace: list[TraceRequest], num_blocks: int) -> Result:
    config = AdmissionConfig(max_model_len=MAX_MODEL_LEN, max_num_batched_tokens=F, policy=policy)
    ctrl = AdmissionController(gemma3_like(), num_blocks, config)
    goal = {t.request_id: t.prompt + t.output for t in trace}
    arrived: dict[str, int] = {}
    waits: list[int] = []
    running_samples: list[int] = []
    usage_samples: list[float] = []
    preemptions = finished = 0
    pending = list(reversed(trace))
    step = 0

    def observe(decisions: list[Decision]) -> None:
        nonlocal preemptions, finished
        for d in decisions:
            if d.kind is DecisionKind.ADMIT and d.request_id in arrived:
                waits.append(step - arrived.pop(d.request_id))  # first admission only
            elif d.kind is DecisionKind.PREEMPT:
                preemptions += 1
            elif d.kind is DecisionKind.RELEASE:
                finished += 1

    while pending or ctrl.num_running or ctrl.num_waiting:
        while pending and pending[-1].arrival_step <= step:
            t = pending.pop()
            arrived[t.request_id] = step
            observe(ctrl.submit(RequestSpec(t.request_id, t.prompt, t.max_new, arrival_s=step), step))
        for r in sorted(ctrl.running_requests(), key=lambda r: r.order):
            if r.status is not Status.RUNNING:
                continue  # preempted earlier in this step
            rid = r.request_id
            observe(ctrl.progress(rid, r.num_tokens, step))
            if r.status is not Status.RUNNING:
                continue
            if r.num_tokens >= goal[rid]:
                observe(ctrl.finish(rid, step))
                continue
            prefill_to = max(r.spec.prompt_tokens, r.resume_len)
            step_to = r.num_tokens + (F if r.num_tokens < prefill_to else 1)
            target = min(prefill_to if r.num_tokens < prefill_to else goal[rid], step_to)
            observe(ctrl.grow(rid, target, step))
        running_samples.append(ctrl.num_running)
        usage_samples.append(ctrl.pool.usage())
        step += 1
    ctrl.check_integrity()
    waits.sort()
    return Result(
        policy,
        statistics.fmean(running_samples),
        max(running_samples),
        preemptions,
        statistics.fmean(waits),
        waits[int(0.95 * (len(waits) - 1))],
        step,
        statistics.fmean(usage_samples),
        finished,
    )


DEFAULT_REQUESTS, DEFAULT_SEED, DEFAULT_NUM_BLOCKS = 400, 7, 12000


def simulate_policies(
    policies: tuple[str, ...] = POLICIES,
    requests: int = DEFAULT_REQUESTS,
    seed: int = DEFAULT_SEED,
    num_blocks: int = DEFAULT_NUM_BLOCKS,
) -> dict[str, Result]:
    """Each policy on the same seeded trace: policy name -> its figures (what `main` prints)."""
    trace = make_trace(requests, seed)
    return {policy: simulate(policy, trace, num_blocks) for policy in policies}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=DEFAULT_REQUESTS)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--num-blocks", type=int, default=DEFAULT_NUM_BLOCKS)
    args = parser.parse_args()
    trace = make_trace(args.requests, args.seed)
    print(f"{args.requests} requests, seed {args.seed}, {args.num_blocks} blocks, F={F}, "
          f"mean output {statistics.fmean(t.output for t in trace):.0f} of max 1024")
    header = f"{'policy':<11} {'running':>8} {'peak':>5} {'preempt':>8} {'wait':>7} {'p95':>6} {'steps':>6} {'usage':>6}"
    print(header)
    for r in simulate_policies(POLICIES, args.requests, args.seed, args.num_blocks).values():
        assert r.finished == args.requests, f"{r.policy}: {r.finished} finished"
        print(f"{r.policy:<11} {r.mean_running:>8.1f} {r.peak_running:>5} {r.preemptions:>8} "
              f"{r.mean_wait:>7.1f} {r.p95_wait:>6} {r.steps:>6} {r.mean_usage:>6.1%}")


if __name__ == "__main__":
    main()
