"""Watch fan-out: every watcher gets the decisions, none can slow admission.

Publishing is an O(1) append per watcher into a bounded deque; when a watcher's deque is
full the oldest decision is dropped and counted (the dashboard shows the count). Each
watcher's stream runs in its own coroutine, so a reader that does not keep up only
delays itself: gRPC flow control blocks its `write`, never the core.

Every watcher is sent the same decisions, so the hub builds each one's message once
(`add_to`): the second watcher on, an update copies messages (in C) instead of building
them again from Python, field by field.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence

from kvbudget.daemon.wire import convert
from kvbudget.daemon.core.records import Decision
from kvbudget.v1 import common_pb2

# Messages kept for watchers that have yet to take them: the newest, by seq. A watcher
# takes at most MAX_WATCH_DECISIONS (10,000) per update; one slower than this keeps up
# builds what it misses itself.
MAX_BUILT = 20_000


class TooManyWatchers(Exception):
    pass


class Watcher:
    def __init__(self, max_decisions: int) -> None:
        self._pending: collections.deque[Decision] = collections.deque(maxlen=max_decisions)
        self._dropped = 0
        self._wake = asyncio.Event()
        self.closed = False

    def publish(self, decisions: Sequence[Decision]) -> None:
        overflow = len(self._pending) + len(decisions) - (self._pending.maxlen or 0)
        if overflow > 0:
            self._dropped += min(overflow, len(self._pending) + len(decisions))
        self._pending.extend(decisions)  # the deque drops the oldest itself

    def take(self) -> tuple[list[Decision], int]:
        """Decisions since the last take (oldest first) and how many were dropped."""
        decisions = list(self._pending)
        self._pending.clear()
        dropped, self._dropped = self._dropped, 0
        return decisions, dropped

    def close(self) -> None:
        self.closed = True
        self._wake.set()

    async def sleep(self, seconds: float) -> None:
        """Sleeps until the next update is due or the watcher is closed."""
        try:
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)
        except TimeoutError:
            pass


class WatchHub:
    def __init__(self, max_watchers: int) -> None:
        self.max_watchers = max_watchers
        self._watchers: set[Watcher] = set()
        self._built: dict[int, tuple[Decision, common_pb2.Decision]] = {}  # seq -> message, oldest first

    def __len__(self) -> int:
        return len(self._watchers)

    @property
    def has_watchers(self) -> bool:
        return bool(self._watchers)

    def add(self, max_decisions: int) -> Watcher:
        if len(self._watchers) >= self.max_watchers:
            raise TooManyWatchers()
        watcher = Watcher(max_decisions)
        self._watchers.add(watcher)
        return watcher

    def remove(self, watcher: Watcher) -> None:
        self._watchers.discard(watcher)

    def publish(self, decisions: Sequence[Decision]) -> None:
        if decisions:
            for watcher in self._watchers:
                watcher.publish(decisions)

    def add_to(self, target: object, decisions: list[Decision]) -> None:
        """Appends decisions to an update's repeated `decisions`, each message built once
        for all watchers. With one watcher, built in place (a copy would cost a quarter
        more than building)."""
        if len(self._watchers) <= 1:
            self._built.clear()
            convert.add_decisions(target, decisions)
            return
        built = self._built
        messages = []
        for d in decisions:
            entry = built.get(d.seq)
            if entry is None or entry[0] is not d:  # (is: a seq is one decision, but be sure)
                entry = built[d.seq] = (d, convert.decision_to_proto(d))
            messages.append(entry[1])
        target.extend(messages)  # type: ignore[attr-defined]
        for _ in range(len(built) - MAX_BUILT):
            del built[next(iter(built))]

    def close_all(self) -> None:
        for watcher in list(self._watchers):
            watcher.close()
