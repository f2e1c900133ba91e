"""How the daemon process sets up CPython for its load: the GIL's switch interval and the
cyclic garbage collector (the heap settled once serving, so a batched Step's churn does not
trigger full passes). Process-wide, so only `kvbudget daemon` makes these settings."""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator
from dataclasses import dataclass

# The daemon's threads other than the event loop (the decision log's writer, gRPC's
# poller) run in C with the GIL let go, but each must win it back to return, and so
# must the loop after every SQLite commit it makes: when the other side is running
# Python, that takes up to the switch interval (5 ms by default). At 1 ms, batched
# steps went from ~47k to ~58k decisions/s on the 2-core machine (bench_roundtrip).
GIL_SWITCH_INTERVAL_S = 0.001

# Above what one batched Step (256 submits + 256 finishes) has alive at once, far below
# what would let cyclic garbage pile up (5,000 objects: a few MB).
GEN0_THRESHOLD = 5_000

# While a big step runs (its 100,000 requests are ~900,000 objects by the end) every gen-0
# pass walked 5,000 of them (5-10 ms each, 1.3 s of a 4 s step) and a full pass all of them
# (0.2-0.4 s): the collector waits for its end.
_settled = False  # settle_heap ran: this process is the daemon's


@dataclass(frozen=True)
class SettledHeap:
    frozen_objects: int  # moved to the permanent generation, never walked again
    thresholds: tuple[int, int, int]  # gc.get_threshold() afterwards


def set_switch_interval() -> None:
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)


def settle_heap() -> SettledHeap:
    """Once start-up is done (imports, pool, log, server): collect, freeze what is left,
    and raise the gen-0 threshold. Call it once; a second call freezes what the first
    left unfrozen since."""
    global _settled
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
    _settled = True
    return SettledHeap(gc.get_freeze_count(), gc.get_threshold())


@contextlib.contextmanager
def big_step_heap() -> Iterator[None]:
    """While a big step runs (sliced.py), no gc pass; after it, what it left alive is
    frozen, so that later passes do not walk it either (freed as usual once unreferenced).
    The price: a reference cycle that became garbage meanwhile is kept, not collected.
    Only in a settled daemon process; elsewhere (tests, an in-process Daemon) nothing."""
    if not _settled or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()
