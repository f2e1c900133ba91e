"""A replay's rejections as they happen, for the Replays panel.

A replay's report to the daemon (ReplayState) says how far it is, not what became of its
requests: a gemma pool of 4,096 blocks rejected 750 of 1,500 Mooncake requests and the
panel showed a replay going well. The rejections are on the Watch stream, as REJECT
decisions of the replay's engines ("<replay id>-engine-<k>", as the replayer names them),
so the dashboard counts them there. It can only count what it saw: a replay it first saw
past its start, or one during which the daemon skipped decisions for a slow watcher, is
marked `partial` (the panel says "≥").
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass

from kvbudget.v1 import common_pb2

REJECT = common_pb2.DECISION_KIND_REJECT


@dataclass(frozen=True)
class ReplayRejects:
    """One replay's rejections seen: how many, how many by reason (most first), and
    whether some may have been missed."""

    replay_id: str
    rejected: int = 0
    by_reason: tuple[tuple[str, int], ...] = ()
    partial: bool = False

    def reasons_text(self) -> str:
        """"never_fits 750, queue_full 3"."""
        return ", ".join(f"{reason} {count:,}" for reason, count in self.by_reason)


def count_rejects(
    previous: Sequence[ReplayRejects],
    replays: Iterable[common_pb2.ReplayState],
    decisions: Iterable[common_pb2.Decision],
    dropped: int = 0,
) -> tuple[ReplayRejects, ...]:
    """The counts after one Watch update: each replay the snapshot lists (one that is gone
    is forgotten), this update's REJECT decisions added to the replay whose engine took
    them; `dropped`, decisions the daemon skipped for this watcher, makes every replay
    still running partial."""
    known = {entry.replay_id: entry for entry in previous}
    counts: dict[str, dict[str, int]] = {}
    partial: dict[str, bool] = {}
    for replay in replays:
        entry = known.get(replay.replay_id)
        # First seen past its start: what it rejected before this dashboard came is unseen.
        seen_late = entry is None and replay.position > 0
        partial[replay.replay_id] = (entry is not None and entry.partial) or seen_late or (
            bool(dropped) and not replay.done)
        counts[replay.replay_id] = dict(entry.by_reason) if entry is not None else {}
    if counts:
        for decision in decisions:
            if decision.kind != REJECT:
                continue
            replay_id = _replay_of(decision.engine_id, counts)
            if replay_id is not None:
                by_reason = counts[replay_id]
                by_reason[decision.reason] = by_reason.get(decision.reason, 0) + 1
    return tuple(
        ReplayRejects(
            replay_id, sum(by_reason.values()),
            tuple(sorted(by_reason.items(), key=lambda item: (-item[1], item[0]))), partial[replay_id],
        )
        for replay_id, by_reason in counts.items()
    )


def _replay_of(engine_id: str, replay_ids: Container[str]) -> str | None:
    """The replay whose engines are named "<replay id>-engine-<k>"."""
    head, _, _ = engine_id.rpartition("-engine-")
    return head if head and head in replay_ids else None
