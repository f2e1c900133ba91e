"""A real daemon whose decision log loses its WAL (and its index, `-shm`) under an operator's
`rm` while engines step: every decision an engine was told of is in the file afterwards,
once, in seq order, whether the daemon then stops (SIGTERM) or is killed (SIGKILL) and
started again on the same file; and readers in other processes (sqlite3, `kvbudget log`,
Datasette) see what the daemon writes after the heal.

The unit tests of the heal itself (one process) are in test_decision_log_wal_removed.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from kvbudget.client import EngineClient
from kvbudget.daemon.core.records import RequestSpec

from daemon_harness import DaemonProcess

pytestmark = pytest.mark.slow

WAIT_S = 30.0  # bounds a hang only
HEALED = "new WAL is started"  # (the daemon's warning once it healed the log)


def wal_of(daemon: DaemonProcess) -> Path:
    return Path(f"{daemon.db_path}-wal")


def shm_of(daemon: DaemonProcess) -> Path:
    return Path(f"{daemon.db_path}-shm")


class Engines:
    """Engines that step (a request admitted, then finished: two decisions per request) and
    keep the seq of every decision they were told of."""

    def __init__(self, daemon: DaemonProcess, count: int) -> None:
        self.clients = [EngineClient(daemon.target, f"engine-{n}", lease_ttl_s=30) for n in range(count)]
        self.received: list[int] = []
        self.requests = 0

    async def __aenter__(self) -> Engines:
        for client in self.clients:
            await client.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        for client in self.clients:
            await client.close()

    async def step(self, rounds: int) -> None:
        """Each engine: `rounds` requests, one after another, all engines at once."""

        async def one(client: EngineClient) -> None:
            for _ in range(rounds):
                self.requests += 1
                request_id = f"{client.engine_id}-{self.requests}"
                for decision in await client.step(submits=[RequestSpec(request_id, 16, 16)]):
                    self.received.append(decision.seq)
                for decision in await client.step(finishes=[request_id]):
                    self.received.append(decision.seq)

        await asyncio.gather(*(one(client) for client in self.clients))

    async def step_until_healed(self, daemon: DaemonProcess, heals: int) -> None:
        """Steps until the daemon's journal has said `heals` heals in all (a write after the
        file check's interval notices the change)."""
        for _ in range(10_000):  # (the bound only ends a hang)
            await self.step(1)
            if daemon.stderr().count(HEALED) >= heals:
                return
        pytest.fail(f"the daemon never healed the log: {daemon.stderr()}")


def seqs_in_the_file(db_path: Path) -> list[int]:
    """Every decision's seq as a new reader sees the file, in id order, after checking that the
    file is whole, that the ids run without a gap (from 1 unless retention deleted some) and that every row was folded exactly once
    (in the indexed table, none left in the recent one: the daemon stopped, or started again)."""
    reader = sqlite3.connect(db_path)
    try:
        assert reader.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        rows = reader.execute("SELECT id, seq FROM decisions ORDER BY id").fetchall()
        assert reader.execute("SELECT count(*) FROM decisions_recent").fetchone() == (0,)
        assert reader.execute("SELECT count(*) FROM decisions_indexed").fetchone() == (len(rows),)
    finally:
        reader.close()
    first_id = rows[0][0] if rows else 1  # (1 unless retention deleted the oldest)
    assert [row_id for row_id, _ in rows] == list(range(first_id, first_id + len(rows)))
    return [seq for _, seq in rows]


def assert_every_decision_received_is_logged_once_in_order(engines: Engines, db_path: Path) -> None:
    logged = seqs_in_the_file(db_path)
    assert logged[0] == 1  # (no retention here: every decision since the start)
    assert logged == sorted(set(logged))  # in seq order, none twice
    assert len(engines.received) == len(set(engines.received))  # each told once
    # Every request: an ADMIT and a RELEASE (16 + 16 tokens: 2 blocks, never short of the 64).
    assert len(engines.received) == 2 * engines.requests
    assert set(engines.received) <= set(logged)


def read_with_kvbudget_log(db_path: Path, *, healed: bool = True) -> None:
    """`kvbudget log` reads the file while the daemon writes it: a clean exit once the log is
    healed. Before (the WAL gone, the heal not yet come), what was not checkpointed yet is out
    of a reader's sight (in a new file, the log's tables too): a one-line error at worst."""
    result = subprocess.run(
        [sys.executable, "-m", "kvbudget", "log", "--db", str(db_path), "--limit", "3"],
        capture_output=True, text=True, timeout=WAIT_S,
    )
    assert "Traceback" not in result.stderr
    if healed:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode == 0 or len(result.stderr.splitlines()) == 1, result.stderr


