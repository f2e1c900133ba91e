"""What one engine Step costs the daemon's thread, counted rather than timed.

    python bench/bench_step_footprint.py [--steps 2000] [--shape admission|batch]

Timings on this machine drift by 15-30% from minute to minute, and one admission round
trip is mostly paid in cache misses: the daemon sleeps between calls, so each Step finds
its code and data gone. valgrind counts both, the same on every run: this runs the real
Step handler in process (EngineServicer, CoreService, the controller, a DecisionLog on a
real SQLite file; no gRPC around it) under callgrind, once with and once without the
Step calls (hash seed fixed, the log's folds and checkpoints off, the heap settled as the
daemon settles it once up: `interpreter.settle_heap`), and prints the
difference per Step on the handler's thread:

  - instructions (what a warm Step costs);
  - simulated last-level cache misses, instruction fetches and data reads, with an 8 MiB
    buffer written over between Steps (what a cold Step costs: every line it touches
    comes from memory again; the simulated cache is 2 MiB, this machine's L2).

Shapes: `admission`, one submit per Step (bench_roundtrip's latency case); `batch`, 256
submits + the previous 256 finishes per Step (its throughput case). Needs valgrind
(Debian: valgrind); a run takes a few minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvbudget.client import step_message
from kvbudget.daemon.server import interpreter
from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController
from kvbudget.daemon.server.auth import Authorizer
from kvbudget.daemon.wire.convert import plan_to_proto
from kvbudget.daemon.server.service import CoreOptions, CoreService
from kvbudget.daemon.log.decision_log import DecisionLog
from kvbudget.daemon.config.hf_config import load_model
from kvbudget.daemon.server.servicers import EngineServicer
from kvbudget.daemon.server.sessions import SessionTable
from kvbudget.daemon.server.watch import WatchHub
from kvbudget.v1 import engine_pb2

EVENTS = ("Ir", "ILmr", "DLmr")
CACHES = ("--I1=32768,8,64", "--D1=49152,12,64", "--LL=2097152,16,64")


class _Context:
    """The two things Step asks of a grpc.aio context, for callers it trusts."""

    def peer(self) -> str:
        return "unix:"

    async def abort(self, code: object, message: str) -> None:
        raise RuntimeError(f"{code}: {message}")


def _messages(session_id: str, shape: str, steps: int) -> list[engine_pb2.StepRequest]:
    def submit(request_id: str) -> engine_pb2.Submit:
        return engine_pb2.Submit(request_id=request_id, prompt_tokens=16, max_new_tokens=16)

    if shape == "admission":  # 2 blocks each (16 + 16 tokens): the pool holds 8,000 of them
        return [step_message(session_id, submits=[submit(f"a{k}")]) for k in range(steps)]
    calls = []
    previous: list[str] = []
    for k in range(steps):
        ids = [f"b{k}-{i}" for i in range(256)]
        calls.append(step_message(session_id, submits=[submit(r) for r in ids], finishes=previous))
        previous = ids
    return calls


async def _inner(steps: int, shape: str, with_steps: bool, thrash: bool) -> None:
    model = load_model("llama-3.1-8b")
    controller = AdmissionController(model.layout, 16383, AdmissionConfig(max_model_len=2048, policy="guaranteed"))
    with tempfile.TemporaryDirectory() as tmp:
        # No folds or checkpoints: in the daemon they run on another core, and here their
        # timing would make the counts differ from run to run.
        log = DecisionLog(Path(tmp) / "decisions.db", fold_interval_s=3600.0, checkpoint_interval_s=None)
        log.start()
        plan = plan_to_proto(model.layout, 16383, max_model_len=2048, max_num_batched_tokens=8192)
        core = CoreService(controller, log, plan, SessionTable(30.0, max_ttl_s=3600.0, max_sessions=8),
                           WatchHub(4), options=CoreOptions(tick_s=3600.0))
        await core.start()
        session = core.sessions.open("footprint", 30.0, time.monotonic())
        servicer = EngineServicer(core, Authorizer(None, trust_tcp=True))  # as the daemon with no tokens
        context = _Context()
        calls = _messages(session.session_id, shape, steps)  # built before, in both runs
        interpreter.settle_heap()  # as `kvbudget daemon` does once it is up (the collector's settings)
        scratch = bytearray(8 << 20)
        zeros = bytes(len(scratch[::64]))
        for message in calls:
            if thrash:
                scratch[::64] = zeros  # one write per cache line: everything else is evicted
            if with_steps:
                await servicer.Step(message, context)
        await core.stop()
        log.close()
        controller.check_integrity()


def _totals(out_file: Path, events: tuple[str, ...]) -> dict[str, int]:
    """The handler's thread (the process's first) totals of one callgrind run."""
    text = subprocess.run(["callgrind_annotate", f"--show={','.join(events)}", str(out_file)],
                          capture_output=True, text=True, check=True).stdout
    for line in text.splitlines():
        if "PROGRAM TOTALS" in line:
            numbers = re.findall(r"([\d,]+) \(", line)
            return {name: int(value.replace(",", "")) for name, value in zip(events, numbers)}
    raise SystemExit(f"no totals in {out_file}")


def _run(steps: int, shape: str, with_steps: bool, thrash: bool, workdir: Path) -> dict[str, int]:
    out_file = workdir / f"cg-{int(with_steps)}-{int(thrash)}.out"
    command = [
        "valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out_file}",
        *(["--cache-sim=yes", *CACHES] if thrash else []),
        sys.executable, __file__, "--inner", "--steps", str(steps), "--shape", shape,
        *(["--with-steps"] if with_steps else []), *(["--thrash"] if thrash else []),
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0"}  # the same dict layouts every run
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return _totals(Path(f"{out_file}-01"), EVENTS if thrash else ("Ir",))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--shape", choices=("admission", "batch"), default="admission")
    parser.add_argument("--keep", metavar="DIR", help="keep the callgrind files there (callgrind_annotate them)")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--with-steps", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--thrash", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        asyncio.run(_inner(args.steps, args.shape, args.with_steps, args.thrash))
        return
    if shutil.which("valgrind") is None or shutil.which("callgrind_annotate") is None:
        raise SystemExit("bench_step_footprint: needs valgrind (Debian package valgrind)")
    steps = min(args.steps, 8000) if args.shape == "admission" else max(1, args.steps // 100)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(args.keep or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        warm = {k: _run(steps, args.shape, True, False, workdir)[k] - v
                for k, v in _run(steps, args.shape, False, False, workdir).items()}
        cold_with, cold_without = _run(steps, args.shape, True, True, workdir), _run(steps, args.shape, False, True, workdir)
    cold = {k: cold_with[k] - cold_without[k] for k in EVENTS}
    label = "one submit" if args.shape == "admission" else "256 submits + 256 finishes"
    print(f"per Step ({label}), {steps} Steps, python {sys.version.split()[0]}, {os.cpu_count()} cores:")
    print(f"  instructions, warm       {warm['Ir'] / steps:>12,.0f}")
    print(f"  instructions, cold       {cold['Ir'] / steps:>12,.0f}")
    print(f"  LL misses, cold: code    {cold['ILmr'] / steps:>12,.0f}   data {cold['DLmr'] / steps:>10,.0f}"
          f"   ({(cold['ILmr'] + cold['DLmr']) * 64 / steps / 1024:,.0f} KiB from memory)")


if __name__ == "__main__":
    main()
