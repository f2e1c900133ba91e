"""A sliding-window model (mistral-7b-v0.1: every layer in a 4,096-token window): vLLM frees
the blocks that leave the window, the daemon reclaims the same ones from the progress the
adapter reports, and the books agree after every step, preemptions included."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (./dev test-vllm runs these)")

from daemon_harness import DaemonProcess  # noqa: E402
from vllm_driver import build_scheduler, drive, model_dir  # noqa: E402

from kvbudget.traces.trace_request import TraceRequest  # noqa: E402

BLOCKS, MAX_LEN, WINDOW = 1500, 8192, 4096


def test_window_reclaims_match_vllms_frees_with_zero_drift(tmp_path, monkeypatch):
    rows = [TraceRequest(i * 0.5, 3000 + 700 * (i % 5), 1500 + 300 * (i % 3)) for i in range(12)]
    with DaemonProcess(tmp_path, "--model", "mistral-7b-v0.1", "--num-gpu-blocks", str(BLOCKS),
                       "--max-model-len", str(MAX_LEN), "--watermark", "0", "--backfill-depth", "0",
                       "--no-enable-prefix-caching") as daemon:
        monkeypatch.setenv("KVBUDGET_TARGET", daemon.target)
        scheduler = build_scheduler(model_dir(tmp_path, "mistral-7b-v0.1"), BLOCKS, max_model_len=MAX_LEN,
                                    sliding_window=WINDOW)
        drifts = []
        run = drive(scheduler, rows, 2000, on_step=lambda _: drifts.extend(scheduler.kvbudget.check_accounting()))
        scheduler.shutdown()
        reclaims = daemon.decision_rows("kind = 'reclaim' AND request_id = 'r2' ORDER BY seq")
        ends = daemon.decision_rows("kind = 'release'")
    assert drifts == []
    assert run.finished == 12 and run.preemptions > 0
    assert sorted(r["reason"] for r in ends) == ["finished"] * 12
    # r2's 4,400-token prompt computed in one step: the window keeps its last 4,095 tokens
    # and the one being computed, so 4,400 - 4,095 = 305 tokens, 19 whole blocks, leave it.
    first = reclaims[0]
    assert (first["num_computed"], first["freed_blocks"], first["blocks_held"]) == (4400, 19, "[256]")
