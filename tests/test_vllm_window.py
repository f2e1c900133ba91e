"""Sliding windows: vLLM frees the blocks that leave a window, the daemon reclaims the same
ones from the progress the adapter reports, and the books agree after every step,
preemptions included. mistral-7b-v0.1: every layer in a 4,096-token window (one group);
gemma-2-9b: windowed and full layers alternate (two groups, vLLM's hybrid manager)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (./dev test-vllm runs these)")

from daemon_harness import DaemonProcess  # noqa: E402
from vllm_driver import build_scheduler, drive, model_dir  # noqa: E402

from kvbudget.traces.trace_request import TraceRequest  # noqa: E402

MAX_LEN, WINDOW = 8192, 4096


# (model, vLLM's groups hybrid, blocks, r2's blocks per group once its prompt is computed)
@pytest.mark.parametrize("model, hybrid, blocks, held", [
    ("mistral-7b-v0.1", False, 1500, "[256]"),
    ("gemma-2-9b", True, 1300, "[256, 275]"),
])
def test_window_reclaims_match_vllms_frees_with_zero_drift(model, hybrid, blocks, held, tmp_path, monkeypatch):
    rows = [TraceRequest(i * 0.5, 3000 + 700 * (i % 5), 1500 + 300 * (i % 3)) for i in range(12)]
    with DaemonProcess(tmp_path, "--model", model, "--num-gpu-blocks", str(blocks),
                       "--max-model-len", str(MAX_LEN), "--watermark", "0", "--backfill-depth", "0",
                       "--no-enable-prefix-caching") as daemon:
        monkeypatch.setenv("KVBUDGET_TARGET", daemon.target)
        scheduler = build_scheduler(model_dir(tmp_path, model), blocks, max_model_len=MAX_LEN,
                                    sliding_window=WINDOW, hybrid=hybrid)
        drifts = []
        run = drive(scheduler, rows, 2000, on_step=lambda _: drifts.extend(scheduler.kvbudget.check_accounting()))
        scheduler.shutdown()
        reclaims = daemon.decision_rows("kind = 'reclaim' AND request_id = 'r2' ORDER BY seq")
        ends = daemon.decision_rows("kind = 'release'")
    assert drifts == []
    assert run.finished == 12 and run.preemptions > 0
    assert sorted(r["reason"] for r in ends) == ["finished"] * 12
    # r2's 4,400-token prompt computed in one step: the window keeps its last 4,095 tokens
    # and the one being computed, so 4,400 - 4,095 = 305 tokens, 19 whole blocks, leave it
    # (275 - 19 = 256 held); a full-attention group keeps all cdiv(4,400, 16) = 275.
    first = reclaims[0]
    assert (first["num_computed"], first["freed_blocks"], first["blocks_held"]) == (4400, 19, held)
