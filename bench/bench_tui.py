"""Dashboard refreshes per second and CPU while the daemon handles a sustained batched load.

    python bench/bench_tui.py [--seconds 20] [--engines 2] [--batch 32] [--model gemma-3-27b]

Starts a real `kvbudget daemon` on a unix socket in a temp dir, drives it with engines that
each send one Step per scheduler step (submits, grows, finishes in one call, as a real
engine does), and runs the dashboard headless (Textual's `run_test`, 120x40) against it in a
separate process, so the dashboard's CPU is its own. Reports, from the dashboard process:
frames drawn per second, process CPU time / wall time (share of one core), decisions folded
per second, decisions the daemon dropped for it; and from the load: Step calls and decisions
per second. Goals (issue #6): >= 10 refreshes/s, <= 30% of a core.

The load lives in `engine_load`, importable on its own to drive a daemon from elsewhere.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


async def engine_load(
    target: str,
    engine_id: str,
    *,
    steps: int | None = None,
    seconds: float | None = None,
    batch: int = 32,
    prompt_tokens: int = 700,
    new_tokens: int = 128,
    grow_tokens: int = 32,
    tenant: str = "",
) -> dict[str, int]:
    """One engine: each step submits `batch` requests, grows every running one by
    `grow_tokens` and finishes those that reached `prompt + new_tokens`. Admissions that
    come later (a queued request admitted) and preempt orders arrive on the events stream.
    Runs `steps` steps or for `seconds`; returns counts of steps and decisions."""
    import grpc

    from kvbudget.client import EngineClient, SessionLost
    from kvbudget.daemon.core.records import DecisionKind, RequestSpec

    counts = {"steps": 0, "decisions": 0, "preempted": 0}
    running: dict[str, int] = {}  # request id -> tokens it holds now
    waiting: set[str] = set()  # submitted, not yet admitted (queued or preempted)
    denied: set[str] = set()  # growth refused: the engine gives the request up next step

    def apply(decision) -> None:
        counts["decisions"] += 1
        kind = DecisionKind(decision.kind)
        if kind is DecisionKind.ADMIT:
            running[decision.request_id] = max(decision.num_tokens, prompt_tokens)
            waiting.discard(decision.request_id)
        elif kind is DecisionKind.GROW and decision.request_id in running:
            running[decision.request_id] = max(running[decision.request_id], decision.num_tokens)
        elif kind is DecisionKind.DENY and decision.request_id in running:
            # A real engine preempts (recomputes) a request whose growth is refused; this
            # one aborts it, which frees its blocks the same way.
            denied.add(decision.request_id)
        elif kind is DecisionKind.PREEMPT:  # queued again by the daemon, to recompute
            running.pop(decision.request_id, None)
            waiting.add(decision.request_id)
            counts["preempted"] += 1
        elif kind in (DecisionKind.REJECT, DecisionKind.RELEASE, DecisionKind.EXPIRE):
            running.pop(decision.request_id, None)
            waiting.discard(decision.request_id)

    async with EngineClient(target, engine_id) as engine:

        async def follow() -> None:
            async for decision in engine.events():
                apply(decision)

        follower = asyncio.create_task(follow())
        deadline = time.monotonic() + seconds if seconds is not None else None
        next_id = 0
        try:
            while (steps is None or counts["steps"] < steps) and (
                deadline is None or time.monotonic() < deadline
            ):
                # Keep about two batches waiting, as an engine with a bounded queue would.
                room = max(0, 2 * batch - len(waiting))
                submits = [
                    RequestSpec(f"{engine_id}-{next_id + k}", prompt_tokens=prompt_tokens,
                                max_new_tokens=new_tokens, tenant=tenant)
                    for k in range(min(batch, room))
                ]
                next_id += len(submits)
                waiting.update(s.request_id for s in submits)
                done = [r for r, tokens in running.items() if tokens >= prompt_tokens + new_tokens]
                aborts = [r for r in denied if r in running and r not in done]
                for request_id in done + aborts:
                    del running[request_id]
                denied.clear()
                grows = [(r, tokens + grow_tokens) for r, tokens in running.items()]
                try:
                    decisions = await engine.step(
                        submits=submits, grows=grows, finishes=done, aborts=aborts
                    )
                except SessionLost:
                    running.clear()
                    continue
                except grpc.aio.AioRpcError as error:
                    # A preempt order for a request we were growing crossed this step on
                    # the events stream: the daemon refused the whole step, naming it.
                    if error.code() not in (grpc.StatusCode.NOT_FOUND,
                                            grpc.StatusCode.INVALID_ARGUMENT):
                        raise
                    named = re.search(r"'([^']+)'", error.details() or "")
                    if named:
                        running.pop(named.group(1), None)
                    waiting.difference_update(s.request_id for s in submits)
                    continue
                counts["steps"] += 1
                for decision in decisions:
                    apply(decision)
                await asyncio.sleep(0)
        finally:
            follower.cancel()
    return counts


def start_daemon(workdir: Path, model: str, num_blocks: int) -> tuple[subprocess.Popen, str]:
    socket_path = workdir / "kvbudget.sock"
    target = f"unix://{socket_path}"
    log = open(workdir / "daemon.log", "w")
    daemon = subprocess.Popen(
        [sys.executable, "-m", "kvbudget", "daemon", "--model", model,
         "--num-gpu-blocks", str(num_blocks), "--memory-mode", "accounting", "--device", "cpu",
         "--max-model-len", "4096", "--db-path", str(workdir / "decisions.db"),
         "--listen", target, "--tenant", "acme=0.6", "--tenant", "globex=0.6"],
        stdout=subprocess.DEVNULL, stderr=log,
    )
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + 60
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            if daemon.poll() is not None:
                raise SystemExit(f"daemon exited: {(workdir / 'daemon.log').read_text()}")
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1:
                    return daemon, target
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("daemon did not come up in 60 s")
            time.sleep(0.1)


async def dashboard(target: str, seconds: float, render_hz: float) -> dict[str, float]:
    """The dashboard headless for `seconds`, measuring its own process."""
    from kvbudget.tui.app import KVBudgetApp

    app = KVBudgetApp(target, render_hz=render_hz)
    async with app.run_test(size=(120, 40)) as pilot:
        # Wait for the first snapshot, then measure a steady window.
        while app.state.snapshot is None:
            await pilot.pause(0.05)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        renders0, folded0, version0 = app.renders, app.state.decisions_received, app.state.version
        await asyncio.sleep(seconds)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        result = {
            "refreshes_per_s": (app.renders - renders0) / wall,
            "updates_per_s": (app.state.version - version0) / wall,
            "cpu_share_of_core": cpu / wall,
            "decisions_folded_per_s": (app.state.decisions_received - folded0) / wall,
            "decisions_dropped_for_dashboard": app.state.decisions_dropped,
            "wall_s": wall,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "final_free_blocks": app.state.snapshot.num_free_blocks,
            "final_preemptions": app.state.snapshot.num_preemptions,
        }
        await pilot.press("q")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--model", default="gemma-3-27b")
    parser.add_argument("--num-blocks", type=int, default=8192)
    parser.add_argument("--render-hz", type=float, default=12.0)  # the dashboard's default
    parser.add_argument("--dashboard-only", metavar="TARGET", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.dashboard_only:  # the child: just the dashboard, its figures as JSON
        print(json.dumps(asyncio.run(dashboard(args.dashboard_only, args.seconds, args.render_hz))))
        return

    with tempfile.TemporaryDirectory(prefix="kvbudget-bench-tui-") as tmp:
        daemon, target = start_daemon(Path(tmp), args.model, args.num_blocks)
        try:
            child = subprocess.Popen(
                [sys.executable, __file__, "--dashboard-only", target,
                 "--seconds", str(args.seconds), "--render-hz", str(args.render_hz)],
                stdout=subprocess.PIPE, text=True,
            )

            async def load() -> list[dict[str, int]]:
                tenants = ("acme", "globex")
                return await asyncio.gather(*[
                    engine_load(target, f"engine-{i}", seconds=args.seconds + 3,
                                batch=args.batch, tenant=tenants[i % 2])
                    for i in range(args.engines)
                ])

            t0 = time.perf_counter()
            counts = asyncio.run(load())
            load_wall = time.perf_counter() - t0
            out, _ = child.communicate(timeout=120)
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(30)
    figures = json.loads(out.strip().splitlines()[-1])
    steps = sum(c["steps"] for c in counts)
    decisions = sum(c["decisions"] for c in counts)
    print(f"load: {args.engines} engines x batch {args.batch}, {steps / load_wall:,.0f} Step calls/s, "
          f"{decisions / load_wall:,.0f} decisions/s to the engines ({os.cpu_count()} CPUs)")
    print(f"dashboard: {figures['refreshes_per_s']:.1f} refreshes/s (goal >= 10) from "
          f"{figures['updates_per_s']:.1f} Watch updates/s, "
          f"CPU {figures['cpu_share_of_core']:.0%} of a core (goal <= 30%), "
          f"{figures['decisions_folded_per_s']:,.0f} decisions/s folded, "
          f"{figures['decisions_dropped_for_dashboard']:,} dropped for it, "
          f"peak RSS {figures['peak_rss_mb']:.0f} MB")


if __name__ == "__main__":
    main()
