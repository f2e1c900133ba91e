"""kvbudget.vllm.Scheduler when the daemon goes away: fail_open keeps vLLM serving on its
own admission and resumes with the daemon once it is back (what vLLM runs submitted again,
the books agreeing again); fail_closed starts nothing new; async scheduling is refused at
start naming the setting. vLLM's real scheduler on CPU, a real daemon process."""

from __future__ import annotations

import signal

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (./dev test-vllm runs these)")

from daemon_harness import DaemonProcess, wait_until  # noqa: E402
from vllm_driver import build_scheduler, drive, make_request, model_dir  # noqa: E402

from kvbudget.traces.loaders import load_trace  # noqa: E402
from kvbudget.traces.trace_request import TraceRequest  # noqa: E402

BLOCKS, MAX_LEN = 3000, 4096
ARGS = ("--num-gpu-blocks", str(BLOCKS), "--max-model-len", str(MAX_LEN), "--watermark", "0",
        "--backfill-depth", "0", "--no-enable-prefix-caching")


def test_daemon_killed_mid_run_fail_open_keeps_serving_and_resumes(tmp_path, monkeypatch):
    trace = load_trace("azure", limit=120)
    daemon = DaemonProcess(tmp_path, *ARGS).start()
    monkeypatch.setenv("KVBUDGET_TARGET", daemon.target)
    monkeypatch.setenv("KVBUDGET_ENGINE_ID", "vllm-failover")
    monkeypatch.setenv("KVBUDGET_STEP_TIMEOUT_S", "1")
    scheduler = build_scheduler(model_dir(tmp_path), BLOCKS, max_model_len=MAX_LEN)
    adapter = scheduler.kvbudget
    seen = {}

    def on_step(run):
        if run.steps == 300:  # mid-run: requests run and wait
            seen["running_at_kill"] = len(scheduler.running)
            daemon.signal(signal.SIGKILL)
            daemon.wait()
        elif run.steps == 400:  # vLLM went on alone meanwhile; the daemon comes back
            seen["unreachable"] = adapter.metrics.counts["unreachable_steps"]
            daemon.start()
            wait_until(lambda: adapter.link.up)
        elif run.steps > 400 and adapter.metrics.counts["resyncs"] and "drift_after" not in seen:
            seen["drift_after"] = adapter.check_accounting()

    try:
        run = drive(scheduler, trace.requests, trace.max_output_tokens, on_step=on_step)
        counts = dict(adapter.metrics.counts)
        scheduler.shutdown()
        ends = daemon.decision_rows("kind IN ('release', 'reject')")
    finally:
        daemon.stop()
    assert seen["running_at_kill"] > 0
    assert run.finished == 120 and run.rejected == 0  # every request served
    assert counts["link_failures"] == 1 and counts["resyncs"] == 1
    assert seen["unreachable"] == 100  # steps 301..400 ran on vLLM's own admission
    assert seen["drift_after"] == []  # the first step after the resync: the books agree again
    # The daemon's second life decided the rest: the last request (it arrives 45.5 s into
    # the trace, well after step 400's 8 s) ends in its log, finished.
    assert [(r["kind"], r["reason"]) for r in ends if r["request_id"] == "r119"] == [("release", "finished")]


def test_fail_closed_starts_nothing_new_without_the_daemon(tmp_path, monkeypatch):
    monkeypatch.setenv("KVBUDGET_TARGET", f"unix://{tmp_path}/nobody.sock")
    monkeypatch.setenv("KVBUDGET_FAIL_MODE", "closed")
    monkeypatch.setenv("KVBUDGET_CONNECT_TIMEOUT_S", "0.5")
    scheduler = build_scheduler(model_dir(tmp_path), BLOCKS, max_model_len=MAX_LEN)
    scheduler.add_request(make_request(TraceRequest(0.0, 100, 10), "r0", 10))
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {} and [r.request_id for r in scheduler.waiting] == ["r0"]
    assert scheduler.kvbudget.metrics.counts["unreachable_steps"] == 1
    scheduler.shutdown()


