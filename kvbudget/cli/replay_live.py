"""`kvbudget replay --target ...`: the simulated engine replays against a running daemon,
whose pool plan gives the model, pool and limits; its dashboard is told how far it is."""

from __future__ import annotations

import argparse
import sys
import uuid

from kvbudget.cli.replay_flags import engine_config, float_flag, int_flag
from kvbudget.client.errors import CLIError
from kvbudget.client.target import rpc_error_line


def run(args: argparse.Namespace, trace):
    import asyncio

    speed = None if args.as_fast_as_possible else (float_flag(args.speed, "--speed", positive=True) or 1.0)
    stopped_by: list[int] = []
    try:
        return asyncio.run(_live(args, trace, speed, stopped_by))
    except OSError as exc:
        raise CLIError(f"--target: {exc}") from None
    except asyncio.CancelledError:
        if not stopped_by:
            raise
        raise SystemExit(128 + stopped_by[0]) from None  # (as a shell reports a signal's end)


def _stop_on_signals(stopped_by: list[int]) -> None:
    """SIGTERM (the dashboard's and the demo's way to stop a replay) and SIGHUP (its terminal
    gone) end a live replay as Ctrl-C does: the running task is cancelled, so its engine
    sessions close and their requests are released (`release aborted`), where the default
    action killed the process and left them held until the lease lapsed (`expire`)."""
    import asyncio
    import signal

    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None

    def stop(signum: int) -> None:
        stopped_by.append(signum)
        task.cancel()

    for signum in (signal.SIGTERM, signal.SIGHUP):
        try:
            loop.add_signal_handler(signum, stop, signum)
        except (ValueError, RuntimeError, NotImplementedError):
            continue  # not the main thread (an embedder's): its own handlers stand


async def _live(args: argparse.Namespace, trace, speed: float | None, stopped_by: list[int] | None = None):
    from kvbudget.client import ObserverClient

    _stop_on_signals([] if stopped_by is None else stopped_by)
    replay_id = uuid.uuid4().hex[:8]
    async with ObserverClient(args.target, args.token, credentials=args.credentials) as observer:
        setup, policy = await _daemon_setup(observer, args, trace)
        reporter = ReplayReporter(observer, replay_id, trace.name, speed or 0.0, policy)
        shown = _Shown(reporter, len(trace.requests))
        try:
            result = await _replay(args, trace, setup, speed, replay_id, shown)
            reporter.update(result.summary["requests"], result.summary["requests"], True)  # type: ignore[arg-type]
            await reporter.flush()
        finally:
            shown.stop()
    return result


async def _daemon_setup(observer, args: argparse.Namespace, trace):
    """The replay's setup from the daemon's pool plan, and the policy it runs (switched to
    --policy first, if given)."""
    import grpc

    from kvbudget.daemon.wire import convert
    from kvbudget.daemon.wire.layout import layout_from_plan
    from kvbudget.traces.replay import ReplaySetup

    try:
        # Not waiting for a connection: a target nobody serves says "Connection refused"
        # at once, as doctor and admin do, not DEADLINE_EXCEEDED after 5 s.
        snapshot = await observer.snapshot(timeout=5.0, wait_for_ready=False)
        if args.policy:
            await observer.set_policy(args.policy)
    except grpc.aio.AioRpcError as exc:
        raise CLIError(rpc_error_line(args.target, exc)) from None
    plan = snapshot.plan
    try:
        layout = layout_from_plan(plan)
    except ValueError as exc:  # a plan this client cannot read whole
        raise CLIError(f"the daemon's pool plan: {exc}") from None
    engine = engine_config(
        args, trace, max_model_len=plan.max_model_len_tokens,
        max_num_batched_tokens=plan.max_num_batched_tokens or 8192,
    )  # fmt: skip
    setup = ReplaySetup(
        layout=layout, num_blocks=plan.num_blocks, engine=engine, model=plan.model,
        engines=int_flag(args.engines, "--engines") or 1, seed=int_flag(args.seed, "--seed", minimum=0) or 0,
        spread_s=trace.arrival_quantum_s,
    )  # fmt: skip
    return setup, args.policy or convert.policy_from_proto(snapshot.policy) or ""


async def _replay(args: argparse.Namespace, trace, setup, speed: float | None, replay_id: str, shown: _Shown):
    import asyncio

    import grpc

    from kvbudget.client import SessionLost
    from kvbudget.traces.replay_live import run_live

    target = args.target  # checked and resolved in cmd_replay.run
    try:
        return await run_live(
            trace.requests, setup, target=target, token=args.token, credentials=args.credentials,
            speed=speed, trace_name=trace.name, replay_id=replay_id, on_progress=shown.update,
        )  # fmt: skip
    except grpc.aio.AioRpcError as exc:
        raise CLIError(rpc_error_line(target, exc)) from None
    except asyncio.CancelledError:
        # Ctrl-C, SIGTERM or SIGHUP: the sessions close as this unwinds and the
        # daemon releases their requests; say where it stopped (no summary: the run
        # is not the trace's).
        shown.stop()
        print(f"kvbudget replay: stopped after {shown.done:,} of {shown.total:,} requests; "
              "the daemon releases those still held (release aborted)", file=sys.stderr, flush=True)
        raise
    except SessionLost as exc:
        # The daemon no longer knows the replay's engine (it restarted, or the lease
        # lapsed): the requests it held are gone there, so what is left cannot be
        # replayed faithfully.
        raise CLIError(
            f"{target}: the daemon lost this replay's engine session mid-replay ({exc}); "
            "its requests are gone there: start the replay again"
        ) from None


class _Shown:
    """Where the replay is: a bar on a terminal, the daemon's dashboard (the reporter), and
    the count said when it is stopped midway."""

    def __init__(self, reporter: ReplayReporter, total: int) -> None:
        self.reporter = reporter
        self.bar = _progress_bar(total)
        self.done, self.total = 0, total

    def update(self, done: int, total: int, now: float) -> None:
        self.done, self.total = done, total
        if self.bar is not None:
            self.bar[0].update(self.bar[1], completed=done)
        self.reporter.update(done, total, False)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar[0].stop()


class ReplayReporter:
    """Tells the daemon how far the replay is (ObserverService.ReportReplay), at most 4 Hz."""

    def __init__(self, observer, replay_id: str, trace: str, speed: float, policy: str) -> None:
        self.observer = observer
        self.replay_id = replay_id
        self.trace = trace
        self.speed = speed
        self.policy = policy
        self._task = None
        self._last = 0.0
        self._pending = None

    def update(self, position: int, total: int, done: bool) -> None:
        import asyncio
        import time

        from kvbudget.v1 import common_pb2

        self._pending = common_pb2.ReplayState(
            replay_id=self.replay_id, trace=self.trace, position=position, total=total,
            speed=self.speed, policy=self.policy, done=done,
        )  # fmt: skip
        now = time.monotonic()
        if (self._task is None or self._task.done()) and (done or now - self._last >= 0.25):
            self._last = now
            self._task = asyncio.get_running_loop().create_task(self._send(self._pending))

    async def _send(self, state) -> None:
        try:
            await self.observer.report_replay(state)
        except Exception:  # progress display is best effort; the replay goes on
            pass

    async def flush(self) -> None:
        if self._task is not None:
            await self._task
        if self._pending is not None and self._pending.done:
            await self._send(self._pending)


def _progress_bar(total: int):
    if not sys.stderr.isatty():
        return None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("replay"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=Console(stderr=True), transient=True,
    )  # fmt: skip
    task = progress.add_task("replay", total=total)
    progress.start()
    return progress, task
