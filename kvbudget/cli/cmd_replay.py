"""`kvbudget replay`: play a request trace through a simulated engine, live or offline.

  kvbudget replay mooncake --offline --model gemma-3-27b --num-gpu-blocks 20000 \\
      --compare naive,optimistic,guaranteed,predictive --report out/
  kvbudget replay azure --target unix:///run/kvbudget/kvbudget.sock --speed 20
  kvbudget replay azure --target gpu7:50051 --token $T --tls-ca ca.pem \\
      --tls-cert me.pem --tls-key me.key

TRACE is a file (Mooncake JSONL, Azure CSV, or a plain CSV/JSONL of arrival_s,
prompt_tokens, output_tokens; gzip-compressed or not) or a shipped trace name: `mooncake`,
`azure`. Its rows are replayed in time order (sorted by arrival if the file is not);
--start and --limit pick from that order.
Offline, the admission core runs in this process; live, the daemon at --target decides,
and its model, pool and limits come from its pool plan (the offline-only flags are refused).

Offline and live decide alike for the same trace, policy, model, pool and
--grow-ahead-blocks (whose defaults differ: 4 offline, 16 live), on a fresh daemon with
default admission settings, but for two things a live run cannot replay. The daemon
keeps time by its own clock: max_head_wait_s (aging: 30 s, after which nothing passes
the queue's head) counts wall seconds there, trace seconds offline, so at --speed X it
starts X times later in the trace, and never in a run --as-fast-as-possible. And a
daemon remembers: a predictive daemon's output lengths, and the prefix cache's
blocks, from what it served before.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import uuid
from dataclasses import replace
from pathlib import Path
from kvbudget.client.tls import channel_credentials, resolve_tls
from kvbudget.client.errors import CLIError
from kvbudget.client.target import add_target_arguments, check_target, resolve_target, resolve_token, rpc_error_line

POLICY_NAMES = ("optimistic", "guaranteed", "predictive", "naive")
DEFAULT_MODEL = "llama-3.1-8b"
DEFAULT_KV_BYTES = 16 * 2**30  # offline pool when no size is given: 16 GiB of KV cache
# Flags that shape the in-process model, pool and step budget. Live, the daemon's plan says
# all of that, so one of them given there would be silently ignored (or, --max-model-len,
# half-applied): refused instead.
OFFLINE_ONLY = ("model", "num_gpu_blocks", "kv_cache_memory_bytes", "block_size", "max_model_len",
                "no_prefix_caching", "max_num_batched_tokens")  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = __doc__
    parser.add_argument("trace", metavar="TRACE", help="trace file, or `mooncake` / `azure`")
    where = parser.add_argument_group("where admission runs")
    where.add_argument("--offline", action="store_true", help="run the admission core in-process")
    add_target_arguments(where, token_help="live: bearer token for a TCP daemon")
    where.add_argument("--policy", choices=POLICY_NAMES,
                       help="offline: the policy (optimistic); live: switch the daemon to it first")  # fmt: skip
    where.add_argument("--compare", metavar="P1,P2,...", help="offline: run each policy on the same setup")
    model = parser.add_argument_group("model and pool (offline only; live: the daemon's plan)")
    model.add_argument("--model", metavar="PRESET|PATH", help=f"model preset or config.json ({DEFAULT_MODEL})")
    model.add_argument("--num-gpu-blocks", metavar="N",
                       help="pool size in blocks, the null block included, as the daemon's flag")  # fmt: skip
    model.add_argument("--kv-cache-memory-bytes", metavar="SIZE", help="pool size in bytes (16GiB)")
    model.add_argument("--block-size", metavar="N", help="tokens per block (16; 64 for MLA models)")
    model.add_argument("--max-model-len", metavar="N", help="longest request (the model's)")
    model.add_argument("--no-prefix-caching", action="store_true", help="disable prefix caching")
    engine = parser.add_argument_group("simulated engine")
    engine.add_argument("--engines", metavar="K", default="1", help="engines sharing the pool (1)")
    engine.add_argument("--max-num-seqs", metavar="N", default="256", help="sequences per engine (256)")
    engine.add_argument("--max-num-batched-tokens", metavar="N",
                        help="offline only: tokens per step (8192; live: the daemon's)")  # fmt: skip
    # A floor, not a cap: the trace says how many tokens each request produced, and an
    # engine cannot produce more than max_tokens, so a longer output asks for its length.
    engine.add_argument("--max-new-tokens", metavar="N",
                        help="max_tokens each request asks for, or its own output length if longer "
                        "(the whole trace's longest output)")  # fmt: skip
    engine.add_argument("--step-base-ms", metavar="MS", default="20", help="fixed cost of a step (20)")
    engine.add_argument("--per-prefill-token-us", metavar="US", default="50", help="per prefill token (50)")
    engine.add_argument("--per-decode-seq-us", metavar="US", default="0", help="per sequence in a step (0)")
    # 16, not the engine model's 4: live, every call is a round trip, and 16 blocks ahead cut
    # calls by a third on Mooncake (live 100 s -> 65 s) for about the same preemptions.
    engine.add_argument(
        "--grow-ahead-blocks", metavar="N",
        help="growth asked ahead, in blocks (live 16: fewer round trips; offline 4: on a tight "
        "pool every block asked ahead is one another request cannot have)",
    )
    run_group = parser.add_argument_group("the run")
    pace = run_group.add_mutually_exclusive_group()
    pace.add_argument("--speed", metavar="X", help="live: X trace seconds per wall second (1)")
    pace.add_argument("--as-fast-as-possible", action="store_true", help="live: no pacing")
    run_group.add_argument("--limit", metavar="N", help="replay at most N requests (after --start)")
    run_group.add_argument("--start", metavar="S", help="skip the S earliest requests (0)")
    run_group.add_argument("--seed", metavar="N", default="0", help="spreads same-timestamp arrivals (0)")
    run_group.add_argument("--skip-bad-rows", action="store_true", help="skip malformed rows, count them")
    run_group.add_argument("--json", action="store_true", help="print JSON instead of a table")
    run_group.add_argument("--report", metavar="DIR", help="write PNG plots and JSON into DIR")


# ----------------------------------------------------------------------- parsing


def _int(text: str | None, flag: str, *, minimum: int = 1) -> int | None:
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise CLIError(f"{flag} {text!r}: expected an integer") from None
    if value < minimum:
        raise CLIError(f"{flag} must be >= {minimum}, got {text!r}")
    return value


def _float(text: str | None, flag: str, *, positive: bool = False) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise CLIError(f"{flag} {text!r}: expected a number") from None
    if not (value == value and value != float("inf")) or value < 0 or (positive and value == 0):
        raise CLIError(f"{flag} must be {'> 0' if positive else '>= 0'} and finite, got {text!r}")
    return value


def _policies(args: argparse.Namespace) -> list[str]:
    if args.compare is not None:
        names = [p.strip() for p in args.compare.split(",") if p.strip()]
        unknown = [p for p in names if p not in POLICY_NAMES]
        if unknown or not names:
            raise CLIError(f"--compare: unknown policy {', '.join(unknown) or '(none)'}; "
                           f"choose from {', '.join(POLICY_NAMES)}")  # fmt: skip
        if args.policy:
            raise CLIError("--policy and --compare exclude each other")
        return names
    return [args.policy or "optimistic"]


def _trace_path(args: argparse.Namespace) -> Path:
    from kvbudget.traces.loaders import resolve_trace_path

    path = resolve_trace_path(args.trace)
    if not path.exists():
        raise CLIError(f"no trace {args.trace!r}: not a file and not one of mooncake, azure")
    return path


def _load(args: argparse.Namespace):
    from kvbudget.traces.loaders import TraceError, load_trace

    path = _trace_path(args)
    start = _int(args.start, "--start", minimum=0) or 0
    try:
        trace = load_trace(path, skip_bad_rows=args.skip_bad_rows, limit=_int(args.limit, "--limit"), start=start)
    except TraceError as exc:
        raise CLIError(str(exc)) from None
    if not trace.requests:
        raise CLIError(_nothing_to_replay(args.trace, trace, start))
    return trace


def _nothing_to_replay(name: str, trace, start: int) -> str:
    """Why a trace gave no request: the file has none (good ones), or --start skips them
    all (--limit is >= 1, so it alone never empties a trace)."""
    if trace.rows:
        return f"--start {start}: {name} has only {trace.rows} requests"
    if trace.skipped:
        return f"{name}: no requests to replay: all {trace.skipped} rows are malformed (skipped)"
    return f"{name}: no requests to replay: the file has a header and no rows"


# Live, each ask is a round trip, so asking further ahead buys speed; offline, asking ahead
# costs nothing but ties up blocks, which on tight pools shows up as preemptions
# (docs/replay-compare.md's Azure gpt-oss-120b run at 3,000 blocks: 25 optimistic
# preemptions and 1,060 output tok/s at 4 blocks ahead, 63 and 928 at 16).
LIVE_GROW_AHEAD_BLOCKS = 16
OFFLINE_GROW_AHEAD_BLOCKS = 4


def _grow_ahead_blocks(args: argparse.Namespace) -> int:
    if args.grow_ahead_blocks is None:
        return OFFLINE_GROW_AHEAD_BLOCKS if args.offline else LIVE_GROW_AHEAD_BLOCKS
    return _int(args.grow_ahead_blocks, "--grow-ahead-blocks", minimum=0) or 0


def _engine_config(args: argparse.Namespace, trace, *, max_model_len: int, max_num_batched_tokens: int):
    from kvbudget.traces.engine_sim import EngineConfig

    try:
        return EngineConfig(
            max_num_seqs=_int(args.max_num_seqs, "--max-num-seqs") or 256,
            max_num_batched_tokens=max_num_batched_tokens,
            step_base_s=(_float(args.step_base_ms, "--step-base-ms") or 0.0) / 1e3,
            per_prefill_token_s=(_float(args.per_prefill_token_us, "--per-prefill-token-us") or 0.0) / 1e6,
            per_decode_seq_s=(_float(args.per_decode_seq_us, "--per-decode-seq-us") or 0.0) / 1e6,
            grow_ahead_blocks=_grow_ahead_blocks(args),
            max_model_len=max_model_len,
            # The whole file's longest output, not the slice's: what the service evidently
            # capped at, so a what-if does not change with --start / --limit.
            max_new_tokens=_int(args.max_new_tokens, "--max-new-tokens") or trace.max_output_tokens or None,
        )
    except ValueError as exc:
        raise CLIError(str(exc)) from None


def _offline_setup(args: argparse.Namespace, trace):
    from kvbudget.cli.cmd_estimate import parse_count, parse_size
    from kvbudget.daemon.config import sizing
    from kvbudget.daemon.config.hf_config import load_model, resolve_max_model_len
    from kvbudget.traces.replay import ReplaySetup

    block_size = _int(args.block_size, "--block-size")  # None: the model's (16; 64 for MLA)
    try:
        model = load_model(args.model or DEFAULT_MODEL, block_size=block_size)
    except ValueError as exc:
        raise CLIError(f"--model: {exc}") from None
    layout = model.layout
    if args.num_gpu_blocks and args.kv_cache_memory_bytes:
        raise CLIError("--num-gpu-blocks and --kv-cache-memory-bytes exclude each other")
    if args.num_gpu_blocks:
        pool = sizing.size_from_num_blocks(layout, parse_count(args.num_gpu_blocks, "--num-gpu-blocks"))
    else:
        kv_bytes = (
            parse_size(args.kv_cache_memory_bytes, "--kv-cache-memory-bytes")
            if args.kv_cache_memory_bytes
            else DEFAULT_KV_BYTES
        )
        pool = sizing.size_from_kv_cache_bytes(layout, kv_bytes)
    # Sizing counts blocks as vLLM's num_gpu_blocks does, the null block included; like
    # the daemon (server.py), hand the admission core the usable ones, so the what-if's
    # pool, and the num_blocks it reports, are a daemon's with the same flag.
    if pool.num_blocks < 2:
        raise CLIError(
            f"the pool gets {pool.num_blocks} blocks of {layout.bytes_per_block} bytes; it needs at least 2"
            " (one is the null block): raise --num-gpu-blocks / --kv-cache-memory-bytes"
        )
    try:  # as estimate and the daemon do: not past the model's max_position_embeddings
        max_model_len = resolve_max_model_len(model, _int(args.max_model_len, "--max-model-len"), name="--max-model-len")
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    engine = _engine_config(
        args, trace, max_model_len=max_model_len,
        max_num_batched_tokens=_int(args.max_num_batched_tokens, "--max-num-batched-tokens") or 8192,
    )  # fmt: skip
    return ReplaySetup(
        layout=layout,
        num_blocks=pool.num_blocks - 1,
        engine=engine,
        model=model.name,
        engines=_int(args.engines, "--engines") or 1,
        seed=_int(args.seed, "--seed", minimum=0) or 0,
        enable_prefix_caching=not args.no_prefix_caching,
    )


# --------------------------------------------------------------------------- run


def run(args: argparse.Namespace) -> int:
    policies = _policies(args)
    if args.offline and (args.target or args.token):
        raise CLIError("--offline runs in-process; drop --target / --token")
    if args.offline and (args.tls_ca or args.tls_cert or args.tls_key):
        raise CLIError("--offline runs in-process, with no daemon to talk TLS to; "
                       "drop --tls-ca / --tls-cert / --tls-key")  # fmt: skip
    if args.offline and (args.speed or args.as_fast_as_possible):
        raise CLIError("--speed / --as-fast-as-possible pace a live replay; offline runs at full speed")
    if not args.offline and args.compare:
        raise CLIError("--compare needs --offline (one daemon runs one policy at a time)")
    _trace_path(args)  # a typo in the trace's name is said first, whatever else is wrong
    if not args.offline:
        _refuse_offline_only(args)
        # Checked before the trace is even read: a typo or a daemon that is not there is
        # one line at once, not a wait for the first call's deadline.
        args.target = check_target(resolve_target(args.target))
        args.token = resolve_token(args.token)
        args.credentials = channel_credentials(resolve_tls(args.target, args.tls_ca, args.tls_cert, args.tls_key))
    if args.report:
        _prepare_report_dir(args.report)  # before the run, not after it
    trace = _load(args)
    if args.offline:
        results = _run_offline(args, trace, policies)
    else:
        results = [_run_live(args, trace)]
    _print(args, results, trace)
    if args.report:
        from kvbudget.traces.report import write_report

        try:
            write_report(results, args.report)
        except ImportError:
            raise CLIError("--report needs matplotlib: pip install 'kvbudget[plots]'") from None
        except OSError as exc:
            raise CLIError(f"--report {args.report}: {exc.strerror or exc}") from None
    return 0


def _refuse_offline_only(args: argparse.Namespace) -> None:
    given = ["--" + name.replace("_", "-") for name in OFFLINE_ONLY if getattr(args, name)]
    if given:
        raise CLIError(f"{' / '.join(given)}: offline only; live, the daemon's plan sets the model, pool and "
                       f"limits: drop {'it' if len(given) == 1 else 'them'} or add --offline")  # fmt: skip


def _prepare_report_dir(folder: str) -> None:
    """--report DIR exists (made if need be) and is writable, and matplotlib is there."""
    if importlib.util.find_spec("matplotlib") is None:
        raise CLIError("--report needs matplotlib: pip install 'kvbudget[plots]'")
    path = Path(folder)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise CLIError(f"--report {folder}: exists and is not a directory") from None
    except OSError as exc:
        raise CLIError(f"--report {folder}: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise CLIError(f"--report {folder}: directory is not writable")


def _run_offline(args: argparse.Namespace, trace, policies: list[str]):
    from kvbudget.daemon.core.admission import AdmissionError
    from kvbudget.traces.replay import run_offline

    setup = replace(_offline_setup(args, trace), spread_s=trace.arrival_quantum_s)
    results = []
    for policy in policies:
        try:
            results.append(run_offline(trace.requests, setup, policy, trace_name=trace.name))
        except AdmissionError as exc:
            raise CLIError(f"--{exc.field.replace('_', '-')}: {exc}") from None
    for r in results:  # the model layout's notes, as `kvbudget estimate` reports them
        r.summary["notes"] = list(setup.layout.notes)
    return results


def _print(args: argparse.Namespace, results, trace) -> None:
    from kvbudget.traces.results import as_json, render_table

    if trace.skipped:
        for r in results:
            r.summary["skipped_rows"] = trace.skipped
    if args.json:
        print(as_json(results))
        return
    from kvbudget.cli.console import cli_console

    console = cli_console()  # (markup off: "[b]" in a trace's or a model's name is text)
    console.print(render_table(results))
    # Offline, the layout's notes (why the block size is 64 for an MLA model, ...), as
    # estimate prints them; live, the daemon logged its own at start.
    notes = results[0].summary.get("notes")
    for note in notes if isinstance(notes, list) else ():
        console.print(f"note: {note}")
    if trace.skipped:
        print(f"{trace.skipped} malformed rows skipped", file=sys.stderr)


# -------------------------------------------------------------------------- live


def _run_live(args: argparse.Namespace, trace):
    import asyncio

    speed = None if args.as_fast_as_possible else (_float(args.speed, "--speed", positive=True) or 1.0)
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
    import asyncio

    import grpc

    from kvbudget.client import ObserverClient, SessionLost
    from kvbudget.daemon.wire.layout import layout_from_plan
    from kvbudget.traces.replay import ReplaySetup, run_live

    target = args.target  # checked and resolved in run()
    _stop_on_signals([] if stopped_by is None else stopped_by)
    replay_id = uuid.uuid4().hex[:8]
    async with ObserverClient(target, args.token, credentials=args.credentials) as observer:
        try:
            # Not waiting for a connection: a target nobody serves says "Connection refused"
            # at once, as doctor and admin do, not DEADLINE_EXCEEDED after 5 s.
            snapshot = await observer.snapshot(timeout=5.0, wait_for_ready=False)
            if args.policy:
                await observer.set_policy(args.policy)
        except grpc.aio.AioRpcError as exc:
            raise CLIError(rpc_error_line(target, exc)) from None
        plan = snapshot.plan
        try:
            layout = layout_from_plan(plan)
        except ValueError as exc:  # a plan this client cannot read whole
            raise CLIError(f"the daemon's pool plan: {exc}") from None
        engine = _engine_config(
            args, trace, max_model_len=plan.max_model_len_tokens,
            max_num_batched_tokens=plan.max_num_batched_tokens or 8192,
        )  # fmt: skip
        setup = ReplaySetup(
            layout=layout, num_blocks=plan.num_blocks, engine=engine, model=plan.model,
            engines=_int(args.engines, "--engines") or 1, seed=_int(args.seed, "--seed", minimum=0) or 0,
            spread_s=trace.arrival_quantum_s,
        )  # fmt: skip
        from kvbudget.daemon.wire import convert

        policy = args.policy or convert.policy_from_proto(snapshot.policy) or ""
        reporter = ReplayReporter(observer, replay_id, trace.name, speed or 0.0, policy)
        progress = _progress_bar(len(trace.requests))
        replayed = [0, len(trace.requests)]  # (done, total): said when stopped midway
        try:
            def on_progress(done: int, total: int, now: float) -> None:
                replayed[:] = [done, total]
                if progress is not None:
                    progress[0].update(progress[1], completed=done)
                reporter.update(done, total, False)

            try:
                result = await run_live(
                    trace.requests, setup, target=target, token=args.token, credentials=args.credentials,
                    speed=speed, trace_name=trace.name, replay_id=replay_id, on_progress=on_progress,
                )  # fmt: skip
            except grpc.aio.AioRpcError as exc:
                raise CLIError(rpc_error_line(target, exc)) from None
            except asyncio.CancelledError:
                # Ctrl-C, SIGTERM or SIGHUP: the sessions close as this unwinds and the
                # daemon releases their requests; say where it stopped (no summary: the run
                # is not the trace's).
                if progress is not None:
                    progress[0].stop()
                print(f"kvbudget replay: stopped after {replayed[0]:,} of {replayed[1]:,} requests; "
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
            reporter.update(result.summary["requests"], result.summary["requests"], True)  # type: ignore[arg-type]
            await reporter.flush()
        finally:
            if progress is not None:
                progress[0].stop()
    return result


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
