"""The clock leases run on: monotonic time, less the spells the daemon itself did not run.

A lease judges an engine silent. While the daemon does not run (SIGSTOP, a debugger, its VM
or container paused, a swap storm), nothing it could hear of the engine reaches it: the
heartbeats wait in the socket. On the plain monotonic clock, the first tick after such a
spell found every lease lapsed and expired every engine at once, their requests and
blocks with them, though each had heartbeated on time.

The core's ticker wakes every `tick_s`. A wake later than that by more than `grace_s` is a
spell the daemon did not run, and that time does not count on this clock: leases are held
through it. A wake late by less (a long step, a GC pause) counts as usual. Until the
ticker has seen a spell, `now` already leaves it out, so a call served first after a
spell (a queued heartbeat) does not find its session lapsed either.
"""

from __future__ import annotations

import math
import time

STALL_GRACE_S = 1.0  # how late the ticker may wake before the lateness is a spell not run


class LeaseClock:
    def __init__(self, grace_s: float = STALL_GRACE_S) -> None:
        self.grace_s = grace_s
        self.not_run_s = 0.0  # the spells not run, in all
        self._spell_from = math.inf  # monotonic: the last wake + tick_s + grace_s (none yet: never)

    def tick(self, now_monotonic: float, tick_s: float) -> float:
        """The ticker woke at `now_monotonic` (it sleeps `tick_s`): the spell it finds the
        daemon did not run, in seconds (0.0 for none), from now on left out of `now`."""
        spell = max(0.0, now_monotonic - self._spell_from)
        self.not_run_s += spell
        self._spell_from = now_monotonic + tick_s + self.grace_s
        return spell

    def now(self, now_monotonic: float | None = None) -> float:
        """Lease time: compare `Session.expires_at` with this, and renew from it. (Every Step
        asks: one call, no helpers.)"""
        monotonic = time.monotonic() if now_monotonic is None else now_monotonic
        late = monotonic - self._spell_from
        return monotonic - self.not_run_s - (late if late > 0.0 else 0.0)
