"""Aging that follows the workload: how long the head of the queue may be passed.

A head is passed (backfill) only while it has waited less than AGING_FACTOR times the
median wait of the last WINDOW requests admitted while others waited, and, if the
operator set one, less than `max_head_wait_s`. Where requests wait a second, a head that
waited ten is protected; where all wait minutes, backfill goes on for minutes. So the
tail of the waits stays within a multiple of their median (docs/architecture/core.md).
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque

AGING_FACTOR = 3.0
WINDOW = 256


class RecentWaits:
    """The waits of the last `window` requests admitted past a queue, kept sorted."""

    __slots__ = ("_values", "_sorted", "factor")

    def __init__(self, window: int = WINDOW, factor: float = AGING_FACTOR) -> None:
        self._values: deque[float] = deque(maxlen=window)
        self._sorted: list[float] = []
        self.factor = factor

    def observe(self, wait: float) -> None:
        values, ordered = self._values, self._sorted
        if len(values) == values.maxlen:
            del ordered[bisect_left(ordered, values[0])]
        values.append(wait)
        insort(ordered, wait)

    def median(self) -> float | None:
        ordered = self._sorted
        return ordered[(len(ordered) - 1) // 2] if ordered else None

    def bound(self, max_head_wait_s: float) -> float:
        """How long a head may wait and still be passed: factor x the median (none
        before the first admission past a queue), capped by `max_head_wait_s` if > 0."""
        median = self.median()
        bound = math.inf if median is None else self.factor * median
        if max_head_wait_s > 0 and max_head_wait_s < bound:
            return max_head_wait_s
        return bound
