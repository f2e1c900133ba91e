"""What the KVBudget daemon costs vLLM: the time kvbudget.vllm.Scheduler adds to each
`schedule()` call, beside vLLM's own `schedule()` time and a bare gRPC round trip to the
same daemon, in one run; and the decisions per second that pass through the adapter.

vLLM's real v1 scheduler on CPU with no model (the project's test driver fabricates the
outputs), the Azure trace's first N rows, a real daemon process on a unix socket. Needs
vLLM 0.33 (./dev test-vllm's venv):

    .venv-vllm/bin/python bench/bench_vllm_adapter.py --rows 500

Added time = the adapter's work around vLLM's schedule() (building the step, the Step RPC,
enacting the decisions, the accounting check), timed per call; its own = the same less the
Step call (the link's step: the RPC, the message built and the reply read); vLLM's own = plain vLLM's
Scheduler on the same rows (its schedule() alone). The adapter runs twice, each time with
a daemon of its own: `loop_thread` sends every Step through the client's loop thread (the
hop there and back, the asyncio channel), `blocking` as the adapter does (a blocking
channel from vLLM's thread); their decisions must be the same.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from daemon_harness import DaemonProcess  # noqa: E402
from vllm_driver import build_scheduler, drive, model_dir  # noqa: E402

from kvbudget.traces.loaders import load_trace  # noqa: E402
from kvbudget.traces.results import percentile  # noqa: E402

BLOCKS, MAX_LEN = 3000, 4096
ARGS = ("--num-gpu-blocks", str(BLOCKS), "--max-model-len", str(MAX_LEN), "--watermark", "0",
        "--backfill-depth", "0", "--no-enable-prefix-caching")


def ms(values: list[float], q: float) -> float:
    return round(percentile(values, q) * 1000, 3)


def timed_adapter(scheduler) -> dict:
    """Wraps the adapter's before/after and its link's step to time them and count decisions."""
    adapter, seen = scheduler.kvbudget, {"added": [], "rpc": [], "own": [], "decisions": 0}
    before, after, step = adapter.before, adapter.after, adapter.link.step
    state = {}

    def timed_before():
        state["t"], state["rpc"] = time.perf_counter(), 0.0
        gate = before()
        state["before"] = time.perf_counter() - state["t"]
        return gate

    def timed_after(output):
        started = time.perf_counter()
        after(output)
        seen["added"].append(state["before"] + time.perf_counter() - started)
        seen["own"].append(seen["added"][-1] - state["rpc"])

    def timed_step(*args, **kwargs):
        started = time.perf_counter()
        decisions = step(*args, **kwargs)
        seen["rpc"].append(time.perf_counter() - started)
        state["rpc"] += seen["rpc"][-1]
        seen["decisions"] += len(decisions)
        return decisions

    adapter.before, adapter.after, adapter.link.step = timed_before, timed_after, timed_step
    return seen


def run_adapter(work: Path, trace, policy: str, blocking: bool, num_pings: int) -> tuple[dict, list | None]:
    """One adapter run with a daemon of its own; the pings (`num_pings`) after the blocking one."""
    import kvbudget.vllm.adapter as adapter_module

    link_class = adapter_module.DaemonLink
    adapter_module.DaemonLink = functools.partial(link_class, blocking_steps=blocking)
    work.mkdir()
    try:
        with DaemonProcess(work, *ARGS, "--policy", policy) as daemon:
            os.environ.update(KVBUDGET_TARGET=daemon.target, KVBUDGET_ENGINE_ID="bench-vllm")
            scheduler = build_scheduler(model_dir(work), BLOCKS, max_model_len=MAX_LEN)
            seen = timed_adapter(scheduler)
            run = drive(scheduler, trace.requests, trace.max_output_tokens)
            drift = scheduler.kvbudget.metrics.counts["drift"]
            scheduler.shutdown()
            if blocking:
                seen["ping"] = pings(daemon.target, num_pings)
    finally:
        adapter_module.DaemonLink = link_class
    added = seen["added"]
    return dict(
        steps=run.steps, finished=run.finished, drift=drift, decisions=seen["decisions"],
        adapter_added_ms=dict(p50=ms(added, 50), p99=ms(added, 99), mean=round(statistics.fmean(added) * 1000, 3)),
        step_rpc_ms=dict(p50=ms(seen["rpc"], 50), p99=ms(seen["rpc"], 99)),
        adapter_own_ms=dict(p50=ms(seen["own"], 50), p99=ms(seen["own"], 99)),
        added_p50_share_of_20ms_step=round(percentile(added, 50) / 0.020, 4),
        decisions_per_s_of_adapter_time=round(seen["decisions"] / sum(added)),
    ), seen.get("ping")


def pings(target: str, count: int) -> list[float]:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        stub.Check(health_pb2.HealthCheckRequest())
        times = []
        for _ in range(count):
            started = time.perf_counter()
            stub.Check(health_pb2.HealthCheckRequest())
            times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=500)
    parser.add_argument("--policy", default="optimistic")
    parser.add_argument("--pings", type=int, default=2000)
    args = parser.parse_args()
    from vllm.v1.core.sched.scheduler import Scheduler as VllmScheduler

    trace = load_trace("azure", limit=args.rows)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        plain = drive(build_scheduler(model_dir(work), BLOCKS, cls=VllmScheduler, max_model_len=MAX_LEN),
                      trace.requests, trace.max_output_tokens)
        loop_thread, _ = run_adapter(work / "loop", trace, args.policy, blocking=False, num_pings=0)
        blocking, ping = run_adapter(work / "blocking", trace, args.policy, blocking=True, num_pings=args.pings)
    print(json.dumps(dict(
        rows=args.rows, policy=args.policy,
        vllm_schedule_ms=dict(p50=ms(plain.schedule_s, 50), p99=ms(plain.schedule_s, 99), steps=plain.steps),
        grpc_ping_ms=dict(p50=ms(ping, 50), p99=ms(ping, 99)),
        loop_thread=loop_thread, blocking=blocking,
    ), indent=1))


if __name__ == "__main__":
    main()