def test_fail_open_admits_by_vllm_without_the_daemon(tmp_path, monkeypatch):
    monkeypatch.setenv("KVBUDGET_TARGET", f"unix://{tmp_path}/nobody.sock")
    monkeypatch.setenv("KVBUDGET_CONNECT_TIMEOUT_S", "0.5")
    scheduler = build_scheduler(model_dir(tmp_path), BLOCKS, max_model_len=MAX_LEN)
    scheduler.add_request(make_request(TraceRequest(0.0, 100, 10), "r0", 10))
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {"r0": 100}
    scheduler.shutdown()


def test_async_scheduling_is_refused_naming_the_setting(tmp_path, monkeypatch):
    from vllm.config import SchedulerConfig

    real = SchedulerConfig.__init__

    def with_async(self, *args, **kwargs):
        real(self, *args, **{**kwargs, "async_scheduling": True})

    monkeypatch.setattr(SchedulerConfig, "__init__", with_async)
    monkeypatch.setenv("KVBUDGET_TARGET", f"unix://{tmp_path}/nobody.sock")
    with pytest.raises(ValueError, match="--no-async-scheduling"):
        build_scheduler(model_dir(tmp_path), BLOCKS, max_model_len=MAX_LEN)


def test_a_vllm_pool_smaller_than_the_daemons_drifts_named_and_never_stalls(tmp_path, monkeypatch, caplog):
    # The daemon budgets 3,000 blocks, vLLM has 1,000: vLLM's own allocation fails and it
    # preempts by itself. The drift is counted and named; the request is taken back.
    trace = load_trace("azure", limit=150)
    with DaemonProcess(tmp_path, *ARGS) as daemon:
        monkeypatch.setenv("KVBUDGET_TARGET", daemon.target)
        scheduler = build_scheduler(model_dir(tmp_path), 1000, max_model_len=MAX_LEN)
        run = drive(scheduler, trace.requests, trace.max_output_tokens)
        counts = dict(scheduler.kvbudget.metrics.counts)
        scheduler.shutdown()
    assert (run.finished, run.rejected) == (149, 1)  # every request ends (r127's prompt is too long)
    assert counts["drift"] > 0
    assert any("kvbudget accounting drift: request 'r" in m for m in caplog.messages)
    assert any("preempted" in m and "by itself; submitting it to the daemon again" in m for m in caplog.messages)


def test_a_session_taken_mid_run_is_opened_again_and_resubmitted_without_going_down(tmp_path, monkeypatch):
    # Another client takes the engine id over (replace_existing) and leaves: the adapter's
    # next Step fails on its blocking channel, goes again through the client, which opens a
    # new session; the adapter resubmits what vLLM runs and never counts the daemon away.
    import asyncio

    from kvbudget.client import EngineClient

    trace = load_trace("azure", limit=120)
    with DaemonProcess(tmp_path, *ARGS) as daemon:
        monkeypatch.setenv("KVBUDGET_TARGET", daemon.target)
        monkeypatch.setenv("KVBUDGET_ENGINE_ID", "vllm-taken")
        scheduler = build_scheduler(model_dir(tmp_path), BLOCKS, max_model_len=MAX_LEN)
        adapter = scheduler.kvbudget
        seen = {}

        async def take_over():
            async with EngineClient(daemon.target, "vllm-taken", replace_existing=True, heartbeat=False):
                pass

        def on_step(run):
            if run.steps == 200:
                seen["running"] = len(scheduler.running)
                asyncio.run(take_over())
            elif adapter.metrics.counts["resyncs"] and "drift_after" not in seen:
                seen["drift_after"] = adapter.check_accounting()

        run = drive(scheduler, trace.requests, trace.max_output_tokens, on_step=on_step)
        counts = dict(adapter.metrics.counts)
        scheduler.shutdown()
        ends = daemon.decision_rows("kind IN ('release', 'reject')")
    assert seen["running"] > 0
    assert run.finished == 120 and run.rejected == 0
    assert (counts["resyncs"], counts["link_failures"], counts["unreachable_steps"], counts["drift"]) == (1, 0, 0, 0)
    assert seen["drift_after"] == []
    assert [(r["kind"], r["reason"]) for r in ends if r["request_id"] == "r119"] == [("release", "finished")]
