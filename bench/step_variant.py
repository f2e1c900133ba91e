"""`kvbudget daemon` with one part of an engine Step changed, for bench_step_parts.py.

    python bench/step_variant.py VARIANT STAGES_JSON daemon [daemon flags...]

VARIANT is one of:

  full       the daemon as shipped (the baseline the others are compared with);
  staged     as shipped, with a clock read around each stage of one-submit Steps
             (validate, apply, commit, reply; the rest of the handler is "other"); their
             medians go to STAGES_JSON when the daemon exits;
  no-commit  one-submit Steps skip the decision log's SQLite insert (the rows are
             counted, nothing is written): what the durable commit costs end to end;
  journal    one-submit Steps append their decision's row to a file beside the log with
             one os.write (marshal'd) instead of the SQLite insert, and nothing folds it
             into SQLite: the least a journal in front of SQLite would cost a commit (as
             durable as the log's WAL at synchronous=NORMAL: written to the OS, not synced);
  canned     one-submit Steps are answered with the reply of the first one, built once
             (the same bytes on the wire), and nothing else is done: what the RPC itself
             costs the Step method over the health Check;
  spin       canned, after SPIN_US microseconds of a loop that reads the clock and touches
             no memory: what a handler that long would cost the round trip if it found its
             code and data in cache (the calibration for the others); `spin:N` spins N
             microseconds instead (bench_handler_cost.py).

Only a bench uses this: the changes are made by replacing functions from outside, so the
daemon's own code has no switches for them.
"""

from __future__ import annotations

import atexit
import json
import marshal
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from kvbudget.cli.main import main
from kvbudget.daemon.wire import convert
from kvbudget.daemon.server import servicers, steps
from kvbudget.daemon.server.service import CoreService
from kvbudget.daemon.log.store import LogStore

VARIANTS = ("full", "staged", "no-commit", "journal", "canned", "spin")
SPIN_US = 100
STAGES = ("validate", "apply", "commit", "reply", "other")


def _one_submit(request: Any) -> bool:
    """The latency case of bench_roundtrip: one submit and no other op."""
    return len(request.submits) == 1 and not (request.finishes or request.aborts or request.progress or request.grows)


def _stage_timers(stages_path: str) -> None:
    samples: dict[str, list[int]] = {name: [] for name in (*STAGES, "handler")}
    clock = time.perf_counter_ns
    current: dict[str, int] = {}  # the open Step's stage times (the loop runs one at a time)

    def timed(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return function(*args, **kwargs)
            finally:
                current[name] = current.get(name, 0) + clock() - t0
        return wrapper

    steps.read_step = timed("validate", steps.read_step)  # (reading the ops is part of validating them)
    steps.validate_step = timed("validate", steps.validate_step)
    steps.apply_step = timed("apply", steps.apply_step)
    CoreService.record = timed("commit", CoreService.record)  # type: ignore[method-assign]
    convert.add_decisions = timed("reply", convert.add_decisions)
    step = servicers.EngineServicer.Step

    async def staged_step(self: Any, request: Any, context: Any) -> Any:
        current.clear()
        t0 = clock()
        reply = await step(self, request, context)
        if _one_submit(request):
            handler = clock() - t0
            samples["handler"].append(handler)
            for name in STAGES[:-1]:
                samples[name].append(current.get(name, 0))
            samples["other"].append(handler - sum(current.values()))
        return reply

    servicers.EngineServicer.Step = staged_step  # type: ignore[method-assign]

    def write() -> None:
        medians = {name: statistics.median(values) / 1000 for name, values in samples.items() if values}
        with open(stages_path, "w") as f:
            json.dump({"steps": len(samples["handler"]), "p50_us": medians}, f)

    atexit.register(write)


def _no_commit() -> None:
    insert = LogStore.insert

    def insert_but_one_row(self: LogStore, rows: list[tuple]) -> bool:
        if len(rows) == 1:  # a one-submit Step's decision: counted as written, not written
            self.next_id += 1
            self.rows_written += 1
            return False
        return insert(self, rows)

    LogStore.insert = insert_but_one_row  # type: ignore[method-assign]


def _journal(db_path: str) -> None:
    insert = LogStore.insert
    fd = os.open(db_path + ".journal", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    write, dumps = os.write, marshal.dumps

    def append_one_row(self: LogStore, rows: list[tuple]) -> bool:
        if len(rows) == 1:  # a one-submit Step's decision: one write, as a journal would
            write(fd, dumps(rows[0]))
            self.next_id += 1
            self.rows_written += 1
            return False
        return insert(self, rows)

    LogStore.insert = append_one_row  # type: ignore[method-assign]


def _canned(spin_s: float = 0.0) -> None:
    step = servicers.EngineServicer.Step
    canned: list[Any] = []
    clock = time.perf_counter

    async def canned_step(self: Any, request: Any, context: Any) -> Any:
        if not _one_submit(request):
            return await step(self, request, context)
        if not canned:
            canned.append(await step(self, request, context))
        if spin_s:
            end = clock() + spin_s
            while clock() < end:
                pass
        return canned[0]

    servicers.EngineServicer.Step = canned_step  # type: ignore[method-assign]


def run(argv: list[str]) -> int:
    variant, spin_us = (argv[0], SPIN_US) if argv else ("", SPIN_US)
    if variant.startswith("spin:") and variant[len("spin:"):].isdigit():
        variant, spin_us = "spin", int(variant[len("spin:"):])
    if len(argv) < 3 or variant not in VARIANTS or argv[2] != "daemon":
        print(f"usage: step_variant.py {{{','.join(VARIANTS)},spin:N}} STAGES_JSON daemon [flags...]", file=sys.stderr)
        return 2
    stages_path, daemon_argv = argv[1], argv[2:]
    if variant == "staged":
        _stage_timers(stages_path)
    elif variant == "no-commit":
        _no_commit()
    elif variant == "journal":
        _journal(daemon_argv[daemon_argv.index("--db-path") + 1])
    elif variant == "canned":
        _canned()
    elif variant == "spin":
        _canned(spin_us / 1e6)
    return main(daemon_argv)


if __name__ == "__main__":
    raise SystemExit(run(sys.argv[1:]))
