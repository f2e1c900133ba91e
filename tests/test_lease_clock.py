"""Leases are held through spells the daemon itself did not run (daemon/server/lease_clock.py).

QA: with a 3 s lease, a daemon SIGSTOPped for 4.5 s expired its engine when it ran again,
though the engine had heartbeated throughout (the heartbeats waited in the socket), and
with the default 10 s lease any pause of the host past 10 s dropped every engine at once."""

from __future__ import annotations

import asyncio
import signal

import pytest

from kvbudget.client import EngineClient
from kvbudget.daemon.server.lease_clock import LeaseClock
from kvbudget.daemon.core.records import RequestSpec
from kvbudget.daemon.server.sessions import SessionTable

from daemon_harness import DaemonProcess, await_until

LEASE_S = 6
SPELL_S = 9.0  # longer than a lease: a daemon that counted it would expire the engine


def test_lateness_past_the_grace_is_left_out_and_the_clock_stays_continuous() -> None:
    clock = LeaseClock(grace_s=1.0)
    assert clock.tick(100.0, 0.1) == 0.0  # the first wake: nothing to compare with
    assert clock.now(100.05) == 100.05
    assert clock.tick(100.2, 0.1) == 0.0  # 0.1 s late: counts
    assert clock.now(101.0) == 101.0  # 0.7 s late, within the grace: counts
    # 5.1 s since the last wake: 0.1 the tick, 1.0 the grace, 4.0 a spell not run. Before
    # the ticker sees it, a call served first already finds the spell left out...
    assert clock.now(105.3) == pytest.approx(101.3)
    assert clock.tick(105.3, 0.1) == pytest.approx(4.0)
    # ...and the ticker's seeing it moves nothing: the same now, then on at one second a second.
    assert clock.now(105.3) == pytest.approx(101.3)
    assert clock.now(105.4) == pytest.approx(101.4)
    assert clock.not_run_s == pytest.approx(4.0)


def test_a_lease_is_held_through_a_spell_and_lapses_on_silence_after() -> None:
    table = SessionTable(default_ttl_s=3.0, max_ttl_s=60.0, max_sessions=4)
    clock = table.clock
    clock.tick(100.0, 0.1)
    session = table.open("engine-a", 3.0, clock.now(100.0))  # renewed last at 100.0: to 103.0
    clock.tick(100.1, 0.1)
    assert table.expired(clock.now(108.1)) == []  # 8.1 s later on the wall, of which 6.9 not run
    clock.tick(108.1, 0.1)
    # 1.2 s of silence counted (0.1 before the spell, then its tick and the grace): 1.8 s left
    assert session.lease_remaining_s(clock.now(108.1)) == pytest.approx(1.8)
    for i in range(1, 18):  # the daemon runs again, waking on time to 109.8
        clock.tick(108.1 + i / 10, 0.1)
    assert table.expired(clock.now(109.8)) == []  # 0.1 s left
    assert table.expired(clock.now(109.95)) == [session]  # silent past it: lapsed


async def test_a_stopped_daemon_keeps_an_engine_that_heartbeated_meanwhile(tmp_path) -> None:
    """A real daemon (6 s leases) SIGSTOPped for 9 s while its engine heartbeats every 2 s:
    the engine's session and request live on, the log has no expire, the journal says why.
    (6 s, not 3: a heartbeat the spell held counts as silence, up to a tick, the grace and a
    heartbeat's period; the rest is the margin left to a loaded machine.)"""
    with DaemonProcess(tmp_path, lease_ttl_s=LEASE_S) as daemon:
        engine = EngineClient(daemon.target, "held-through", lease_ttl_s=LEASE_S)  # (heartbeats every 2 s)
        await engine.open()
        try:
            [admitted] = await engine.step(submits=[RequestSpec("r1", 16, 16)])
            assert admitted.kind.value == "admit"
            daemon.signal(signal.SIGSTOP)
            try:
                await asyncio.sleep(SPELL_S)
            finally:
                daemon.signal(signal.SIGCONT)

            async def said() -> bool:  # (awaited: a blocking wait here would hold the heartbeats)
                return "the daemon did not run for about" in daemon.stderr()

            await await_until(said)  # the ticker ran after the spell: a lapse would be taken now
            [released] = await engine.step(finishes=["r1"])
            assert (released.kind.value, released.reason.value) == ("release", "finished")
            assert engine.sessions_opened == 1  # never lost and re-opened
        finally:
            await engine.close()
        kinds = [row["kind"] for row in daemon.decision_rows()]
        assert "expire" not in kinds and "lease of engine" not in daemon.stderr()
