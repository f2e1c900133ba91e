"""The engines' lines of a snapshot: blocks held, running and waiting per live session."""

from __future__ import annotations

from collections import Counter

from kvbudget.daemon.core.admission import AdmissionController
from kvbudget.daemon.core.pool import NULL_BLOCK
from kvbudget.daemon.core.records import Snapshot
from kvbudget.daemon.server.sessions import SessionTable
from kvbudget.v1 import common_pb2

_NOTHING = (0, 0, 0)  # an engine with no request: no blocks held, none running or waiting


def engine_states(
    controller: AdmissionController, snapshot: Snapshot, sessions: SessionTable, now_mono: float
) -> list[common_pb2.EngineState]:
    """One line per session, in the table's order."""
    tally = engine_tally(controller, snapshot)
    lease_now = sessions.clock.now(now_mono)
    engines = []
    for session in sessions:
        blocks_held, running, waiting = tally.get(session.engine_id, _NOTHING)
        engines.append(
            common_pb2.EngineState(
                engine_id=session.engine_id,
                session_id=session.session_id[:8],  # enough to tell apart, not to use
                lease_remaining_s=session.lease_remaining_s(lease_now),
                blocks_held=blocks_held,
                running=running,
                waiting=waiting,
            )
        )
    return engines


def engine_tally(controller: AdmissionController, snapshot: Snapshot) -> dict[str, tuple[int, int, int]]:
    """(blocks held, running, waiting) per engine, in one pass over the running requests
    (the pool bounds them) and the snapshot's count of the waiting: a pass per session,
    in queue order, cost 24 ms a snapshot with 20,000 waiting.

    Blocks held are the engine's distinct pool blocks, as for tenants (ledger.py): a
    prefix block its requests share counts once. A block requests of several engines
    share counts once for each of them, so the engines' figures add up to more than the
    pool's held blocks only by the blocks shared across engines."""
    held: Counter[str] = Counter()
    running: Counter[str] = Counter()
    prefix_blocks: dict[str, set[int]] = {}  # per engine: the blocks in its prefix slots
    for r in controller.running_requests():
        engine_id = r.spec.engine_id
        held[engine_id] += sum(r.held)
        running[engine_id] += 1
        if r.cached_upto:
            # Only the slots below cached_upto (prefix-cache hits and published prompt
            # blocks) can be in two tables: a block met there before is taken off again.
            upto = r.cached_upto
            ids = [b for table in r.tables for b in table[:upto] if b != NULL_BLOCK]
            seen = prefix_blocks.setdefault(engine_id, set())
            held[engine_id] -= len(seen.intersection(ids))
            seen.update(ids)
    waiting = snapshot.waiting_by_engine
    return {e: (held[e], running[e], waiting.get(e, 0)) for e in running.keys() | waiting.keys()}
