"""Whole-trace replay speed: offline (in-process core) and live (a real daemon process).

Goals (issue 5): the whole Mooncake trace (12,031 requests, 1 hour) offline in <= 10 s and
live through a daemon in <= 60 s on a 2-core machine.

    .venv/bin/python bench/bench_replay.py                      # both, Mooncake, defaults
    .venv/bin/python bench/bench_replay.py --mode offline --limit 2000
    .venv/bin/python bench/bench_replay.py --model gemma-3-27b --num-gpu-blocks 20000

Prints one JSON line per run: wall seconds, simulated steps, backend calls, decisions,
and, offline, where the time went (inside the admission core vs the simulated engine).

The measurements (issue 5) and where the time goes: docs/architecture/traces.md,
"Replay speed".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvbudget.daemon.core.admission import AdmissionController
from kvbudget.daemon.config.hf_config import load_model
from kvbudget.traces.loaders import load_trace
from kvbudget.traces.replay import ControllerBackend, ReplaySetup, admission_config
from kvbudget.traces.replay_live import run_live
from kvbudget.traces.results import summarize
from kvbudget.traces.sim_engine import EngineConfig
from kvbudget.traces.simulation import Simulation


def _setup(args: argparse.Namespace, trace) -> ReplaySetup:
    model = load_model(args.model)
    return ReplaySetup(
        layout=model.layout,
        num_blocks=args.num_gpu_blocks,
        engine=EngineConfig(
            max_model_len=model.max_model_len,
            per_prefill_token_s=args.per_prefill_token_us / 1e6,
            grow_ahead_blocks=args.grow_ahead_blocks,
        ),
        model=model.name,
        engines=args.engines,
        spread_s=trace.arrival_quantum_s,
    )


class TimedBackend(ControllerBackend):
    """The in-process backend, with the time spent inside the admission core added up."""

    core_s = 0.0

    def step(self, engine_id, ops, now):
        started = time.perf_counter()
        try:
            return super().step(engine_id, ops, now)
        finally:
            self.core_s += time.perf_counter() - started

    def idle(self, engine_id, now):
        started = time.perf_counter()
        try:
            return super().idle(engine_id, now)
        finally:
            self.core_s += time.perf_counter() - started


def bench_offline(args: argparse.Namespace, trace) -> dict:
    setup = _setup(args, trace)
    started = time.perf_counter()
    controller = AdmissionController(setup.layout, setup.num_blocks, admission_config(setup, args.policy))
    backend = TimedBackend(controller)
    simulation = Simulation(trace.requests, setup.layout, setup.engine, engines=setup.engines,
                            spread_s=setup.spread_s)  # fmt: skip
    run = simulation.run(backend)
    wall = time.perf_counter() - started
    summary = summarize(run, policy=args.policy, trace=trace.name, mode="offline", setup=setup, wall_s=wall)
    return {
        "mode": "offline", "wall_s": round(wall, 2), "core_s": round(backend.core_s, 2),
        "engine_sim_s": round(wall - backend.core_s, 2), **_figures(summary.summary),
    }  # fmt: skip


def bench_live(args: argparse.Namespace, trace) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="kvbudget-bench-"))
    target = f"unix://{workdir / 'kvbudget.sock'}"
    argv = [
        sys.executable, "-m", "kvbudget", "daemon", "--model", args.model,
        "--num-gpu-blocks", str(args.num_gpu_blocks + 1), "--memory-mode", "accounting",
        "--device", "cpu", "--policy", args.policy, "--listen", target,
        "--db-path", str(workdir / "decisions.db"), "--lease-ttl-s", "60",
    ]  # fmt: skip
    daemon = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=open(workdir / "daemon.log", "w"))
    try:
        _wait_serving(target, daemon)
        setup = _setup(args, trace)
        started = time.perf_counter()
        cpu_before = time.process_time()
        result = asyncio.run(run_live(trace.requests, setup, target=target, trace_name=trace.name, replay_id="bench"))
        wall = time.perf_counter() - started
        # the replayer's own CPU (engine simulation, proto building, gRPC client); the rest
        # of the wall time is the daemon and the round trips
        client_cpu = time.process_time() - cpu_before
        return {"mode": "live", "wall_s": round(wall, 2), "replayer_cpu_s": round(client_cpu, 2),
                "ms_per_call": round(1000 * wall / max(1, result.summary["calls"]), 3), **_figures(result.summary)}  # fmt: skip
    finally:
        daemon.terminate()
        daemon.wait(60)
        shutil.rmtree(workdir, ignore_errors=True)


def _wait_serving(target: str, daemon: subprocess.Popen) -> None:
    from kvbudget.client.target import wait_until_serving

    why = wait_until_serving(target, daemon)
    if why is not None:
        raise SystemExit(f"daemon {why}")


def _figures(summary: dict) -> dict:
    keys = ("requests", "finished", "rejected", "preemptions", "steps", "calls", "decisions", "makespan_s")
    return {k: summary[k] for k in keys if k in summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="mooncake")
    parser.add_argument("--mode", choices=("offline", "live", "both"), default="both")
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--num-gpu-blocks", type=int, default=24_000)  # ~48 GiB of llama-3.1-8b KV
    parser.add_argument("--policy", default="optimistic")
    parser.add_argument("--engines", type=int, default=1)
    parser.add_argument("--limit", type=int)
    parser.add_argument("--per-prefill-token-us", type=float, default=50.0)
    parser.add_argument("--grow-ahead-blocks", type=int, default=16)  # as `kvbudget replay`
    args = parser.parse_args()
    trace = load_trace(args.trace, limit=args.limit)
    common = {"trace": trace.name, "model": args.model, "num_blocks": args.num_gpu_blocks,
              "policy": args.policy, "engines": args.engines}  # fmt: skip
    if args.mode in ("offline", "both"):
        print(json.dumps({**common, **bench_offline(args, trace)}), flush=True)
    if args.mode in ("live", "both"):
        print(json.dumps({**common, **bench_live(args, trace)}), flush=True)


if __name__ == "__main__":
    main()
