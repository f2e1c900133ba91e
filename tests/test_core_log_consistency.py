"""The pool and the log agree after any sequence of steps, with the log's writes failing
and working again in between (hypothesis stateful, in process: the real controller,
CoreService, DecisionLog on a real file, a watcher).

Writes fail as on a disk remounted read-only: `PRAGMA query_only` on the log's own
connection makes every write fail (SQLITE_READONLY), folds included, whatever its size. (A
pinned page count fails only the writes that need a new page: with these small rows, hardly
any; tests/test_decision_log_unwritten.py does that one.)

After every step:
  * the file's rows, then the decisions a failed write kept, are every decision made, in
    the order made (none lost, none twice, no gap in the ids);
  * replaying them gives exactly the requests the controller runs;
  * watchers heard only of written decisions, in order (never one still waiting).
At the end, once writes work, everything is written and heard of.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from pathlib import Path

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController
from kvbudget.daemon.server.service import CoreOptions, CoreService
from kvbudget.daemon.log.decision_log import DecisionLog
from kvbudget.daemon.log.query import query_decisions
from kvbudget.daemon.core.records import Decision, RequestSpec
from kvbudget.daemon.server.sessions import SessionTable
from kvbudget.daemon.server.watch import WatchHub
from kvbudget.v1 import common_pb2

from test_admission_support import SMALL_LAYOUTS

RUNNING_AFTER = {"admit": True, "grow": True, "deny": True, "reclaim": True,
                 "queue": False, "reject": False, "release": False, "preempt": False, "expire": False}


class PoolAndLog(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.tmp = tempfile.TemporaryDirectory()
        self.controller = AdmissionController(SMALL_LAYOUTS["full"], 30, AdmissionConfig(max_model_len=64))
        self.log = DecisionLog(Path(self.tmp.name) / "decisions.db", unwritten_retry_s=3600.0)
        self.log.start()
        self.core = CoreService(
            self.controller, self.log, common_pb2.PoolPlan(block_size_tokens=8),
            SessionTable(5.0, max_ttl_s=3600.0, max_sessions=8), WatchHub(4),
            options=CoreOptions(tick_s=3600.0),
        )
        self.loop.run_until_complete(self.core.start())
        self.watcher = self.core.watch_hub.add(100_000)
        self.heard: list[int] = []
        self.made: list[Decision] = []
        self.next_id = 0

    @contextlib.contextmanager
    def _cursor(self):
        with self.log.store.lock:
            yield self.log.store.connection

    def _record(self, decisions: list[Decision]) -> None:
        self.made += decisions

        async def settle() -> None:
            with contextlib.suppress(Exception):  # a failed write: the caller hears UNAVAILABLE
                await self.core.record(decisions)
            await asyncio.sleep(0.005)  # the dispatcher's turn

        self.loop.run_until_complete(settle())
        self.heard += [d.seq for d in self.watcher.take()[0]]
        if self.log.num_unwritten:
            event("decisions kept by a failed write")  # (statistics: the case this is about happens)

    def _live(self) -> list[str]:
        return [r.request_id for r in [*self.controller.running_requests(), *self.controller.waiting_requests()]]

    # ------------------------------------------------------------------ steps
    @rule(prompt=st.integers(1, 40), new=st.integers(0, 24))
    def submit(self, prompt: int, new: int) -> None:
        self.next_id += 1
        now = time.time()
        spec = RequestSpec(f"r{self.next_id}", prompt, new, engine_id="e", arrival_s=now)
        self._record(self.controller.submit(spec, now))

    @precondition(lambda self: self.controller.num_running > 0)
    @rule(pick=st.integers(0, 10**6))
    def finish(self, pick: int) -> None:
        running = self.controller.running_requests()
        self._record(self.controller.finish(running[pick % len(running)].request_id, time.time()))

    @precondition(lambda self: bool(self._live()))
    @rule(pick=st.integers(0, 10**6))
    def abort(self, pick: int) -> None:
        live = self._live()
        self._record(self.controller.abort(live[pick % len(live)], time.time()))

    @rule()
    def writes_fail(self) -> None:
        with self._cursor() as cursor:
            cursor.execute("PRAGMA query_only=ON")

    @rule()
    def writes_work(self) -> None:
        with self._cursor() as cursor:
            cursor.execute("PRAGMA query_only=OFF")

    @rule()
    def retry(self) -> None:
        self.log.write_unwritten()
        self.loop.run_until_complete(asyncio.sleep(0.005))
        self.heard += [d.seq for d in self.watcher.take()[0]]

    # ------------------------------------------------------------------ what must hold
    def _written(self) -> list[dict]:
        rows = query_decisions(self.log.path, limit=None, newest_first=False)
        assert [r["id"] for r in rows] == list(range(1, len(rows) + 1))
        return rows

    @invariant()
    def the_log_is_every_decision_in_order(self) -> None:
        written = [r["seq"] for r in self._written()]
        kept = [d.seq for d in self.log.store.unwritten.decisions]
        assert written + kept == [d.seq for d in self.made]
        assert self.log.num_unwritten == len(kept)

    @invariant()
    def replaying_it_gives_what_the_pool_runs(self) -> None:
        running: dict[str, bool] = {}
        for d in self.made:  # (file + kept == made, checked above)
            running[d.request_id] = RUNNING_AFTER[d.kind.value]
        assert {rid for rid, on in running.items() if on} == {r.request_id for r in self.controller.running_requests()}
        self.controller.check_integrity()

    @invariant()
    def watchers_heard_only_what_is_written(self) -> None:
        written = [r["seq"] for r in self._written()]
        assert self.heard == written[: len(self.heard)]

    def teardown(self) -> None:
        try:
            self.writes_work()
            assert self.log.write_unwritten()
            self.loop.run_until_complete(asyncio.sleep(0.05))
            self.heard += [d.seq for d in self.watcher.take()[0]]
            assert self.heard == [d.seq for d in self.made]  # everything heard of, once written
            self.the_log_is_every_decision_in_order()
        finally:
            self.loop.run_until_complete(asyncio.wait_for(self.core.stop(), 30))  # (a hang fails)
            self.log.close()
            self.loop.close()
            self.tmp.cleanup()


PoolAndLog.TestCase.settings = settings(max_examples=30, stateful_step_count=25, deadline=None)
test_the_pool_and_the_log_agree_through_failed_writes = PoolAndLog.TestCase
