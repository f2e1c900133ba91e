"""How the daemon process sets up CPython for its load: the GIL's switch interval and the
cyclic garbage collector.

These are process-wide settings, so only `kvbudget daemon` makes them (cmd_daemon.py):
a test or an embedding program that runs a `Daemon` in its own process keeps its own.

The collector. A batched Step makes and drops thousands of objects at once (the ops
read out of the message, a Decision and its dict per decision, the reply), so the
net count of new container objects passes CPython's default gen-0 threshold (700)
about four times per Step, and every tenth gen-1 pass a full pass walks the whole heap:
the imported modules (grpc, protobuf, ...) and every request in flight. Measured on
the 2-core machine (bench/bench_gc.py: bench_roundtrip's batched load, 10 s a round):
~2,600-3,100 gen-0 passes and 22-26 full ones of up to 35 ms, 9.4-9.9% of the event
loop's time. Settling the heap once the daemon is up moves what start-up made into the
permanent generation (`gc.freeze`, after a full collection so that no garbage is frozen
with it), and a gen-0 threshold above one Step's churn leaves passes for objects that
outlive a Step: 3 gen-0 passes and no full one in the same 10 s, none longer than
2.8 ms. Garbage in cycles (a failed call's exception and traceback) is still collected,
once 5,000 objects more are alive than at the last pass.
"""

from __future__ import annotations

import gc
import sys
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
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
    return SettledHeap(gc.get_freeze_count(), gc.get_threshold())