async def operator_removes_and_replaces_the_wal(daemon: DaemonProcess, engines: Engines) -> int:
    """Between steps: `rm decisions.db-wal`; `rm` twice in a row; `rm` of the WAL and its
    index; the WAL replaced by an empty file. Readers in other processes read meanwhile.
    Returns the heals the daemon's journal should say."""
    await engines.step(20)
    wal_of(daemon).unlink()
    read_with_kvbudget_log(daemon.db_path, healed=False)
    await engines.step_until_healed(daemon, 1)
    read_with_kvbudget_log(daemon.db_path)

    wal_of(daemon).unlink()
    await engines.step(1)
    heals = 2
    if wal_of(daemon).exists():  # healed before the second `rm`: which removes the new WAL
        wal_of(daemon).unlink()
        heals = 3
    await engines.step_until_healed(daemon, heals)

    wal_of(daemon).unlink()
    shm_of(daemon).unlink()
    read_with_kvbudget_log(daemon.db_path, healed=False)
    heals += 1
    await engines.step_until_healed(daemon, heals)
    read_with_kvbudget_log(daemon.db_path)

    replacement = Path(f"{daemon.db_path}-wal.new")
    replacement.write_bytes(b"")
    os.replace(replacement, wal_of(daemon))
    heals += 1
    await engines.step_until_healed(daemon, heals)
    await engines.step(20)
    read_with_kvbudget_log(daemon.db_path)
    return heals


def assert_the_journal_says_each_heal_once(daemon: DaemonProcess, heals: int) -> None:
    journal = daemon.stderr()
    assert journal.count(HEALED) == heals
    assert "Traceback" not in journal
    assert "writer stopped" not in journal


async def heal_under_load_then_stop(daemon: DaemonProcess) -> Engines:
    """Three engines step while the operator removes and replaces the WAL; then SIGTERM: a
    clean exit, and the journal says each heal once."""
    daemon.start()
    try:
        async with Engines(daemon, 3) as engines:
            heals = await operator_removes_and_replaces_the_wal(daemon, engines)
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(WAIT_S) == 0
    finally:
        daemon.stop()
    assert_the_journal_says_each_heal_once(daemon, heals)
    return engines


async def test_a_stopped_daemon_logged_every_decision_once_across_wal_removals(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path, lease_ttl_s=30)
    engines = await heal_under_load_then_stop(daemon)
    assert_every_decision_received_is_logged_once_in_order(engines, daemon.db_path)


async def test_a_killed_daemon_restarted_on_the_file_has_every_decision_once(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path, lease_ttl_s=30).start()
    try:
        engines = Engines(daemon, 3)
        await engines.__aenter__()
        heals = await operator_removes_and_replaces_the_wal(daemon, engines)
        daemon.signal(signal.SIGKILL)
        daemon.wait(WAIT_S)
        for client in engines.clients:
            await client.close()
    finally:
        daemon.stop()
    assert_the_journal_says_each_heal_once(daemon, heals)
    with DaemonProcess(tmp_path, lease_ttl_s=30):
        pass  # (the restart folds what the kill left unfolded, and stops)
    assert_every_decision_received_is_logged_once_in_order(engines, daemon.db_path)


async def test_retention_folds_and_purges_go_on_across_heals(tmp_path: Path) -> None:
    """Small bounds keep the writer thread folding and purging while the heals come: it stays
    alive (a dead writer fails every commit from then on), and the rows kept are the newest,
    each once."""
    daemon = DaemonProcess(tmp_path, "--retention-max-rows", "100", lease_ttl_s=30)
    engines = await heal_under_load_then_stop(daemon)
    logged = seqs_in_the_file(daemon.db_path)
    assert logged == sorted(set(logged))
    assert len(engines.received) == 2 * engines.requests
    # What retention kept is the newest of what the engines were told (expiries and the like
    # aside: these engines close their sessions with nothing held).
    kept = set(logged)
    assert [seq for seq in sorted(engines.received) if seq >= logged[0]] == sorted(kept & set(engines.received))


READER = """
import sqlite3, sys
reader = sqlite3.connect(sys.argv[1])  # kept open, as Datasette or `kvbudget log -f` keeps it
for _ in sys.stdin:
    print(reader.execute("SELECT max(seq) FROM decisions").fetchone()[0], flush=True)
"""


async def test_a_reader_that_stays_open_sees_the_decisions_written_after_the_wal_and_its_index_were_removed(
    tmp_path: Path,
) -> None:
    """`rm decisions.db-wal decisions.db-shm`: the daemon's connections kept the removed index
    (`-shm`, which SQLite shares among a process's connections) when it healed the WAL, and a
    reader in another process made a new one at that name. The two then never saw each other's
    changes: a reader that stayed open saw the log stop where the first read found it."""
    daemon = DaemonProcess(tmp_path, lease_ttl_s=30).start()
    try:
        async with Engines(daemon, 2) as engines:
            await engines.step(5)
            wal_of(daemon).unlink()
            shm_of(daemon).unlink()
            await engines.step_until_healed(daemon, 1)
            reader = subprocess.Popen(
                [sys.executable, "-c", READER, str(daemon.db_path)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )
            try:

                def max_seq() -> int:
                    assert reader.stdin is not None and reader.stdout is not None
                    reader.stdin.write("\n")
                    reader.stdin.flush()
                    return int(reader.stdout.readline())

                assert max_seq() == max(engines.received)
                await engines.step(5)
                assert max_seq() == max(engines.received)  # (it stayed at the first figure)
            finally:
                reader.kill()
                reader.wait()
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(WAIT_S) == 0
    finally:
        daemon.stop()
    assert_every_decision_received_is_logged_once_in_order(engines, daemon.db_path)
