"""QA: the per-layer-type panel after a long run, driven through the app (Textual's Pilot).

Found driving `kvbudget tui` in tmux against a daemon under a live Azure replay: the
"reclm" column is a cumulative count (blocks that left a sliding window), so it grows for
as long as the daemon runs, and the type column gets what the other columns leave. Two
minutes in, at 120x40, "swa 1024 ×6" read "swa 1024 …"; later "swa 102…", a window size
that is not the model's.
"""

from __future__ import annotations


from tui_helpers import QueueSource, screen_text, wait_until
from tui_stream import load_stream

from kvbudget.tui.app import KVBudgetApp
from kvbudget.tui.source import Connected, Update
from kvbudget.v1 import common_pb2, observer_pb2


class NoLauncher:
    def start(self, request):  # pragma: no cover - no replay is started here
        raise AssertionError("no replay in this test")

    def stop_all(self) -> None:
        pass

    def reap(self) -> list:
        return []


def gemma_groups(reclaimed_per_swa_group: int, held_per_swa_group: int = 549) -> list[common_pb2.GroupState]:
    """Gemma 3 27B as the daemon reports it: six sliding-window groups and one full one."""
    swa = [
        common_pb2.GroupState(
            layer_type="sliding_window", description="sliding_window W=1024", num_layers=9,
            blocks_held=held_per_swa_group, blocks_reserved=0, blocks_reclaimed=reclaimed_per_swa_group,
        )
        for _ in range(6)
    ]
    swa[0].num_layers = 7  # 52 sliding-window layers in all
    full = common_pb2.GroupState(
        layer_type="full_attention", description="full_attention", num_layers=10,
        blocks_held=596, blocks_reserved=0,
    )
    return [*swa, full]


async def test_a_long_run_keeps_the_layer_type_names_whole():
    source = QueueSource()
    snapshot = common_pb2.Snapshot()
    snapshot.CopyFrom(load_stream()[-1].snapshot)
    app = KVBudgetApp("unix:///test/kvbudget.sock", source=source, launcher=NoLauncher(),
                      clock=lambda: 1000.0)
    async with app.run_test(size=(120, 40)) as pilot:
        await source.queue.put(Connected())
        # 6 x 31,655 = 189,930 blocks reclaimed: what the live run showed after 2 minutes.
        del snapshot.groups[:]
        snapshot.groups.extend(gemma_groups(31_655))
        await source.queue.put(Update(observer_pb2.WatchResponse(snapshot=snapshot)))
        await wait_until(pilot, lambda: " 3,294 " in screen_text(app), "6 x 549 blocks held")
        assert "swa 1024 ×6" in screen_text(app)
        assert " 190k" in screen_text(app)
        # Hours later: 6 x 1,666,666 = 9,999,996 blocks, still 4 cells.
        later = common_pb2.Snapshot()
        later.CopyFrom(snapshot)
        later.time_unix_s += 3600
        del later.groups[:]
        later.groups.extend(gemma_groups(1_666_666, held_per_swa_group=550))
        await source.queue.put(Update(observer_pb2.WatchResponse(snapshot=later)))
        await wait_until(pilot, lambda: " 3,300 " in screen_text(app), "6 x 550 blocks held")
        assert "swa 1024 ×6" in screen_text(app)
        assert " 10M" in screen_text(app)
        # ... and at 80x24 too.
        await pilot.resize_terminal(80, 24)
        await wait_until(pilot, lambda: app.compact, "the compact layout")
        await pilot.pause(0.2)
        assert "swa 1024 ×6" in screen_text(app)


def test_unbounded_counts_take_at_most_four_cells_past_100k():
    from kvbudget.tui.drawing import n_short

    assert [n_short(v) for v in (0, 99_999, 100_000, 189_930, 999_499, 999_700, 1_234_567,
                                 9_960_000, 45_000_000, 999_600_000)] == [
        "0", "99,999", "100k", "190k", "999k", "1.0M", "1.2M", "10M", "45M", "1.0G"]
