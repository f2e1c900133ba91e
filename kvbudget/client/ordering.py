"""Decisions applied in the order the daemon made them, whichever way they came (issue 30,
point 3). A Step reply and the Events stream are two calls: a decision on Events (an ADMIT
of a queued request) can arrive after a later Step reply about the same request (its GROW,
or its PREEMPT). Applied in arrival order, the engine would go back to an older state (a
running request taken for waiting) and send steps the daemon refuses.

Every decision carries its `seq` (one counter for the daemon's log, growing), so per
request the newest seq applied wins and anything older or equal is dropped: a stale
decision or one heard twice (a stream's resend after a reconnect)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from kvbudget.daemon.core.records import Decision, DecisionKind

# After these, a request id is free again; they are kept a while (not for ever: an engine
# ends millions of requests) so a late decision of the ended request is still dropped.
_ENDED = frozenset({DecisionKind.REJECT, DecisionKind.RELEASE, DecisionKind.EXPIRE})
MAX_ENDED = 65_536


class DecisionOrder:
    """Per request id, the seq of the newest decision applied."""

    def __init__(self, max_ended: int = MAX_ENDED) -> None:
        self._live: dict[str, int] = {}
        self._ended: OrderedDict[str, int] = OrderedDict()  # oldest ended first
        self._max_ended = max_ended

    def fresh(self, decisions: Iterable[Decision]) -> list[Decision]:
        """The decisions newer than every one applied for their request, in the order
        given; they count as applied from now on."""
        kept = []
        for decision in decisions:
            request_id, seq = decision.request_id, decision.seq
            newest = self._live.get(request_id)
            if newest is None:
                newest = self._ended.get(request_id, 0)
            if seq <= newest:
                continue
            kept.append(decision)
            if decision.kind in _ENDED:
                self._live.pop(request_id, None)
                self._ended[request_id] = seq
                self._ended.move_to_end(request_id)
                if len(self._ended) > self._max_ended:
                    self._ended.popitem(last=False)
            else:
                self._ended.pop(request_id, None)
                self._live[request_id] = seq
        return kept

    def forget(self) -> None:
        """A new session: the old one's requests are gone (a restarted daemon with a new
        log may even count seqs from 1 again)."""
        self._live.clear()
        self._ended.clear()
