"""Every request ends in the log: closed at a clean stop, or at the next start after a crash.

A clean stop, once no call is in flight, closes admissions (the waiting are REJECTed
`draining`) and EXPIREs every running request, reason `draining`; a start finds what a
killed daemon left open (`log.open_requests`) and EXPIREs it, reason `daemon_restart` (its
engine's session died with that process). Both rows' `detail` starts with the word that
says which (STOP_WORD, RESTART_WORD): docs/log-schema.md, "How every request ends".
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from kvbudget.daemon.core.admission import AdmissionController
from kvbudget.daemon.core.records import Decision, DecisionKind, Reason
from kvbudget.daemon.log.decision_log import DecisionLog
from kvbudget.daemon.log.open_requests import left_open, mark_all_closed
from kvbudget.daemon.log.query import newest_seq

log = logging.getLogger("kvbudget.daemon")

STOP_WORD = "daemon_stop"
RESTART_WORD = "daemon_restart"
STOP_DETAIL = f"{STOP_WORD}: open when the daemon stopped"
RESTART_DETAIL = f"{RESTART_WORD}: left open by a daemon that ended without closing it (killed or crashed)"


def closing_on_stop(controller: AdmissionController, now: float) -> list[Decision]:
    """The decisions that end every request the controller holds, for a clean stop."""
    decisions = controller.close_admissions(now)  # (nothing is admitted from here on)
    engines = {r.spec.engine_id for r in (*controller.running_requests(), *controller.waiting_requests())}
    for engine_id in sorted(engines):
        decisions += controller.expire_engine(engine_id, now)
    return [
        dataclasses.replace(d, reason=Reason.DRAINING, detail=STOP_DETAIL) if d.kind is DecisionKind.EXPIRE
        else dataclasses.replace(d, detail=STOP_DETAIL)
        for d in decisions
    ]


async def close_on_stop(core) -> bool:
    """Records the closing decisions of a clean stop (`core`: the CoreService, its calls
    done, its dispatcher still running). True when they are in the log; False leaves them
    to the next start (the log cannot write now)."""
    if core.log.num_unwritten:
        log.warning("stopping with the decision log unable to write: the next start closes the open requests")
        return False
    decisions = closing_on_stop(core.controller, time.time())
    if not decisions:
        return True
    try:
        await core.record(decisions)
    except Exception as exc:
        log.error("stopping: the open requests' closing rows were not written (%s); the next start "
                  "closes them", exc)
        return False
    log.info("stopping: closed %d open requests in the decision log (%s)", len(decisions), STOP_WORD)
    return True


def mark_closed(db_path: str) -> None:
    """After close_on_stop's rows are committed: the next start need read no row before now."""
    try:
        mark_all_closed(db_path)
    except Exception as exc:  # (only the next start's scan is longer)
        log.warning("decision log: could not mark the requests closed: %s", exc)


def close_left_open(decision_log: DecisionLog, db_path: str, num_free_blocks: int) -> list[Decision]:
    """At start, before the controller numbers on from the log: EXPIREs each request a
    killed daemon left open, then marks the log closed to here. Returns those decisions.
    Raises DecisionLogError (the log unreadable or unwritable: start-up fails)."""
    still_open = left_open(db_path)
    decisions: list[Decision] = []
    if still_open:
        seq, now = newest_seq(db_path), time.time()
        decisions = [
            Decision(
                seq=seq + i, time_s=now, kind=DecisionKind.EXPIRE, reason=Reason.DAEMON_RESTART,
                request_id=r.request_id, engine_id=r.engine_id, tenant=r.tenant, policy=r.policy,
                prompt_tokens=r.prompt_tokens, max_new_tokens=r.max_new_tokens,
                num_free_blocks=num_free_blocks, detail=f"{RESTART_DETAIL}; its last row was {r.kind}",
            )
            for i, r in enumerate(still_open, start=1)
        ]
        decision_log.append(decisions).result()
    mark_all_closed(db_path)
    return decisions


async def close_left_open_at_start(decision_log: DecisionLog, db_path: str, num_free_blocks: int) -> list[Decision]:
    closed = await asyncio.to_thread(close_left_open, decision_log, db_path, num_free_blocks)
    if closed:
        log.warning("decision log: %d requests were left open by the previous daemon (killed or crashed): "
                    "closed now, kind expire, reason %s", len(closed), RESTART_WORD)
    return closed
