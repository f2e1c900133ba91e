"""`kvbudget log -f`: the newest matching decisions, then each new one as it is committed.

A real DecisionLog (its writer thread, its folds) writes while a real `kvbudget log -f`
process reads the same file, as on a host where the daemon runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvbudget.daemon.log.decision_log import DecisionLog
from kvbudget.daemon.core.records import Decision, DecisionKind, Reason

WAIT_S = 30.0  # bounds a hang only: the follower polls every 0.25 s
# `kvbudget` with Ctrl-C as a terminal gives it: a shell's background job ignores SIGINT and
# its children inherit that (then Python installs no KeyboardInterrupt). Set by the child's
# own first statement: a preexec_fn (Python code between fork and exec) hung the child in
# CI, the test process having other threads (gRPC's, from earlier tests).
KVBUDGET_WITH_CTRL_C = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv[0] = 'kvbudget'; runpy.run_module('kvbudget', run_name='__main__', alter_sys=True)"
)


def decision(seq: int, kind: DecisionKind = DecisionKind.ADMIT, engine: str = "vllm-0") -> Decision:
    return Decision(seq=seq, time_s=float(seq), kind=kind, reason=Reason.FITS, request_id=f"req-{seq}",
                    engine_id=engine, prompt_tokens=100, max_new_tokens=10)


class Follower:
    """`kvbudget log -f ...` running, its stdout read line by line on a thread."""

    def __init__(self, db: Path, *args: str) -> None:
        env = {**os.environ, "COLUMNS": "220", "TZ": "UTC"}
        self.process = subprocess.Popen(
            [sys.executable, "-c", KVBUDGET_WITH_CTRL_C, "log", "--db", str(db), "-f", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.stderr_at_end = ""  # (set by `following`)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def take(self, count: int) -> list[str]:
        return [self.lines.get(timeout=WAIT_S) for _ in range(count)]

    def interrupt(self) -> tuple[int, str]:
        """Ctrl-C: its exit status and stderr."""
        self.process.send_signal(signal.SIGINT)
        code = self.process.wait(WAIT_S)
        assert self.process.stderr is not None
        return code, self.process.stderr.read()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@contextlib.contextmanager
def following(db: Path, *args: str) -> Iterator[Follower]:
    """A Follower, Ctrl-C'd at the end of the block, which it must end by (exit 130, no
    traceback); killed if the block failed. Its stderr is then `follower.stderr_at_end`."""
    follower = Follower(db, *args)
    try:
        yield follower
        code, follower.stderr_at_end = follower.interrupt()
        assert code == 130 and "Traceback" not in follower.stderr_at_end, follower.stderr_at_end
    finally:
        follower.kill()


@pytest.fixture
def live_log(tmp_path: Path):
    log = DecisionLog(tmp_path / "decisions.db", fold_interval_s=0.01)  # folds run under the follower
    log.start()
    yield log
    log.close()


def seqs(lines: list[str]) -> list[int]:
    return [json.loads(line)["seq"] for line in lines]


def test_follow_prints_the_newest_ten_then_each_new_decision_until_ctrl_c(live_log: DecisionLog) -> None:
    live_log.append([decision(seq) for seq in range(15)]).result()
    follower = Follower(live_log.path, "--json")
    try:
        assert seqs(follower.take(10)) == list(range(5, 15))  # journalctl -f's ten, oldest first
        live_log.append([decision(15), decision(16)]).result()
        assert seqs(follower.take(2)) == [15, 16]
        for seq in range(17, 20):  # one commit at a time, each seen once, in order
            live_log.commit_inline([decision(seq)])
        assert seqs(follower.take(3)) == [17, 18, 19]
        code, stderr = follower.interrupt()
    finally:
        follower.kill()
    assert code == 130 and "Traceback" not in stderr  # Ctrl-C: quiet, the shell's usual status
    assert follower.lines.empty()  # nothing twice


def test_follow_with_a_filter_shows_only_new_matches_and_no_history(live_log: DecisionLog) -> None:
    live_log.append([decision(seq) for seq in range(5)]).result()  # admits: none match
    follower = Follower(live_log.path, "--json", "--kind", "preempt", "--engine", "vllm-1")
    try:
        live_log.append([
            decision(100, DecisionKind.PREEMPT, "vllm-1"), decision(101, DecisionKind.PREEMPT, "vllm-0"),
            decision(102, DecisionKind.RELEASE, "vllm-1"), decision(103, DecisionKind.PREEMPT, "vllm-1"),
        ]).result()
        assert seqs(follower.take(2)) == [100, 103]
        code, _ = follower.interrupt()
    finally:
        follower.kill()
    assert code == 130 and follower.lines.empty()


def test_follow_as_a_table_prints_one_header_and_lines_up_every_batch(live_log: DecisionLog) -> None:
    live_log.append([decision(1), decision(2)]).result()
    follower = Follower(live_log.path)
    try:
        header, rule, first, second = follower.take(4)
        live_log.append([decision(3, DecisionKind.RELEASE)]).result()
        (third,) = follower.take(1)
        follower.interrupt()
    finally:
        follower.kill()
    assert header.split()[:4] == ["time", "┃", "seq", "┃"] and set(rule) <= {"━", "╇"}
    assert [line.split("│")[4].strip() for line in (first, second, third)] == ["req-1", "req-2", "req-3"]
    bars = {tuple(i for i, c in enumerate(line) if c in "┃│") for line in (header, first, second, third)}
    assert len(bars) == 1  # the same column positions in the first batch and the later one
    assert follower.lines.empty()  # no second header


def test_follow_as_a_table_heads_the_first_rows_even_when_none_matched_at_first(live_log: DecisionLog) -> None:
    live_log.append([decision(1)]).result()  # an admit: no match
    follower = Follower(live_log.path, "--kind", "release")
    try:
        (waiting,) = follower.take(1)
        live_log.append([decision(2, DecisionKind.RELEASE)]).result()
        header, rule, row = follower.take(3)
        follower.interrupt()
    finally:
        follower.kill()
    assert waiting.startswith("following ") and waiting.endswith(": no matching decisions yet")
    assert header.split()[:4] == ["time", "┃", "seq", "┃"] and set(rule) <= {"━", "╇"}  # (it had none)
    assert row.split("│")[4].strip() == "req-2"


def test_follow_as_csv_writes_the_header_once(live_log: DecisionLog) -> None:
    live_log.append([decision(1)]).result()
    follower = Follower(live_log.path, "--csv")
    try:
        header, first = follower.take(2)
        live_log.append([decision(2)]).result()
        (second,) = follower.take(1)
        follower.interrupt()
    finally:
        follower.kill()
    assert header.startswith("id,logged_at,seq,")
    assert first.split(",")[2] == "1" and second.split(",")[2] == "2"
    assert follower.lines.empty()
