"""The dashboard's panels as pure functions of a DashboardState, tested without the app.

Each expected screen is written out in full; the arithmetic behind every figure is in the
comment above it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tui_helpers import GIB, snapshot, state_of, text_of

from kvbudget.daemon.wire import convert
from kvbudget.tui import decisions, drawing, panels
from kvbudget.tui.engines import engines_panel
from kvbudget.tui.state import DashboardState, DecisionRow, Limits, Link, daemon_uptime_s
from kvbudget.tui.status import essential_cause, status_line
from kvbudget.tui.verdict import Bound, verdict
from kvbudget.v1 import common_pb2, observer_pb2


def held_at(held: int, t: float, **fields) -> common_pb2.Snapshot:
    """100 blocks, `held` of them held, 10 reserved, 20 evictable (0 once 80 are held)."""
    base = dict(
        time_unix_s=t,
        num_held_blocks=held,
        num_free_blocks=100 - held,
        num_reserved_blocks=10,
        num_evictable_blocks=0 if held >= 80 else 20,
    )
    base.update(fields)
    return snapshot(**base)


def test_nothing_yet_every_panel_says_it_waits():
    state = DashboardState.initial("unix:///test.sock")
    for panel in (panels.pool_panel, panels.queue_panel, panels.layers_panel,
                  panels.physical_panel, engines_panel, panels.replays_panel):
        assert text_of(panel(state)) == "waiting for the first snapshot…"


def test_pool_panel_bar_numbers_and_history():
    state = state_of(held_at(0, 1000.0), held_at(40, 1001.0), held_at(80, 1002.0))
    # Now: held 80, reserved 10, cached 0, free 100 - 80 - 10 - 0 = 10.
    # Bar, 36 cells, cumulative rounding: 80 -> round(28.8) = 29 █; 90 -> round(32.4) = 32,
    # so 3 ▓; cached adds none; 100 -> 36, so 4 ░.
    # usage 80/100 = 80.0%; with reserved (80+10)/100 = 90.0%.
    # free plot, the same "free" as the counts line (neither held, reserved nor cached):
    # 100 - 0 - 10 - 20 = 70, 100 - 40 - 10 - 20 = 30, then 10; scale 0..100 blocks, 8 levels
    # (0..7): 70 -> 4.9 -> 5 ▆, 30 -> 2.1 -> 2 ▃, 10 -> 0.7 -> 1 ▂. (It plotted the daemon's
    # free blocks, 100 - held, and said 20 two lines under "free 10".) usage plot, scale
    # 0..1: 0 -> ▁, 0.4*7 = 2.8 -> 3 ▄, 0.8*7 = 5.6 -> 6 ▇. "not held": the daemon's 20.
    # Plot rows: label 5 cells, gap, the spark (36 - 5 - 1 - 1 - 2 = 27 cells), gap, value.
    assert text_of(panels.pool_panel(state)) == "\n".join([
        "█" * 29 + "▓" * 3 + "░" * 4,
        "held 80  reserved 10",
        "cached 0  free 10 /100",
        "usage 80.0%  +reserved 90.0%",
        "not held 20  prefix hits 0%",
        "free  ▆▃▂" + " " * 25 + "10",
        "usage ▁▄▇" + " " * 24 + "80%",
    ])
    # The 80x24 variant drops the prefix line and the usage plot.
    assert text_of(panels.pool_panel(state, compact=True)).splitlines() == (
        text_of(panels.pool_panel(state)).splitlines()[:4] + ["free  ▆▃▂" + " " * 25 + "10"]
    )


def test_pool_parts_make_the_pool_when_promises_take_cached_blocks():
    # 100 blocks: 80 held, 15 reserved, 10 evictable (20 free in all, cached ones included).
    # The reservation takes 15 of the 20 free: 5 left cached, 0 free. Shown as 10 cached and
    # a free of max(0, ...) = 0, the parts came to 105 of 100.
    state = state_of(snapshot(num_held_blocks=80, num_reserved_blocks=15, num_evictable_blocks=10,
                              num_free_blocks=20))
    lines = text_of(panels.pool_panel(state)).splitlines()
    assert lines[1:3] == ["held 80  reserved 15", "cached 5  free 0 /100"]


def test_stacked_bar_segments_at_a_known_width():
    # 100 blocks on 20 cells: 40 held -> 8; 50 -> 10 (2 reserved); 70 -> 14 (4 cached);
    # 100 -> 20 (6 free).
    bar = drawing.StackedBar(((40, "█", ""), (10, "▓", ""), (20, "▒", ""), (30, "░", "")), 100)
    assert text_of(bar, width=20) == "████████▓▓▒▒▒▒░░░░░░"


@given(
    counts=st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=5),
    width=st.integers(min_value=1, max_value=200),
)
def test_stacked_bar_fills_exactly_the_width(counts, width):
    total = sum(counts)
    bar = drawing.StackedBar(tuple((c, "x", "") for c in counts), total)
    line = text_of(bar, width=width)
    # Every cell drawn once when the segments add up to the total; blank cells only when
    # the total is 0 (drawn as dots).
    assert len(line) == width or (total == 0 and line == "·" * width)
    if total:
        assert line == "x" * width


def test_spark_text_scales_to_the_maximum_or_a_ceiling():
    # max 8: 0 -> 0 ▁, 4 -> 3.5 -> round-half-even 4 ▅, 8 -> 7 █
    assert drawing.spark_text([0, 4, 8], width=10) == "▁▅█"
    # ceiling 16: 8 -> 3.5 -> 4 ▅; only the newest `width` values are drawn
    assert drawing.spark_text([16, 0, 8], width=2, ceiling=16) == "▁▅"
    assert drawing.spark_text([0, 0], width=5) == "▁▁"
    assert drawing.spark_text([], width=5) == ""


def test_queue_panel_counts_rate_and_reasons():
    # Preemptions 0 at t=1000 and 20 at t=1010: 20 / 10 s = 2.0/s.
    # Decisions by kind sum to 0 then 50: 50 / 10 s = 5/s.
    first = held_at(40, 1000.0, num_waiting=0)
    now = held_at(
        40, 1010.0, num_waiting=3, num_running=7, num_preemptions=20,
        preemptions_by_reason={"growth": 15, "priority": 5},
        rejections_by_reason={"never_fits": 2, "tenant_quota": 5},
        decisions_by_kind={"admit": 30, "preempt": 20},
    )
    state = state_of(first, now)
    assert state.preempt_rate() == 2.0
    assert text_of(panels.queue_panel(state), width=40) == "\n".join([
        "running 7  waiting 3",
        "preempted 20  rate 2.0/s",
        "preempt growth 15 · priority 5",
        "rejected tenant_quota 5 · never_fits 2",
        "policy optimistic  decisions 5/s",
        # waiting 0 -> 3 (scale 0..3: ▁ █); running 4 -> 7 (4/7*7 = 4 ▅, 7 -> █).
        # The spark gets 40 - 5 - 1 - 1 - 1 = 32 cells: 2 drawn, 30 blank, then the gap.
        "wait  ▁█" + " " * 31 + "3",
        "run   ▅█" + " " * 31 + "7",
    ])


def test_preempt_rate_uses_only_the_window_and_survives_a_restart():
    limits = Limits(sample_period_s=0.0, rate_window_s=10.0)
    # t=0: 0, t=5: 100, t=20: 130. The window at t=20 starts at t>=10: only the t=20 point
    # itself, so no rate can be measured yet.
    state = state_of(
        held_at(0, 0.0), held_at(0, 5.0, num_preemptions=100),
        held_at(0, 20.0, num_preemptions=130), limits=limits,
    )
    assert state.preempt_rate() == 0.0
    # t=25: 140 -> (140 - 130) / (25 - 20) = 2.0/s
    state = state.with_response(
        observer_pb2.WatchResponse(snapshot=held_at(0, 25.0, num_preemptions=140))
    )
    assert state.preempt_rate() == 2.0
    # The daemon restarts: its counter starts over at 0. The history starts over with it,
    # so the rate is not negative and no plot joins the two runs.
    state = state.with_response(
        observer_pb2.WatchResponse(snapshot=held_at(0, 26.0, num_preemptions=0))
    )
    assert len(state.history) == 1
    assert state.preempt_rate() == 0.0


def test_layers_panel_one_row_per_group():
    groups = [
        common_pb2.GroupState(layer_type="full_attention", description="full_attention",
                              num_layers=6, blocks_held=120, blocks_reserved=30,
                              blocks_reclaimed=0),
        common_pb2.GroupState(layer_type="sliding_window", description="sliding_window W=4096",
                              num_layers=28, blocks_held=1500, blocks_reserved=12,
                              blocks_reclaimed=12345),
        common_pb2.GroupState(layer_type="mamba", description="mamba", num_layers=4,
                              blocks_held=8, blocks_reserved=0, blocks_reclaimed=0),
    ]
    state = state_of(snapshot(groups=groups))
    # Columns as wide as their widest cell ("layers" 6, "resv" 4, "held" 5, "reclm" 6),
    # one space apart; the type column takes the rest: 36 - 21 - 4 = 11.
    assert text_of(panels.layers_panel(state)) == "\n".join([
        "type        layers resv  held  reclm",
        "full             6   30   120      0",
        "swa 4096        28   12 1,500 12,345",
        "mamba            4    0     8      0",
        "resv: promised · reclm: left window",
    ])


def test_groups_of_one_spec_share_a_row():
    # Six sliding-window groups of 10 layers holding 50 blocks each and one full group:
    # 6 x 10 = 60 layers, 6 x 50 = 300 held, 6 x 7 = 42 reclaimed.
    swa = dict(layer_type="sliding_window", description="sliding_window W=1024", num_layers=10,
               blocks_held=50, blocks_reserved=2, blocks_reclaimed=7)
    groups = [common_pb2.GroupState(**swa) for _ in range(6)] + [
        common_pb2.GroupState(layer_type="full_attention", description="full_attention",
                              num_layers=10, blocks_held=60, blocks_reserved=3)
    ]
    state = state_of(snapshot(groups=groups))
    # layers 6 + resv 4 + held 4 + reclm 5 + 4 gaps = 23: the label gets 36 - 23 = 13.
    assert text_of(panels.layers_panel(state, compact=True)) == "\n".join([
        "type          layers resv held reclm",
        "swa 1024 ×6       60   12  300    42",
        "full              10    3   60     0",
    ])


def test_layer_labels_keep_the_parameters():
    assert panels.layer_label("sliding_window", "sliding_window W=4096") == "swa 4096"
    assert panels.layer_label("chunked_local", "chunked_local C=8192") == "chunk 8192"
    assert panels.layer_label("mla", "mla") == "mla"
    assert panels.layer_label("", "capped L=2048") == "capped 2048"


def gpu(used_gib: float, pool_gib: float = 80.0, total_gib: float = 141.0) -> common_pb2.GpuState:
    return common_pb2.GpuState(
        present=True, name="NVIDIA H200", total_bytes=int(total_gib * GIB),
        used_bytes=int(used_gib * GIB), pool_bytes=int(pool_gib * GIB),
    )


def test_physical_panel_without_a_gpu_says_so_plainly():
    state = state_of(snapshot(gpu=common_pb2.GpuState(present=False, note="NVML not available")))
    assert text_of(panels.physical_panel(state), width=50) == "\n".join([
        "GPU   no GPU (NVML not available)",
        "pool  100 blocks  logical 40% held",
        "⇒ not bound: nothing waits, no preemptions",
    ])


def test_physical_panel_gives_the_whole_reason_there_is_no_gpu():
    # Issue 32: the panel cut it to "no GPU (NVML unavailable (NVM…", which said nothing of why.
    note = "NVML unavailable (NVML Shared Library Not Found)"
    state = state_of(snapshot(gpu=common_pb2.GpuState(present=False, note=note)))
    text = text_of(panels.physical_panel(state), width=40)
    assert "…" not in text
    assert " ".join(text.split()).startswith(f"GPU no GPU ({note}) pool 100 blocks")


def test_physical_panel_says_first_when_the_decision_log_cannot_write():
    failing = common_pb2.DecisionLogState(num_unwritten_decisions=21, write_error="disk full")
    state = state_of(snapshot(gpu=common_pb2.GpuState(present=False, note="NVML not available"),
                              num_waiting=2, decision_log=failing))
    assert text_of(panels.physical_panel(state), width=200).splitlines()[-1] == (
        "⇒ decision log cannot write: 21 decisions wait to be written (disk full); steps are refused until the "
        "log's disk has room"
    )


def test_physical_panel_with_a_gpu():
    # used 100 of 141 GiB = 70.9% -> "71%"; outside the pool 100 - 80 = 20 GiB.
    # mem plot at ceiling 141 GiB: 100/141*7 = 4.96 -> 5 ▆ (one point).
    state = state_of(snapshot(gpu=gpu(100.0), num_waiting=2))
    assert text_of(panels.physical_panel(state), width=60) == "\n".join([
        "GPU   100.0 GiB of 141.0 GiB 71% NVIDIA H200",
        "pool  80.0 GiB  logical 40% held",
        "other 20.0 GiB outside the pool",
        "mem   ▆",
        # 40% held < 90%: budget-bound; reserved 10/100 = 10%
        "⇒ budget-bound: 2 waiting with 40% held, 10% reserved, GPU",
        "memory flat",
    ])


def on_gpu(state: common_pb2.GpuState, index: int, nvml_device: str) -> common_pb2.GpuState:
    placed = common_pb2.GpuState()
    placed.CopyFrom(state)
    placed.index, placed.nvml_device = index, nvml_device
    return placed


def test_physical_panel_shows_each_gpu_of_a_parallel_pool():
    # Issue 33: a tensor-parallel pool on the host's GPUs 4 and 5 (CUDA_VISIBLE_DEVICES=4,5):
    # numbered as nvidia-smi numbers them. GPU5: 90 of 141 GiB = 63.8% -> "64%"; the pool's
    # own bytes and what is outside them are the first GPU's (as test_physical_panel_with_a_gpu).
    # The verdict first: the panel's height is fixed, and eight GPUs would push it out.
    first, second = on_gpu(gpu(100.0), 0, "4"), on_gpu(gpu(90.0, pool_gib=0.0), 1, "5")
    state = state_of(snapshot(gpu=first, gpus=[first, second], num_waiting=2))
    assert text_of(panels.physical_panel(state), width=60) == "\n".join([
        "⇒ budget-bound: 2 waiting with 40% held, 10% reserved, GPU",
        "memory flat",
        "GPU4  100.0 GiB of 141.0 GiB 71% NVIDIA H200",
        "GPU5  90.0 GiB of 141.0 GiB 64% NVIDIA H200",
        "pool  80.0 GiB  logical 40% held",
        "other 20.0 GiB outside the pool",
        "mem   ▆",
    ])
    assert text_of(panels.physical_panel(state, compact=True), width=60) == "\n".join([
        "⇒ budget-bound",
        "GPU4  100.0 GiB of 141.0 GiB 71%",
        "GPU5  90.0 GiB of 141.0 GiB 64%",
        "pool  80.0 GiB  logical 40% held",
        "other 20.0 GiB outside the pool",
    ])


def test_a_gpu_named_by_uuid_shows_its_cuda_index_and_one_unread_says_so():
    uuid = on_gpu(gpu(100.0), 0, "GPU-5b8c2f0e-1c7a-4d0e-9a59-2f8e6c1d7a31")
    lost = common_pb2.GpuState(present=False, note="NVML: GPU is lost", index=1, nvml_device="7")
    state = state_of(snapshot(gpu=uuid, gpus=[uuid, lost]))
    assert text_of(panels.physical_panel(state), width=60).splitlines()[:3] == [
        "⇒ not bound: nothing waits, no preemptions",
        "GPU0  100.0 GiB of 141.0 GiB 71% NVIDIA H200", "GPU7  not read (NVML: GPU is lost)"]


def test_one_gpu_in_gpus_reads_as_a_daemon_that_sends_only_gpu():
    one = on_gpu(gpu(100.0), 0, "3")
    assert text_of(panels.physical_panel(state_of(snapshot(gpu=one, gpus=[one]))), width=60) == text_of(
        panels.physical_panel(state_of(snapshot(gpu=one))), width=60)


class TestVerdict:
    def test_unknown_before_the_first_snapshot(self):
        assert verdict(DashboardState.initial("x")).bound is Bound.UNKNOWN

    def test_not_bound_when_nothing_waits_or_is_preempted(self):
        state = state_of(held_at(99, 1000.0), held_at(99, 1001.0))
        assert verdict(state).line == "not bound: nothing waits, no preemptions"

    def test_budget_bound_when_requests_wait_below_the_usage_bar(self):
        state = state_of(held_at(50, 1000.0, num_waiting=4))
        assert verdict(state).line == (
            "budget-bound: 4 waiting with 50% held, 10% reserved, no GPU"
        )

    def test_preemptions_in_the_window_count_as_pressure(self):
        # 6 preemptions between t=1000 and t=1010, nothing waiting now.
        state = state_of(held_at(50, 1000.0), held_at(50, 1010.0, num_preemptions=6))
        assert verdict(state).line == (
            "budget-bound: 6 preempted in 10 s with 50% held, 10% reserved, no GPU"
        )

    def test_preemptions_of_a_drained_run_are_history(self):
        # 6 preemptions in the window, but nothing runs or waits any more: idle.
        state = state_of(held_at(50, 1000.0),
                         held_at(0, 1010.0, num_preemptions=6, num_running=0))
        assert verdict(state).line == "not bound: idle"

    def test_commits_waiting_for_the_log_are_said_after_the_bound(self):
        # 0.4 + 0.8 s of stalls between t=1000 and t=1010: said whatever the bound is.
        stalled = [common_pb2.DecisionLogState(stall_s=s) for s in (2.0, 2.4, 3.2)]
        state = state_of(*(held_at(50, t, decision_log=log) for t, log in zip((1000.0, 1005.0, 1010.0), stalled)))
        assert verdict(state).line == (
            "not bound: nothing waits, no preemptions; commits waited 1.2 s in 10 s for the decision log"
        )
        waiting = state_of(held_at(95, 1000.0, num_waiting=3, decision_log=stalled[0]),
                           held_at(95, 1010.0, num_waiting=3, decision_log=stalled[2]))
        # Two samples under pressure, both 95% held: the verdict says it judged their mean.
        assert verdict(waiting).line == (
            "pool-bound: 3 waiting with 95% of blocks held (mean under pressure, 10 s); "
            "commits waited 1.2 s in 10 s for the decision log"
        )
        # Stalls before the window (the figure stands still): not said.
        still = state_of(held_at(50, 1000.0, decision_log=stalled[2]), held_at(50, 1010.0, decision_log=stalled[2]))
        assert verdict(still).line == "not bound: nothing waits, no preemptions"

    def test_pool_bound_at_90_percent_held(self):
        # 90 of 100 blocks held is exactly the bar; 89 is below it.
        assert verdict(state_of(held_at(90, 1.0, num_waiting=1))).bound is Bound.POOL_BOUND
        assert verdict(state_of(held_at(89, 1.0, num_waiting=1))).bound is Bound.BUDGET_BOUND
        assert verdict(state_of(held_at(95, 1.0, num_waiting=1200))).line == (
            "pool-bound: 1,200 waiting with 95% of blocks held"
        )

    def test_a_log_that_cannot_write_outranks_the_rest(self):
        failing = common_pb2.DecisionLogState(num_unwritten_decisions=1200, write_error="write failed: disk full")
        state = state_of(
            held_at(95, 1000.0, gpu=gpu(100.0), num_waiting=1),
            held_at(95, 1020.0, gpu=gpu(102.0), num_waiting=1, decision_log=failing),
        )
        assert verdict(state).line == (
            "decision log cannot write: 1,200 decisions wait to be written (write failed: disk full); "
            "steps are refused until the log's disk has room"
        )

    def test_memory_growing_outside_the_pool_outranks_the_rest(self):
        # Outside the pool: 20 GiB at t=1000, 22 GiB at t=1020: +2 GiB > max(256 MiB,
        # 1% of 141 GiB = 1.41 GiB).
        state = state_of(
            held_at(95, 1000.0, gpu=gpu(100.0), num_waiting=1),
            held_at(95, 1020.0, gpu=gpu(102.0), num_waiting=1),
        )
        assert verdict(state).line == "memory growing outside the pool: +2.0 GiB in 20 s"

    def test_small_growth_outside_the_pool_is_noise(self):
        # +1 GiB < 1.41 GiB (1% of 141 GiB): not a verdict of its own.
        state = state_of(
            held_at(50, 1000.0, gpu=gpu(100.0), num_waiting=1),
            held_at(50, 1020.0, gpu=gpu(101.0), num_waiting=1),
        )
        assert verdict(state).bound is Bound.BUDGET_BOUND
        assert verdict(state).why.endswith("GPU memory flat")

    def test_growth_older_than_the_window_is_forgotten(self):
        # +2 GiB between t=1000 and t=1010, then flat until t=1050: the 30 s window at
        # t=1050 starts at t=1020 and sees no growth.
        state = state_of(
            held_at(50, 1000.0, gpu=gpu(100.0)),
            held_at(50, 1010.0, gpu=gpu(102.0)),
            held_at(50, 1030.0, gpu=gpu(102.0)),
            held_at(50, 1050.0, gpu=gpu(102.0)),
        )
        assert verdict(state).bound is Bound.NOT_BOUND


def test_engines_panel_leases_and_tenant_quotas():
    state = state_of(snapshot(
        engines=[
            common_pb2.EngineState(engine_id="vllm-0", session_id="s1", lease_remaining_s=8.4,
                                   blocks_held=1200, running=10, waiting=2),
            common_pb2.EngineState(engine_id="sglang-1", session_id="s2", lease_remaining_s=0.0,
                                   blocks_held=0),
        ],
        tenants=[
            # (300 held + 100 reserved) / 500 quota = 80%
            common_pb2.TenantState(tenant="acme", blocks_held=300, blocks_reserved=100,
                                   quota_blocks=500, running=3, waiting=1),
            common_pb2.TenantState(tenant="", blocks_held=900, running=7),
        ],
    ))
    # Engines: "lease" as wide as "live 8s" (7, left-aligned), "held" 5, "run" 3, "wait" 4;
    # with 4 one-space gaps that is 23, leaving 36 - 23 = 13 for the name.
    # Tenants: 4 + 5 + 3 + 3 + 4 = 19 and 5 gaps: 24, name 12. Use = (held + reserved) / quota.
    assert text_of(engines_panel(state)) == "\n".join([
        "engine        lease    held run wait",
        "vllm-0        live 8s 1,200  10    2",
        "sglang-1      lapsed      0   0    0",
        "tenant       held quota use run wait",
        "acme          300   500 80%   3    1",
        "(default)     900     —   —   7    0",
    ])
    # Compact: no headers; "quota 500" 9 + 5 + 4 and 3 gaps = 21, name 15.
    assert text_of(engines_panel(state, compact=True)) == "\n".join([
        "vllm-0          live 8s   1,200 held",
        "sglang-1        lapsed        0 held",
        "acme            quota 500   300  80%",
        "(default)       quota —     900    —",
    ])


def test_replays_panel_progress_and_the_way_to_start_one():
    assert text_of(panels.replays_panel(state_of(snapshot()))) == "\n".join([
        "no replay running",
        "r: start a replay",
    ])
    replay = common_pb2.ReplayState(replay_id="r1", trace="azure_conv.csv", position=250,
                                    total=1000, speed=10.0, policy="guaranteed")
    # 250/1000 = 25%: the bar (36 - 1 - len("250/1,000 10×") = 22 cells) is 5.5 -> 6 █
    # (round half to even gives 6) then 16 ░.
    assert text_of(panels.replays_panel(state_of(snapshot(replays=[replay])))) == "\n".join([
        "azure_conv.csv",
        "█" * 6 + "░" * 16 + " 250/1,000 10×",
        "25% running  policy guaranteed",
        "r: start a replay",
    ])


def test_a_replay_that_stops_moving_is_marked_stalled():
    def at(t: float, position: int) -> common_pb2.Snapshot:
        replay = common_pb2.ReplayState(replay_id="r1", trace="t.csv", position=position,
                                        total=100, speed=1.0, policy="naive")
        return snapshot(time_unix_s=t, replays=[replay])

    # Position 10 at t=0, 20 at t=5, then still until t=34: 29 s still, running; at t=35,
    # 30 s still: stalled.
    state = state_of(at(0.0, 10), at(5.0, 20), at(34.0, 20))
    assert state.replay_still_s("r1") == 29.0
    assert "20% running" in text_of(panels.replays_panel(state))
    state = state.with_response(observer_pb2.WatchResponse(snapshot=at(35.0, 20)))
    assert "20% stalled 30s  policy naive" in text_of(panels.replays_panel(state))


def test_a_replays_rejections_are_counted_from_the_stream_as_they_come():
    # Issue 32: the panel showed a replay going well while the daemon rejected half its
    # requests. Its engines are "<replay id>-engine-<k>"; another engine's rejection is not its.
    def reject(seq: int, engine: str, reason: str = "never_fits") -> common_pb2.Decision:
        return common_pb2.Decision(seq=seq, kind=common_pb2.DECISION_KIND_REJECT, reason=reason,
                                   request_id=f"q{seq}", engine_id=engine)

    replay = common_pb2.ReplayState(replay_id="ab12", trace="t.csv", position=0, total=100, speed=1.0)
    at = snapshot(replays=[replay])
    state = state_of(at, decisions=[reject(1, "ab12-engine-0"), reject(2, "ab12-engine-1", "queue_full"),
                                    reject(3, "vllm-0"), reject(4, "ab12-engine-0")])
    text = text_of(panels.replays_panel(state), width=40)
    assert "rejected 3: never_fits 2, queue_full 1" in text
    assert "· 3 rejected" in text_of(panels.replays_panel(state, compact=True), width=40)
    # The daemon skipped decisions for this watcher meanwhile: some may be missed, "≥".
    state = state.with_response(observer_pb2.WatchResponse(snapshot=at, dropped_decisions=5))
    assert "rejected ≥3: never_fits 2, queue_full 1" in text_of(panels.replays_panel(state), width=40)
    # First seen past its start (this dashboard came late): "≥" too.
    late = common_pb2.ReplayState(
        replay_id="ab12", trace="t.csv", position=10, total=100, speed=1.0)
    state = state_of(snapshot(replays=[late]), decisions=[reject(9, "ab12-engine-0")])
    assert "rejected ≥1: never_fits 1" in text_of(panels.replays_panel(state), width=40)


def decision(seq: int, kind: int, reason: str, request: str, tenant: str = "acme",
             held=(3, 1), reserved=(4, 1)) -> common_pb2.Decision:
    return common_pb2.Decision(
        seq=seq, time_unix_s=1000.0 + seq, kind=kind, reason=reason, request_id=request,
        engine_id="vllm-0", tenant=tenant, policy=common_pb2.POLICY_GUARANTEED,
        prompt_tokens=40, max_new_tokens=16, blocks_held=held, blocks_reserved=reserved,
        new_blocks=[common_pb2.GroupBlocks(group_index=0, block_ids=[7, 8, 9])],
    )


def test_decisions_newest_first_filtered_and_limited():
    made = [
        decision(1, common_pb2.DECISION_KIND_ADMIT, "fits", "req-a"),
        decision(2, common_pb2.DECISION_KIND_QUEUE, "budget_full", "req-b", tenant="globex"),
        decision(3, common_pb2.DECISION_KIND_PREEMPT, "growth", "req-a"),
        decision(4, common_pb2.DECISION_KIND_ADMIT, "fits", "req-c", tenant="globex"),
    ]
    state = state_of(snapshot(), decisions=made)
    seqs = lambda rows: [r.row.seq for r in rows]  # noqa: E731
    assert seqs(decisions.visible_decisions(state, "", 10)) == [4, 3, 2, 1]
    assert seqs(decisions.visible_decisions(state, "", 2)) == [4, 3]
    assert seqs(decisions.visible_decisions(state, "req-a", 10)) == [3, 1]
    # every word must match: admit AND globex
    assert seqs(decisions.visible_decisions(state, "ADMIT globex", 10)) == [4]
    assert seqs(decisions.visible_decisions(state, "nothing-like-this", 10)) == []


def test_decision_cells_and_blocks_per_group():
    row = DecisionRow.from_proto(
        decision(9, common_pb2.DECISION_KIND_GROW, "fits", "req-z", held=(12, 4), reserved=(16, 4))
    )
    assert [c.plain for c in decisions.decision_cells(row)] == [
        "9", "grow", "fits", "req-z", "vllm-0", "acme", "12/16 4/4",
    ]
    # nothing reserved: just what is held
    bare = DecisionRow.from_proto(decision(1, 1, "fits", "r", held=(3,), reserved=()))
    assert decisions.blocks_per_group(bare) == "3"
    # Gemma 3 27B: six equal sliding-window groups, then the full group
    gemma = DecisionRow.from_proto(
        decision(2, 1, "fits", "r", held=(48,) * 6 + (44,), reserved=(48,) * 6 + (50,))
    )
    assert decisions.blocks_per_group(gemma) == "48/48×6 44/50"


def test_decision_detail_shows_the_whole_record():
    row = DecisionRow.from_proto(decision(5, common_pb2.DECISION_KIND_ADMIT, "fits", "req-q"))
    text = text_of(decisions.decision_detail(row), width=80)
    lines = {line.split()[0]: line.split(None, 1)[1] for line in text.splitlines()}
    # one line per field of the record, none left out
    assert list(lines) == [f for f in DecisionRow.__dataclass_fields__]
    assert lines["time_s"] == "1970-01-01 00:16:45.000000 UTC"  # 1000 + 5 = 1005 s
    assert lines["kind"] == "admit"
    assert lines["policy"] == "guaranteed"
    assert lines["blocks_held"] == "3 1"
    assert lines["new_blocks"] == "group 0: [7, 8, 9]"
    assert lines["detail"] == "—"


def test_a_decision_row_is_the_wire_record_with_the_daemons_own_names():
    message = decision(6, common_pb2.DECISION_KIND_GROW, "fits", "req-w", held=(2, 5), reserved=(3, 5))
    message.new_blocks.add(group_index=1, block_ids=[11])
    record = convert.decision_from_proto(message)
    row = DecisionRow.from_proto(message)
    assert (row.seq, row.kind, row.reason, row.policy) == (6, record.kind.value, record.reason.value, record.policy)
    assert (row.blocks_held, row.blocks_reserved, row.num_computed_tokens) == (
        record.blocks_held, record.blocks_reserved, record.num_computed)
    assert row.new_blocks == ((0, (7, 8, 9)), (1, (11,)))
    # A newer daemon's kind, reason and policy are shown as sent, not as this build's defaults.
    newer = DecisionRow.from_proto(common_pb2.Decision(seq=7, kind=99, reason="brand_new", policy=42))
    assert (newer.kind, newer.reason, newer.policy) == ("99", "brand_new", "42")


def test_status_line_says_connected_or_retrying():
    state = state_of(snapshot(plan=common_pb2.PoolPlan(model="m")))
    state = state.with_link(Link.CONNECTED)
    # The link's state first: a narrow terminal cuts the target, not the state.
    assert text_of(status_line(state), width=80) == (
        " kvbudget  ● connected  m  optimistic  unix:///test.sock"
    )
    down = state.with_link(Link.DISCONNECTED, "UNAVAILABLE: connection refused", 2.0)
    assert text_of(status_line(down, paused=True, query="req-1"), width=120) == (
        " kvbudget  ● disconnected: UNAVAILABLE: connection refused, retrying in 2 s  "
        "unix:///test.sock  ⏸ PAUSED  filter: req-1"
    )
    assert down.connection.reconnects == 1


def test_history_is_sampled_and_bounded():
    limits = Limits(history_len=3, sample_period_s=1.0, max_decisions=2)
    state = DashboardState.initial("x", limits)
    # Updates every 0.5 s for 5 s: a sample at t=0, 1, 2, 3, 4 (the 0.5 s ones skipped),
    # of which the newest 3 are kept.
    for step in range(10):
        response = observer_pb2.WatchResponse(
            snapshot=held_at(0, step * 0.5),
            decisions=[decision(step * 2 + k, 1, "fits", f"r{step}") for k in (1, 2)],
        )
        state = state.with_response(response)
    assert [s.time_s for s in state.history] == [2.0, 3.0, 4.0]
    assert [d.seq for d in state.decisions] == [19, 20]
    assert state.decisions_received == 20


def test_dropped_decisions_are_counted():
    state = DashboardState.initial("x")
    for dropped in (3, 0, 4):
        state = state.with_response(
            observer_pb2.WatchResponse(snapshot=snapshot(), dropped_decisions=dropped)
        )
    assert state.decisions_dropped == 7


def test_limits_refuse_nonsense():
    with pytest.raises(ValueError, match="history_len"):
        Limits(history_len=1)
    with pytest.raises(ValueError, match="max_decisions"):
        Limits(max_decisions=0)


def test_unknown_enum_values_show_as_numbers():
    row = DecisionRow.from_proto(common_pb2.Decision(seq=1, kind=99, policy=42))
    assert (row.kind, row.policy) == ("99", "42")


# -- what QA found: restarts, markup, staleness, replays that died, long names ------------

REFUSED = (
    "UNAVAILABLE: failed to connect to all addresses; last error: FAILED_PRECONDITION: "
    "unix:/tmp/k/d.sock: connect failed: addr: unix:/tmp/k/d.sock error: Connection refused"
)


def test_a_restarted_daemon_starts_the_decision_buffer_over():
    made = [decision(seq, common_pb2.DECISION_KIND_ADMIT, "fits", f"old-{seq}") for seq in (1, 2, 3)]
    state = state_of(snapshot(), decisions=made)
    # The new daemon's first decision is seq 1 again (its counters alone may not tell).
    again = decision(1, common_pb2.DECISION_KIND_POLICY, "switch", "")
    state = state.with_response(observer_pb2.WatchResponse(snapshot=snapshot(time_unix_s=1060.0),
                                                           decisions=[again]))
    assert [d.request_id for d in state.decisions] == [""]
    assert state.restarts == 1
    # Its counters starting from 0 tell it too, before any decision arrives.
    counted = state_of(snapshot(num_preemptions=5), decisions=made)
    counted = counted.with_response(observer_pb2.WatchResponse(snapshot=snapshot(num_preemptions=0)))
    assert counted.decisions == () and counted.restarts == 1


def test_table_keys_never_repeat_even_where_seqs_do():
    # Should a restart go unnoticed, two buffered decisions can share a seq; the table's
    # keys are the dashboard's own arrival numbers and cannot.
    state = state_of(snapshot(), decisions=[decision(1, 1, "fits", "a"), decision(2, 1, "fits", "b")])
    state = replace(state, decisions=state.decisions + (decision(1, 1, "fits", "c"),),
                    decisions_received=3)
    rows = decisions.visible_decisions(state, "", 10)
    assert [(r.key, r.row.seq, r.row.request_id) for r in rows] == [(2, 1, "c"), (1, 2, "b"), (0, 1, "a")]


def test_a_selected_row_stays_in_the_table_past_the_rows_that_fit():
    made = [decision(seq, 1, "fits", f"r{seq}") for seq in range(1, 11)]  # keys 0..9
    state = state_of(snapshot(), decisions=made)
    keep = decisions.visible_decisions(state, "", 10)[7]  # seq 3, key 2
    # 3 rows fit, the selected one is further down: the rows go on down to it.
    assert [r.row.seq for r in decisions.visible_decisions(state, "", 3, keep)] == [10, 9, 8, 7, 6, 5, 4, 3]
    # A filter it does not match drops it.
    assert [r.row.seq for r in decisions.visible_decisions(state, "r1", 3, keep)] == [10, 1]
    # It left the buffer: dropped, not pinned at the bottom out of order (issue 32).
    later = state.with_response(observer_pb2.WatchResponse(
        decisions=[decision(seq, 1, "fits", f"r{seq}") for seq in range(11, 600)]))
    assert [r.row.seq for r in decisions.visible_decisions(later, "", 3, keep)] == [599, 598, 597]


def test_the_record_shows_brackets_as_sent():
    # A str cell is Rich markup: "[/x]" raised MarkupError, "[b]" turned bold and vanished.
    row = DecisionRow.from_proto(decision(5, common_pb2.DECISION_KIND_ADMIT, "[/x] [b]", "req-[/]"))
    text = text_of(decisions.decision_detail(row), width=80)
    assert "[/x] [b]" in text and "req-[/]" in text


@pytest.mark.parametrize("detail, cause", [
    (REFUSED, "Connection refused"),
    ("UNAVAILABLE: failed to connect to all addresses; last error: UNKNOWN: unix:/x.sock: "
     "No such file or directory", "No such file or directory"),
    ("UNAVAILABLE: Socket closed", "UNAVAILABLE: Socket closed"),
    ("", ""),
])
def test_the_essential_cause_of_a_disconnection(detail, cause):
    assert essential_cause(detail) == cause


def test_status_line_dates_the_figures_and_counts_the_retry_down():
    state = DashboardState.initial("unix:///t.sock").with_link(Link.CONNECTED)
    # Two updates 0.5 s apart (daemon clock), received at t=50 and 50.5 (the app's clock):
    # stale after max(2 s, 5 x 0.5 s) = 2.5 s without one.
    for t, now in ((1000.0, 50.0), (1000.5, 50.5)):
        state = state.with_response(observer_pb2.WatchResponse(snapshot=snapshot(time_unix_s=t)), now)
    assert state.staleness(52.9) is None
    assert text_of(status_line(state, now=52.9), width=80) == (
        " kvbudget  ● connected  optimistic  unix:///t.sock"
    )
    assert state.staleness(53.0) == 2.5
    assert text_of(status_line(state, now=62.5), width=80) == (
        " kvbudget  ● connected, no update for 12 s  optimistic  unix:///t.sock"
    )
    # Down at t=60, told to retry in 5 s: at 61.5, 3.5 s left (shown rounded up, 4); the
    # figures are 11 s old; the whole reason comes last, after the cause.
    down = state.with_link(Link.DISCONNECTED, REFUSED, 5.0, now=60.0)
    assert down.staleness(50.75) == 0.25  # down: stale at once, not after 2.5 s
    assert text_of(status_line(down, now=61.5), width=300) == (
        " kvbudget  ● disconnected: Connection refused, retrying in 4 s · no update for 11 s"
        f"  unix:///t.sock  ({REFUSED})"
    )
    assert "retrying… · no update for 15 s" in text_of(status_line(down, now=65.5), width=120)
    # 40 columns (the app cuts the line at the edge): the state, not the target.
    narrow = status_line(down, now=61.5)
    narrow.truncate(40, overflow="ellipsis")
    assert narrow.plain == " kvbudget  ● disconnected: Connection r…"


def test_playback_says_so_and_never_goes_stale():
    state = DashboardState.initial("recording s.jsonl", playback=True).with_link(Link.CONNECTED)
    state = state.with_response(observer_pb2.WatchResponse(snapshot=snapshot()), now=0.0)
    assert state.staleness(3600.0) is None
    assert text_of(status_line(state, now=3600.0), width=80) == (
        " kvbudget  ▶ playback  optimistic  recording s.jsonl"
    )
    assert text_of(panels.replays_panel(state)).splitlines()[-1] == "playback: no replay from here"


def test_a_replay_that_stopped_short_is_not_done():
    def replays(position: int, done: bool, compact: bool = False) -> str:
        replay = common_pb2.ReplayState(replay_id="r1", trace="azure_conv.csv", position=position,
                                        total=1000, speed=20.0, done=done)
        return text_of(panels.replays_panel(state_of(snapshot(replays=[replay])), compact))

    # The replayer's last report: position = total, done. One that died sent no last
    # report; the daemon marked it done 30 s later at its last position, 400 of 1,000.
    assert replays(1000, True).splitlines()[2] == "100% done  policy —"
    assert replays(400, True).splitlines()[2] == "stopped at 40%  policy —"
    # 400/1000 of 22 cells = 8.8 -> 9 █.
    assert replays(400, True, compact=True) == "\n".join([
        "azure_conv.csv        stopped at 40%",
        "█" * 9 + "░" * 13 + " 400/1,000 20×",
    ])


def test_engine_ids_sharing_a_prefix_are_cut_in_the_middle_and_rows_left_out_counted():
    engines = [common_pb2.EngineState(engine_id=f"4ea3818b-5c1d-engine-{i:02d}", lease_remaining_s=9.0,
                                      blocks_held=10 * i) for i in range(5)]
    tenants = [common_pb2.TenantState(tenant=f"team-with-a-long-name-{i}", blocks_held=1)
               for i in range(3)]
    state = state_of(snapshot(engines=engines, tenants=tenants))
    # Engines: "live 9s" 7 + "held" 4 + "run" 3 + "wait" 4 and 4 gaps = 22: 14 for the name,
    # cut in the middle, a third of 13 (4) for its start, 9 for its end: "4ea3…engine-00".
    # Tenants: 4 + 5 + 3 + 3 + 4 and 5 gaps = 24: 12 for the name, 3 + … + 8.
    assert text_of(engines_panel(state)) == "\n".join([
        "engine         lease   held run wait",
        "4ea3…engine-00 live 9s    0   0    0",
        "4ea3…engine-01 live 9s   10   0    0",
        "4ea3…engine-02 live 9s   20   0    0",
        "4ea3…engine-03 live 9s   30   0    0",
        "4ea3…engine-04 live 9s   40   0    0",
        "tenant       held quota use run wait",
        "tea…g-name-0    1     —   —   0    0",
        "tea…g-name-1    1     —   —   0    0",
        "tea…g-name-2    1     —   —   0    0",
    ])
    # In a panel 6 lines high: 2 headers, 4 lines for 5 + 3 rows. The longest run gives up
    # rows first, a cut run takes a line for its "+N more": one row and one line each. The
    # tenants' is a row of their sums (the tenant rows shown add up to all of them).
    assert text_of(engines_panel(state), height=6) == "\n".join([
        "engine         lease   held run wait",
        "4ea3…engine-00 live 9s    0   0    0",
        "+4 more engines",
        "tenant       held quota use run wait",
        "tea…g-name-0    1     —   —   0    0",
        "+2 more         2     —   —   0    0",
    ])
    # Compact, 4 lines, no headers; the name gets 20 cells: 6 + … + 13.
    assert text_of(engines_panel(state, compact=True), height=4) == "\n".join([
        "4ea381…c1d-engine-00 live 9s  0 held",
        "+4 more engines",
        "team-w…a-long-name-0 quota —  1    —",
        "+2 more              quota —  2    —",
    ])


def test_a_cut_tenant_list_shows_its_other_entry_as_the_tenants_left_out():
    # The daemon lists at most so many tenants: 3 entries here, the last "(other)" summing
    # the 1,200 - 2 = 1,198 it left out (num_tenants counts them all).
    tenants = [
        common_pb2.TenantState(tenant="acme", blocks_held=300, blocks_reserved=100, quota_blocks=500, running=3),
        common_pb2.TenantState(tenant="user-17", blocks_held=40, running=1),
        common_pb2.TenantState(tenant="(other)", blocks_held=250, running=20, waiting=1500),
    ]
    state = state_of(snapshot(tenants=tenants, num_tenants=1200))
    assert text_of(engines_panel(state)) == "\n".join([
        "no engine sessions",
        "tenant      held quota use run  wait",
        "acme         300   500 80%   3     0",
        "user-17       40     —   —   1     0",
        "+1,198 more  250     —   —  20 1,500",
    ])
    # Too short a panel for every row: the named ones give way to one "+N more" row, which
    # sums them with "(other)" and counts every tenant not shown (it read "+1 more tenants"
    # with no figures, then "+1,198 more" with the figures of "(other)" alone).
    assert text_of(engines_panel(state), height=4) == "\n".join([
        "no engine sessions",
        "tenant      held quota use run  wait",
        "acme         300   500 80%   3     0",
        "+1,199 more  290     —   —  21 1,500",
    ])
    assert text_of(engines_panel(state, compact=True), height=2) == "\n".join([
        "acme               quota 500 300 80%",
        "+1,199 more        quota —   290   —",
    ])
    assert text_of(engines_panel(state, compact=True), height=1) == (
        "+1,200 more        quota —   590   —"
    )
    # An older daemon sends no count: a tenant named "(other)" is then one like the others.
    older = state_of(snapshot(tenants=tenants))
    assert text_of(engines_panel(older)).splitlines()[-1] == "(other)      250     —   —  20 1,500"


@given(tenants=st.integers(min_value=1, max_value=40), listed=st.integers(min_value=2, max_value=12),
       engines=st.integers(min_value=0, max_value=3), height=st.integers(min_value=1, max_value=16),
       compact=st.booleans())
def test_the_tenant_rows_shown_always_add_up_to_every_tenant(tenants, listed, engines, height, compact):
    # Whatever the panel's height and however many tenants the daemon left out of its list:
    # one "+N more" row at most, N the tenants not shown, and the held column adds up to
    # every tenant's. (A cut panel showed "+N more tenants" without figures above the
    # daemon's "+M more" row, whose figures were those of "(other)" alone.)
    everyone = [common_pb2.TenantState(tenant=f"t{i}", blocks_held=1 + i % 4) for i in range(tenants)]
    entries = everyone
    if tenants > listed:  # cut as the daemon cuts: the largest, and "(other)" for the rest
        everyone.sort(key=lambda t: -t.blocks_held)
        rest = everyone[listed - 1 :]
        entries = [*everyone[: listed - 1],
                   common_pb2.TenantState(tenant="(other)", blocks_held=sum(t.blocks_held for t in rest))]
    state = state_of(snapshot(
        engines=[common_pb2.EngineState(engine_id=f"e{i}", lease_remaining_s=9.0) for i in range(engines)],
        tenants=entries, num_tenants=tenants,
    ))
    lines = text_of(engines_panel(state, compact), width=40, height=height).splitlines()
    tenant_lines = [line for line in lines if line.startswith("t") and line[1].isdigit()
                    or line.startswith("+") and "engines" not in line]
    more = [line for line in tenant_lines if line.startswith("+")]
    assert len(more) <= 1 and (not more or tenant_lines[-1] == more[0]), lines
    if more:
        assert more[0].startswith(f"+{tenants - (len(tenant_lines) - 1)} more "), lines
    held_at = -2 if compact else -5  # "quota —  held  use", or "held quota use run wait"
    if tenant_lines:
        held = sum(int(line.split()[held_at]) for line in tenant_lines)
        assert held == sum(t.blocks_held for t in everyone), lines


@given(sizes=st.lists(st.integers(min_value=0, max_value=30), min_size=1, max_size=4),
       room=st.integers(min_value=0, max_value=60))
def test_fitted_rows_fill_the_room_and_never_overflow_it(sizes, room):
    shown = drawing.fit_rows(sizes, room)
    lines = sum(count + (count < size) for count, size in zip(shown, sizes))
    # Never a "+1 more" (it would take the line of the row it stands for).
    assert all(0 <= count <= size and count != size - 1 for count, size in zip(shown, sizes))
    if sum(sizes) <= room:
        assert shown == sizes
    elif room >= 2 * len(sizes):  # a row and a "+N more" each fit: the room is filled
        assert lines == room
    elif room >= len(sizes):  # a line each fits: no more than the room
        assert lines <= room


@given(text=st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=40),
       width=st.integers(min_value=1, max_value=40))
def test_middle_ellipsis_fits_and_keeps_both_ends(text, width):
    from rich.text import Text

    cut = drawing.middle_ellipsis(Text(text), width).plain
    if Text(text).cell_len <= width:
        assert cut == text
    else:
        assert Text(cut).cell_len <= width and "…" in cut
        assert text.startswith(cut.split("…")[0]) and text.endswith(cut.split("…")[-1])


def test_replays_that_do_not_fit_are_counted_the_finished_ones_last():
    done = common_pb2.ReplayState(replay_id="a", trace="done.csv", position=100, total=100,
                                  speed=20.0, done=True)
    live = common_pb2.ReplayState(replay_id="b", trace="live.csv", position=30, total=100,
                                  speed=20.0)
    dead = common_pb2.ReplayState(replay_id="c", trace="dead.jsonl", position=40, total=100,
                                  speed=5.0, done=True)
    state = state_of(snapshot(replays=[done, live, dead]))
    # A panel 7 lines high: two replays of 3 lines, the unfinished ones (running before
    # stopped short), and the line that counts the third; no line left for the hint.
    # Bars: 36 - 1 - len("30/100 20×") = 25 cells, 30% = 7.5 -> 8 █; 36 - 1 - 9 = 26, 40% =
    # 10.4 -> 10 █.
    assert text_of(panels.replays_panel(state), height=7) == "\n".join([
        "live.csv",
        "█" * 8 + "░" * 17 + " 30/100 20×",
        "30% running  policy —",
        "dead.jsonl",
        "█" * 10 + "░" * 16 + " 40/100 5×",
        "stopped at 40%  policy —",
        "+1 more replays",
    ])
    # Without a height (or with room), all of them and the hint.
    assert text_of(panels.replays_panel(state)).splitlines()[6:] == [
        "done.csv", "█" * 24 + " 100/100 20×", "100% done  policy —", "r: start a replay",
    ]


def test_replays_are_listed_newest_first_and_running_ones_stay_in_view():
    def replay(replay_id: str, position: int, done: bool = False, total: int = 100) -> common_pb2.ReplayState:
        return common_pb2.ReplayState(replay_id=replay_id, trace=f"{replay_id}.csv", position=position,
                                      total=total, speed=1.0, done=done)

    # In the daemon's order, oldest first: a replay still running, one finished, one that
    # stopped at 40%, another finished, one with no total that finished, the newest running.
    replays = [replay("old-live", 30), replay("done-1", 100, True), replay("stopped", 40, True),
               replay("done-2", 100, True), replay("no-total", 0, True, total=0), replay("new-live", 60)]
    state = state_of(snapshot(replays=replays))
    names = [line for line in text_of(panels.replays_panel(state)).splitlines() if line.endswith(".csv")]
    # Newest first within running, stopped short, finished.
    assert names == ["new-live.csv", "old-live.csv", "stopped.csv", "no-total.csv", "done-2.csv", "done-1.csv"]
    # 7 lines: the two running ones (3 lines each) and "+4 more"; 5 lines at 80x24 (2 lines
    # each): the same two.
    assert [line for line in text_of(panels.replays_panel(state), height=7).splitlines()
            if line.endswith(".csv") or line.startswith("+")] == ["new-live.csv", "old-live.csv", "+4 more replays"]
    compact = text_of(panels.replays_panel(state, compact=True), height=5).splitlines()
    assert [line.split()[0] for line in compact[::2]] == ["new-live.csv", "old-live.csv", "+4"]


# -- which daemon: its start time tells a restart, its version and uptime head the screen ---

STARTED = 1_700_000_000.0


def test_another_start_time_is_a_restart_even_when_the_counters_went_up():
    """A busy new daemon whose counters already passed an idle old one's: the counters
    alone cannot tell, the start time does."""
    old = snapshot(time_unix_s=STARTED + 100, started_unix_s=STARTED, num_preemptions=2,
                   decisions_by_kind={"DECISION_KIND_ADMIT": 5})
    new = snapshot(time_unix_s=STARTED + 160, started_unix_s=STARTED + 150, num_preemptions=40,
                   decisions_by_kind={"DECISION_KIND_ADMIT": 900})
    state = state_of(old, new)
    assert state.restarts == 1
    assert [s.time_s for s in state.history] == [STARTED + 160]  # the plots start over


def test_the_same_start_time_is_the_same_daemon_whatever_its_clock_and_counters_do():
    """Decided: the start time, when both snapshots carry it, is the whole answer. One
    process's cumulative counters never go backwards; its wall clock may (an NTP step), and
    that must not wipe the plots and the decisions as if it had restarted."""
    made = [decision(seq, common_pb2.DECISION_KIND_ADMIT, "fits", f"r{seq}") for seq in (1, 2)]
    before = snapshot(time_unix_s=STARTED + 100, started_unix_s=STARTED, num_preemptions=7,
                      decisions_by_kind={"DECISION_KIND_ADMIT": 9})
    stepped_back = snapshot(time_unix_s=STARTED + 40, started_unix_s=STARTED, num_preemptions=3,
                            decisions_by_kind={"DECISION_KIND_ADMIT": 2})
    state = state_of(before, decisions=made).with_response(
        observer_pb2.WatchResponse(snapshot=stepped_back)
    )
    assert state.restarts == 0
    assert [d.request_id for d in state.decisions] == ["r1", "r2"]
    # The plots are on the daemon's clock: they start over from the stepped-back time
    # rather than wait 60 s for it to pass their last point.
    assert [s.time_s for s in state.history] == [STARTED + 40]


@pytest.mark.parametrize("started_before, started_after", [(0.0, 0.0), (STARTED, 0.0), (0.0, STARTED)])
def test_without_a_start_time_on_either_side_the_counters_guess(started_before, started_after):
    """An older daemon (or recording) says no start time: the clock or the counters going
    backwards is the guess, and a restart with higher counters goes unseen."""
    before = snapshot(time_unix_s=1000.0, started_unix_s=started_before, num_preemptions=5)
    went_back = snapshot(time_unix_s=1001.0, started_unix_s=started_after, num_preemptions=0)
    went_up = snapshot(time_unix_s=1001.0, started_unix_s=started_after, num_preemptions=6)
    assert state_of(before, went_back).restarts == 1
    assert state_of(before, went_up).restarts == 0


def test_uptime_is_the_snapshots_own_time_since_the_start():
    assert daemon_uptime_s(snapshot(time_unix_s=STARTED + 7980.5, started_unix_s=STARTED)) == 7980.5
    assert daemon_uptime_s(snapshot(time_unix_s=STARTED - 3, started_unix_s=STARTED)) == 0.0  # clock stepped back
    assert daemon_uptime_s(snapshot(time_unix_s=STARTED)) is None  # an older daemon: not said


def test_status_line_names_the_daemons_version_and_uptime():
    up = snapshot(time_unix_s=STARTED + 2 * 3600 + 13 * 60 + 5, started_unix_s=STARTED,
                  daemon_version="0.4.0", plan=common_pb2.PoolPlan(model="m"))
    state = state_of(up).with_link(Link.CONNECTED)
    assert text_of(status_line(state), width=100) == (
        " kvbudget  ● connected  m  optimistic  daemon 0.4.0 · up 2h13m  unix:///test.sock"
    )
    # Drawn from the state alone: the same state, the same line, whenever it is drawn.
    assert text_of(status_line(state, now=1e9), width=100) == text_of(status_line(state), width=100)
    # What an older daemon does not say is left out.
    no_start = state_of(snapshot(daemon_version="0.4.0"))
    assert text_of(status_line(no_start.with_link(Link.CONNECTED)), width=100) == (
        " kvbudget  ● connected  optimistic  daemon 0.4.0  unix:///test.sock"
    )
    older = state_of(snapshot()).with_link(Link.CONNECTED)
    assert text_of(status_line(older), width=100) == " kvbudget  ● connected  optimistic  unix:///test.sock"
    # Disconnected: the last snapshot's uptime would stand still; it is not shown.
    down = state.with_link(Link.DISCONNECTED, "UNAVAILABLE: Socket closed", 1.0)
    assert "up " not in text_of(status_line(down), width=200)


def test_decisions_title_shows_the_rate_only_while_live():
    state = DashboardState.initial("unix:///t.sock").with_link(Link.CONNECTED)
    # Two updates 0.5 s apart on the daemon's clock (received at t=50 and 50.5 on the
    # app's), 0 then 40 decisions made: 40 / 0.5 s = 80/s while live; stale after
    # max(2 s, 5 x 0.5 s) = 2.5 s without an update.
    for t, made, now in ((1000.0, 0, 50.0), (1000.5, 40, 50.5)):
        response = observer_pb2.WatchResponse(
            snapshot=snapshot(time_unix_s=t, decisions_by_kind={"admit": made}),
            decisions=[decision(k, 1, "fits", f"r{k}") for k in (1, 2, 3)] if made else (),
        )
        state = state.with_response(response, now)
    title = decisions.decisions_title
    assert title(state, now=52.9).plain == "Decisions · 3 received · 80/s"
    # What the daemon made, not what this dashboard saw: a rate, and those it skipped.
    skipped = replace(state, decisions_dropped=1234)
    assert title(skipped, now=52.9).plain == "Decisions · 3 received · 1,234 skipped · 80/s"
    # The daemon hung (no update for 2.5 s) or gone: the last rate is no rate now.
    assert title(state, now=53.0).plain == "Decisions · 3 received"
    down = state.with_link(Link.DISCONNECTED, "UNAVAILABLE: Socket closed", 5.0, now=51.0)
    assert title(down, now=51.0).plain == "Decisions · 3 received"
    assert title(down).plain == "Decisions · 3 received"  # even with no clock to date it
    # A recording never goes stale: its rate is the recording's, shown to the end.
    played = replace(state, connection=replace(state.connection, playback=True, link=Link.DISCONNECTED))
    assert title(played, now=3600.0).plain == "Decisions · 3 received · 80/s"


def test_decisions_title_says_paused_filtered_and_too_small():
    state = state_of(snapshot())
    assert decisions.decisions_title(state, paused=True, query="[/x]").plain == (
        "Decisions · 0 received · 0/s · PAUSED (space) · filter [/x]"
    )
    # No room for a row under the header: said first, where a narrow border still has it.
    assert decisions.decisions_title(state, room_for_rows=False).plain == (
        "Decisions · terminal too small for rows (80x24) · 0 received · 0/s"
    )
