"""The dashboard's keys that open a window onto more than the live state: start a replay
(and hear how it ended), search the whole decision log for the `/` filter's words."""

from __future__ import annotations

from kvbudget.client.tls import channel_credentials
from kvbudget.tui.log_search import MATCHES_PER_SEARCH, PAGE_SIZE, DaemonPages, LogSearch
from kvbudget.tui.replays import ReplayRequest, shipped_traces
from kvbudget.tui.screens import LogSearchScreen, ReplayScreen


class WindowActions:
    """Mixed into `KVBudgetApp`: the actions of `r` and `s` (and the replays' reaper)."""

    SEARCH_PAGE_SIZE = PAGE_SIZE  # decisions a page of the whole-log search asks for
    SEARCH_MATCHES = MATCHES_PER_SEARCH  # matches it collects before it stops to show them

    def action_start_replay(self) -> None:
        if self.playback:
            self.notify(
                "playback of a recording: no daemon to replay against "
                "(run kvbudget tui --target … to start replays)",
                severity="warning", markup=False,
            )
            return
        traces = self.traces if self.traces is not None else shipped_traces()
        self.push_screen(ReplayScreen(traces, self.target), self._replay_chosen)

    def _replay_chosen(self, request: ReplayRequest | None) -> None:
        if request is None:
            return
        try:
            child = self.launcher.start(request)
        except OSError as exc:
            self.notify(f"could not start the replay: {exc}", severity="error", markup=False)
            return
        self.notify(f"replay of {request.trace.name} started (pid {child.pid})", markup=False)

    def _reap_replays(self) -> None:
        # markup=False: trace names and the child's last line are not ours to parse.
        for ended in self.launcher.reap():
            if ended.returncode == 0:
                self.notify(f"replay of {ended.trace} finished", markup=False)
            else:
                self.notify(
                    f"replay of {ended.trace} failed ({ended.returncode}): {ended.last_line}",
                    severity="error",
                    timeout=10,
                    markup=False,
                )

    def action_search_log(self) -> None:
        if self.playback:
            self.notify("playback of a recording: no log to search (kvbudget log --log FILE reads one)",
                        severity="warning", markup=False)
            return
        if not self.filter_text:
            self.notify("type the words to search for with / first", severity="warning", markup=False)
            return
        pages = DaemonPages(self.target, self.token, channel_credentials(self.tls))
        self.push_screen(LogSearchScreen(LogSearch(
            pages, self.filter_text, page_size=self.SEARCH_PAGE_SIZE, want=self.SEARCH_MATCHES
        ), pages.close))
