"""vLLM's real v1 scheduler (CPU, no model) under kvbudget.vllm.Scheduler against a real
daemon process: the Azure trace's first 500 rows under each policy.

Zero drift (vLLM's blocks per request and group equal the daemon's after every step), every
request ends in the daemon's log with its reason, the two prompts past max_model_len end
with the daemon's error as the API client sees it, and the figures match `kvbudget replay
--offline --engine-model vllm` of the same policy and settings within 1% (docs/vllm.md,
"Measured": the decisions are the same, one by one).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (./dev test-vllm runs these)")

from daemon_harness import DaemonProcess  # noqa: E402
from vllm_driver import build_scheduler, drive, model_dir  # noqa: E402

from kvbudget.traces.loaders import load_trace  # noqa: E402

BLOCKS, MAX_LEN, ROWS = 3000, 4096, 500
SETTINGS = ("--watermark", "0", "--backfill-depth", "0", "--no-enable-prefix-caching",
            "--max-num-batched-tokens", "8192")  # vLLM's defaults: strict FCFS, no margin
REPLAY = ("--model", "llama-3.1-8b", "--num-gpu-blocks", str(BLOCKS), "--max-model-len", str(MAX_LEN),
          "--limit", str(ROWS), "--engine-model", "vllm", "--no-prefix-caching",
          "--set", "admission.watermark=0", "--set", "admission.backfill_depth=0", "--json")
POLICIES = ("guaranteed", "naive", "optimistic", "predictive")
FIGURES = ("preemptions", "wait_p50_s", "wait_p99_s", "makespan_s")


def offline(policy: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "kvbudget", "replay", "azure", "--offline", "--policy", policy,
                          *REPLAY], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    return result[0] if isinstance(result, list) else result


def close(ours: float, theirs: float) -> bool:
    return abs(ours - theirs) <= 0.01 * abs(theirs) + 1e-9


@pytest.mark.parametrize("policy", POLICIES)
def test_azure_500_follows_the_daemon_with_zero_drift(policy, tmp_path, monkeypatch):
    trace = load_trace("azure", limit=ROWS)
    too_long = {f"r{i}" for i, row in enumerate(trace.requests) if row.prompt_tokens > MAX_LEN}
    assert len(too_long) == 2
    with DaemonProcess(tmp_path, "--num-gpu-blocks", str(BLOCKS), "--max-model-len", str(MAX_LEN),
                       "--policy", policy, *SETTINGS) as daemon:
        monkeypatch.setenv("KVBUDGET_TARGET", daemon.target)
        monkeypatch.setenv("KVBUDGET_ENGINE_ID", "vllm-azure")
        scheduler = build_scheduler(model_dir(tmp_path), BLOCKS, max_model_len=MAX_LEN)
        drifts = []
        run = drive(scheduler, trace.requests, trace.max_output_tokens,
                    on_step=lambda _: drifts.extend(scheduler.kvbudget.check_accounting()))
        counts = dict(scheduler.kvbudget.metrics.counts)
        scheduler.shutdown()
        kinds = Counter(row["kind"] for row in daemon.decision_rows())
        ends = daemon.decision_rows("kind IN ('release', 'reject', 'expire')")
    assert drifts == [] and counts["drift"] == 0
    assert counts["steps"] == run.steps and counts["unreachable_steps"] == 0
    # Every request ends once in the daemon's log, with its reason.
    assert sorted(r["request_id"] for r in ends) == sorted(f"r{i}" for i in range(ROWS))
    assert {r["request_id"]: (r["kind"], r["reason"]) for r in ends if r["kind"] != "release"} == {
        rid: ("reject", "prompt_too_long") for rid in too_long}
    assert {r["reason"] for r in ends if r["kind"] == "release"} == {"finished"}
    # A rejected request finishes with the daemon's reason, as vLLM's API client sees it.
    assert set(run.errors) == too_long
    assert all("rejected this request: prompt_too_long" in message for message in run.errors.values())
    assert counts["daemon_preemptions"] == run.preemptions
    theirs, ours = offline(policy), run.figures()
    assert (ours["finished"], ours["rejected"]) == (theirs["finished"], theirs["rejected"]) == (498, 2)
    for name in FIGURES:  # (1% of a preemption count under 100 is the count itself)
        assert close(ours[name], theirs[name]), (name, ours[name], theirs[name])
    # And the same decisions, kind by kind (row by row, as measured: docs/vllm.md).
    assert dict(kinds) == theirs["decisions_by_kind"]
