"""`kvbudget replay`: play a request trace through a simulated engine, live or offline.

The flags, the trace, the checks made before anything runs, and the output; the runs
themselves are replay_offline's and replay_live's.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

from kvbudget.cli import replay_hosts, replay_live, replay_offline
from kvbudget.cli.replay_flags import POLICY_NAMES, add_engine_model, int_flag
from kvbudget.cli.replay_offline import DEFAULT_MODEL
from kvbudget.cli.replay_variants import SYNTAX, chosen_variants
from kvbudget.client.errors import CLIError
from kvbudget.client.target import add_target_arguments, check_target, resolve_target, resolve_token
from kvbudget.client.tls import channel_credentials, resolve_tls

# `--help`'s description: the examples, and what a live run cannot replay as offline does.
DESCRIPTION = """`kvbudget replay`: play a request trace through a simulated engine, live or offline.

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
the same admission settings (offline: --config with the daemon's file, or --set), but for
two things a live run cannot replay. The daemon
keeps time by its own clock: aging (after 3x the median recent wait, or max_head_wait_s
if set, nothing passes the queue's head) counts wall seconds there, trace seconds
offline, so at --speed X a fixed cap starts X times later in the trace. And a
daemon remembers: a predictive daemon's output lengths, and the prefix cache's
blocks, from what it served before.
"""
# Flags that shape the in-process model, pool and step budget. Live, the daemon's plan says
# all of that, so one of them given there would be silently ignored (or, --max-model-len,
# half-applied): refused instead.
OFFLINE_ONLY = ("model", "num_gpu_blocks", "kv_cache_memory_bytes", "block_size", "max_model_len",
                "no_prefix_caching", "max_num_batched_tokens", "config", "set",
                "tensor_parallel_size", "pipeline_parallel_size", "token_cap")  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = DESCRIPTION
    parser.add_argument("trace", metavar="TRACE", help="trace file, or `mooncake` / `azure`")
    where = parser.add_argument_group("where admission runs")
    where.add_argument("--offline", action="store_true", help="run the admission core in-process")
    add_target_arguments(where, token_help="live: bearer token for a TCP daemon")
    where.add_argument("--policy", choices=POLICY_NAMES,
                       help="offline: the policy (optimistic); live: switch the daemon to it first")  # fmt: skip
    where.add_argument("--compare", metavar=f"{SYNTAX},...",
                       help="offline: run each policy, with its own settings if given, on the same setup")
    model = parser.add_argument_group("model and pool (offline only; live: the daemon's plan)")
    model.add_argument("--model", metavar="PRESET|PATH", help=f"model preset or config.json ({DEFAULT_MODEL})")
    model.add_argument("--num-gpu-blocks", metavar="N",
                       help="pool size in blocks, the null block included, as the daemon's flag")  # fmt: skip
    model.add_argument("--kv-cache-memory-bytes", metavar="SIZE", help="pool size in bytes (16GiB)")
    model.add_argument("--block-size", metavar="N", help="tokens per block (16; 64 for MLA models)")
    for flag in ("--tensor-parallel-size", "--pipeline-parallel-size"):  # (--kv-cache-memory-bytes is per GPU)
        model.add_argument(flag, metavar="N", help="as kvbudget estimate's (1): one GPU's pool")
    model.add_argument("--token-cap", metavar="N", help="engine caps every attention layer at N tokens")
    model.add_argument("--max-model-len", metavar="N", help="longest request (the model's)")
    model.add_argument("--no-prefix-caching", action="store_true", help="disable prefix caching")
    model.add_argument("--config", metavar="FILE",
                       help="the daemon's config file: its [admission] settings (its policy, unless "
                       "--policy / --compare) and [tenants] quotas; model and pool still from the flags")
    model.add_argument("--set", action="append", metavar="admission.KEY=VALUE",
                       help="an admission setting, as the daemon's config file names it (repeatable): "
                       "admission.backfill_depth=0, admission.watermark=0, admission.admit_on=first_chunk")
    engine = parser.add_argument_group("simulated engine")
    engine.add_argument("--engines", metavar="K", default="1", help="engines sharing the pool (1)")
    replay_hosts.add_arguments(engine)  # --hosts, --route
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
    add_engine_model(engine)
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


def run(args: argparse.Namespace) -> int:
    variants = chosen_variants(args)
    args.hosts_routes = replay_hosts.chosen(args)
    if args.offline and (args.target or args.token):
        raise CLIError("--offline runs in-process; drop --target / --token")
    if args.offline and (args.tls_ca or args.tls_cert or args.tls_key):
        raise CLIError("--offline runs in-process, with no daemon to talk TLS to; "
                       "drop --tls-ca / --tls-cert / --tls-key")  # fmt: skip
    if args.offline and (args.speed or args.as_fast_as_possible):
        raise CLIError("--speed / --as-fast-as-possible pace a live replay; offline runs at full speed")
    if not args.offline and args.compare:
        raise CLIError("--compare needs --offline (one daemon runs one policy at a time): "
                       "replay live once per run, with --policy and the daemon's config")
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
        results = replay_offline.run(args, trace, variants)
    else:
        results = [replay_live.run(args, trace)]
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


def _trace_path(args: argparse.Namespace) -> Path:
    from kvbudget.traces.loaders import resolve_trace_path

    path = resolve_trace_path(args.trace)
    if not path.exists():
        raise CLIError(f"no trace {args.trace!r}: not a file and not one of mooncake, azure")
    return path


def _load(args: argparse.Namespace):
    from kvbudget.traces.loaders import load_trace
    from kvbudget.traces.trace_request import TraceError

    path = _trace_path(args)
    start = int_flag(args.start, "--start", minimum=0) or 0
    try:
        trace = load_trace(path, skip_bad_rows=args.skip_bad_rows, limit=int_flag(args.limit, "--limit"), start=start)
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
    table = render_table(results)
    # As wide as its title ("trace · model · N blocks"), which otherwise wrapped mid-phrase
    # over a narrow table: a terminal narrower than the title still wraps it, between words.
    table.min_width = max(table.min_width or 0, len(str(table.title or "")))
    console.print(table)
    # Offline, the layout's notes (why the block size is 64 for an MLA model, ...), as
    # estimate prints them; live, the daemon logged its own at start.
    notes = results[0].summary.get("notes")
    for note in notes if isinstance(notes, list) else ():
        console.print(f"note: {note}")
    if trace.skipped:
        print(f"{trace.skipped} malformed rows skipped", file=sys.stderr)
