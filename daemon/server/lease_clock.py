"""The clock leases run on: monotonic time, less the spells the daemon itself did not run
(SIGSTOP, a paused VM): engines' heartbeats wait in the socket meanwhile, so those spells
must not expire every lease at once."""

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
