"""The `/` filter over the whole decision log, not only the table's buffer of the newest.

The daemon's QueryDecisions has no text filter (it matches fields exactly), so the search
pages back through the log from the newest decision, `before_seq` page after page, and
keeps the decisions the filter's words match, as the table does (`decision_matches`). It
stops once it has found the matches asked for, or read the oldest decision; `more` goes
on from where it stopped. Each page says how far it got, so that a rare word on a long
log shows progress rather than a frozen window.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

from kvbudget.tui.state import decision_matches
from kvbudget.v1 import common_pb2

# (before_seq, limit) -> that page, newest first; before_seq 0: from the newest.
PageFn = Callable[[int, int], Awaitable[Sequence[common_pb2.Decision]]]

# Decisions a page asks for (of the 10,000 allowed): ~140 ms a page on a busy two-core host,
# so the window says how far it got several times a second.
PAGE_SIZE = 2000
# Matches one search (and each `more`) collects before it stops to show them; and the
# decisions it reads at most meanwhile: a word found nowhere on a log of millions would read
# for minutes (~12,000 decisions a second, bench/bench_log_search.py) before it said more.
MATCHES_PER_SEARCH = 200
MAX_READ_PER_SEARCH = 100_000


@dataclass(frozen=True)
class Progress:
    """Where a search stands: every match so far (newest first), how many decisions it read,
    the oldest seq it reached, and whether that was the oldest in the log."""

    matches: tuple[common_pb2.Decision, ...] = ()
    read: int = 0
    oldest_seq: int = 0
    done: bool = False

    def summary(self, query: str) -> str:
        """One line: "12 decisions match "preempt" in the whole log (4,096 read)"."""
        found = f"{len(self.matches):,} decision{'' if len(self.matches) == 1 else 's'} match {query!r}"
        if self.done:
            return f"{found} in the whole log ({self.read:,} read)"
        reached = f" (back to seq {self.oldest_seq:,})" if self.oldest_seq else ""
        return f"{found} in the newest {self.read:,}{reached}"


class LogSearch:
    """One query's search through the log, resumable: `more()` reads on from where the last
    call stopped."""

    def __init__(
        self, pages: PageFn, query: str, *, page_size: int = PAGE_SIZE, want: int = MATCHES_PER_SEARCH,
        max_read: int = MAX_READ_PER_SEARCH,
    ) -> None:
        if page_size < 1 or want < 1:
            raise ValueError(f"page_size and want must be >= 1, got {page_size} and {want}")
        self.pages = pages
        self.query = query
        self.page_size = page_size
        self.want = want
        self.max_read = max_read
        self.progress = Progress()

    async def more(self) -> AsyncIterator[Progress]:
        """Reads pages until `want` more matches were found, `max_read` more decisions were
        read, or the log's oldest decision was, yielding the progress after each page."""
        goal = len(self.progress.matches) + self.want
        progress = self.progress
        read_until = progress.read + self.max_read
        while not progress.done and len(progress.matches) < goal and progress.read < read_until:
            page = await self.pages(progress.oldest_seq, self.page_size)
            found = tuple(d for d in page if decision_matches(d, self.query))
            progress = Progress(
                matches=progress.matches + found,
                read=progress.read + len(page),
                oldest_seq=page[-1].seq if page else progress.oldest_seq,
                # A short page is the oldest one; and seq 1 has nothing before it (a
                # before_seq of 0 would mean "from the newest" again).
                done=len(page) < self.page_size or (bool(page) and page[-1].seq <= 1),
            )
            self.progress = progress
            yield progress


class DaemonPages:
    """Pages of the daemon's QueryDecisions at `target` (a `PageFn`), on one channel opened
    at the first page and closed by `close()` (the search window's, as it goes)."""

    def __init__(self, target: str, token: str | None = None, credentials=None) -> None:
        self.target, self.token, self.credentials = target, token, credentials
        self._channel = None

    async def __call__(self, before_seq: int, limit: int) -> Sequence[common_pb2.Decision]:
        from kvbudget.tui.source import auth_metadata, open_channel
        from kvbudget.v1 import observer_pb2, observer_pb2_grpc

        if self._channel is None:
            self._channel = open_channel(self.target, self.token, self.credentials)
        stub = observer_pb2_grpc.ObserverServiceStub(self._channel)
        response = await stub.QueryDecisions(
            observer_pb2.QueryDecisionsRequest(limit=limit, before_seq=before_seq),
            metadata=auth_metadata(self.token), timeout=30.0,
        )
        return list(response.decisions)

    async def close(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close(grace=None)
