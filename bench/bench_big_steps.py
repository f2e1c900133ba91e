"""Heartbeat latency of one engine while another sends big steps, and the daemon's memory.

    python bench/bench_big_steps.py [--ops 10000] [--steps 10] [--pings 400] [--ping-every-s 0.01]
                                    [--unsliced] [--server-from DIR]

Issue 30, point 4: a 100,000-op step held the daemon's event loop for seconds, and an engine
heartbeating with a 1 s lease lost its session. This starts a real daemon (a pool of
`--ops` x 2 one-block requests, `--max-ops-per-step` set to `--ops`), then, in one run:

  1. bare: one engine sends `--pings` Heartbeats, one every `--ping-every-s`, alone;
  2. loaded: the same, while a second engine (its own process, so that building its big
     messages does not slow the pinger) sends `--steps` steps of `--ops` ops back to back:
     submits of one-token requests, then the finishes of the step before.

For each: heartbeat p50, p99 and max (ms). Also the big steps' own latency, the daemon's
resident memory (VmRSS) before the big steps, right after them and after the pinger's
last round, and the leases the daemon saw lapse (its journal). `--unsliced` runs the daemon
with big steps applied whole (daemon/server/sliced.py off), for comparison;
`--server-from DIR` with the daemon/server modules DIR holds in place of the installed
ones, e.g. an earlier commit's, to measure a change before and after on the same machine:

    mkdir base && for f in steps.py sliced.py; do git show BASE:daemon/server/$f > base/$f; done

Figures of one run on one machine: compare bare and loaded of the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc  # noqa: E402

from kvbudget.v1 import engine_pb2, engine_pb2_grpc  # noqa: E402
from tests.daemon_harness import DaemonProcess  # noqa: E402


UNSLICED_DAEMON = (
    "import sys\n"
    "import kvbudget.daemon.server.sliced as sliced\n"
    "sliced.BIG_STEP_OPS = 10**9\n"
    "from kvbudget.cli.main import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


SERVER_FROM_DAEMON = (  # (the modules in $BENCH_SERVER_FROM found before the installed ones)
    "import importlib.util, os, pathlib, sys\n"
    "base = pathlib.Path(os.environ['BENCH_SERVER_FROM'])\n"
    "class Earlier:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        file = base / (name.rpartition('.')[2] + '.py')\n"
    "        if name.startswith('kvbudget.daemon.server.') and file.is_file():\n"
    "            return importlib.util.spec_from_file_location(name, file)\n"
    "sys.meta_path.insert(0, Earlier())\n"
    "from kvbudget.cli.main import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def ping(target: str, every_s: float, *, pings: int = 0, until: asyncio.Future | None = None) -> list[float]:
    """Heartbeat latencies of a fresh session with the shortest lease (1 s): `pings` of them,
    or as many as fit until `until` is done."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = engine_pb2_grpc.EngineServiceStub(channel)
        opened = await stub.OpenSession(engine_pb2.OpenSessionRequest(engine_id=f"pinger-{time.monotonic_ns()}",
                                                                      lease_ttl_s=1))
        request = engine_pb2.HeartbeatRequest(session_id=opened.session_id)
        latencies: list[float] = []
        while (until is not None and not until.done()) or len(latencies) < pings:
            t0 = time.perf_counter()
            await stub.Heartbeat(request)  # (a lapsed lease fails it: FAILED_PRECONDITION)
            latencies.append(time.perf_counter() - t0)
            await asyncio.sleep(every_s)
        await stub.CloseSession(engine_pb2.CloseSessionRequest(session_id=opened.session_id))
    return latencies


