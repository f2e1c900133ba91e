"""Prefix caching on, in vLLM and in the daemon: the adapter sends vLLM's own block hashes,
so the daemon counts the hits vLLM finds, and the books still agree after every step."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (./dev test-vllm runs these)")

from daemon_harness import DaemonProcess  # noqa: E402
from vllm_driver import STOP, build_scheduler, model_dir  # noqa: E402

BLOCKS, MAX_LEN = 400, 4096
SHARED, OWN, OUTPUT = 512, 100, 20  # tokens: a shared system prompt, each request's own part


def request(i: int):
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    prompt = [10 + t for t in range(SHARED)] + [1000 + 1000 * i + t for t in range(OWN)]
    return Request(request_id=f"p{i}", prompt_token_ids=prompt, pooling_params=None,
                   sampling_params=SamplingParams(max_tokens=OUTPUT, stop_token_ids=[STOP]),
                   block_hasher=get_request_block_hasher(16, sha256))


def test_prefix_hits_counted_alike_and_zero_drift(tmp_path, monkeypatch):
    from vllm.v1.outputs import ModelRunnerOutput

    with DaemonProcess(tmp_path, "--num-gpu-blocks", str(BLOCKS), "--max-model-len", str(MAX_LEN),
                       "--watermark", "0", "--backfill-depth", "0", "--enable-prefix-caching") as daemon:
        monkeypatch.setenv("KVBUDGET_TARGET", daemon.target)
        scheduler = build_scheduler(model_dir(tmp_path), BLOCKS, max_model_len=MAX_LEN, prefix_caching=True)
        drifts, vllm_hits = [], {}
        for i in range(4):  # one arrives each 10 steps: the ones before it computed the prefix
            scheduler.add_request(request(i))
            for _ in range(10):
                out = scheduler.schedule()
                for new in out.scheduled_new_reqs:
                    vllm_hits[new.req_id] = new.num_computed_tokens
                ids = list(out.num_scheduled_tokens)
                sampled = [[] if scheduler.requests[r].is_prefill_chunk else [7] for r in ids]
                scheduler.update_from_output(out, ModelRunnerOutput(
                    req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)}, sampled_token_ids=sampled))
                drifts += scheduler.kvbudget.check_accounting()
        scheduler.shutdown()
        admits = {r["request_id"]: (r["reason"], r["cached_hit_blocks"]) for r in daemon.decision_rows("kind = 'admit'")}
    assert drifts == []
    # vLLM finds the 32 shared blocks (512 tokens) for every request after the first; so does the daemon.
    assert vllm_hits == {"p0": 0, "p1": SHARED, "p2": SHARED, "p3": SHARED}
    assert admits == {"p0": ("fits", 0), "p1": ("prefix_hit", 32), "p2": ("prefix_hit", 32), "p3": ("prefix_hit", 32)}