def big_steps(target: str, ops: int, steps: int, go, done, out) -> None:
    """The second engine, in its own process: `steps` steps of `ops` ops each."""
    async def run() -> None:
        options = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
        async with grpc.aio.insecure_channel(target, options=options) as channel:
            stub = engine_pb2_grpc.EngineServiceStub(channel)
            opened = await stub.OpenSession(engine_pb2.OpenSessionRequest(engine_id="big", lease_ttl_s=60))
            go.wait()
            previous: list[str] = []
            for k in range(steps):
                request = engine_pb2.StepRequest(session_id=opened.session_id, step_seq=k + 1)
                if previous:
                    request.finishes.extend(engine_pb2.Finish(request_id=r) for r in previous)
                    previous = []
                else:
                    previous = [f"b{k}-{i}" for i in range(ops)]
                    request.submits.extend(engine_pb2.Submit(request_id=r, prompt_tokens=1, max_new_tokens=1)
                                           for r in previous)
                t0 = time.perf_counter()
                await stub.Step(request, timeout=120)
                out.put(time.perf_counter() - t0)
        done.set()

    try:
        asyncio.run(run())
    finally:
        done.set()  # (a failure too: the parent reads what came and says how many)


def summary(latencies: list[float]) -> str:
    ms = sorted(x * 1000 for x in latencies)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return f"p50 {statistics.median(ms):7.2f} ms   p99 {p99:7.2f} ms   max {ms[-1]:7.2f} ms   ({len(ms)} pings)"


async def bench(workdir: Path, args: argparse.Namespace) -> None:
    blocks = str(args.ops * 2 + 65)
    server_from = {"BENCH_SERVER_FROM": str(Path(args.server_from).resolve())} if args.server_from else None
    daemon = DaemonProcess(workdir, "--num-gpu-blocks", blocks, "--max-ops-per-step", str(args.ops),
                           "--max-model-len", "2048", lease_ttl_s=60, env=server_from)
    if args.unsliced or args.server_from:
        daemon.args[1:3] = ["-c", UNSLICED_DAEMON if args.unsliced else SERVER_FROM_DAEMON]  # (for `-m kvbudget`)
    with daemon:
        pid = daemon.process.pid
        bare = await ping(daemon.target, args.ping_every_s, pings=args.pings)
        rss_before = rss_mb(pid)
        context = multiprocessing.get_context("spawn")
        go, done, out = context.Event(), context.Event(), context.Queue()
        stepper = context.Process(target=big_steps, args=(daemon.target, args.ops, args.steps, go, done, out))
        stepper.start()
        t0 = time.perf_counter()
        go.set()
        steps_done = asyncio.ensure_future(asyncio.to_thread(done.wait))
        loaded = await ping(daemon.target, args.ping_every_s, until=steps_done)
        elapsed = time.perf_counter() - t0
        step_s = [out.get() for _ in range(out.qsize())] or [float("nan")]
        stepper.join()
        rss_after = rss_mb(pid)
        after = await ping(daemon.target, args.ping_every_s, pings=args.pings)
        rss_settled = rss_mb(pid)
        lapsed = daemon.stderr().count("expired; taking its blocks back")
    served = "unsliced" if args.unsliced else f"server modules from {args.server_from}" if args.server_from else "sliced"
    print(f"daemon: {blocks} blocks, max_ops_per_step {args.ops:,}, {served}; {args.steps} steps of {args.ops:,} ops "
          f"in {elapsed:.1f} s")
    print(f"heartbeat, bare:   {summary(bare)}")
    print(f"heartbeat, loaded: {summary(loaded)}")
    print(f"big step latency:  median {statistics.median(step_s) * 1000:.0f} ms, max {max(step_s) * 1000:.0f} ms")
    print(f"daemon RSS: {rss_before:.0f} MB before the big steps, {rss_after:.0f} MB after them, "
          f"{rss_settled:.0f} MB after {len(after)} more pings")
    print(f"leases lapsed: {lapsed}")



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--pings", type=int, default=400)
    parser.add_argument("--ping-every-s", type=float, default=0.01)
    parser.add_argument("--unsliced", action="store_true", help="big steps applied whole, for comparison")
    parser.add_argument("--server-from", metavar="DIR",
                        help="daemon/server modules to run in place of the installed ones (an earlier commit's)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        asyncio.run(bench(Path(workdir), args))


if __name__ == "__main__":
    main()
