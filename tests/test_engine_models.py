"""The two engine models of a replay on small traces, against the real admission controller:
`decodes-first` (the default) and `vllm` (as vLLM 0.33 steps under kvbudget.vllm.Scheduler),
with every decision they differ in worked out by hand. (Against vLLM itself:
tests/test_vllm_azure.py.)

The toy model: one full-attention group, 16-token blocks; a step costs 20 ms + 1 ms per
prefill token; optimistic, no watermark, no backfill, no prefix caching.
"""

from __future__ import annotations

import json

import pytest

from kvbudget.cli.main import main
from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController
from kvbudget.daemon.core.spec import AttentionSpec, group_layers, kv_dtype
from kvbudget.traces.replay import ControllerBackend
from kvbudget.traces.sim_engine import EngineConfig
from kvbudget.traces.simulation import Simulation
from kvbudget.traces.trace_request import TraceRequest

FULL = group_layers([AttentionSpec(16, 8, 128, kv_dtype("bf16"))] * 4, model_name="toy-full")


class Recording(ControllerBackend):
    """The in-process controller, keeping every decision in the order made."""

    def __init__(self, controller: AdmissionController) -> None:
        super().__init__(controller)
        self.decisions = []

    def step(self, engine_id, ops, now):
        made = super().step(engine_id, ops, now)
        self.decisions += made
        return made

    def idle(self, engine_id, now):
        made = super().idle(engine_id, now)
        self.decisions += made
        return made


def replay(engine_model: str, trace: list[TraceRequest], num_blocks: int, **engine):
    config = EngineConfig(step_base_s=0.020, per_prefill_token_s=0.001, grow_ahead_blocks=0, max_model_len=4096,
                          engine_model=engine_model, **engine)
    admission = AdmissionConfig(max_model_len=4096, max_num_batched_tokens=config.max_num_batched_tokens,
                                policy="optimistic", enable_prefix_caching=False, watermark=0, backfill_depth=0)
    backend = Recording(AdmissionController(FULL, num_blocks, admission))
    run = Simulation(trace, FULL, config).run(backend)
    return run, [(d.kind.value, d.request_id, d.num_tokens) for d in backend.decisions], backend.decisions


def test_decodes_first_grows_a_token_at_a_time_vllm_a_block_at_a_time():
    # Prompt 20, output 20: admitted with 20 slots (2 blocks); the prefill step samples
    # token 1, and each of the 19 decode steps needs one slot more (21 .. 39).
    one = [TraceRequest(0.0, 20, 20)]
    run, decisions, _ = replay("decodes-first", one, 100, max_new_tokens=20)
    assert decisions == [("admit", "0", 20), *[("grow", "0", n) for n in range(21, 40)], ("release", "0", 0)]
    # vllm: slot 21 opens block 2, asked to its end (32); slot 33 opens block 3, asked to
    # its end capped at the request's maximum length, 20 + 20 = 40.
    ours, decisions, _ = replay("vllm", one, 100, max_new_tokens=20)
    assert decisions == [("admit", "0", 20), ("grow", "0", 32), ("grow", "0", 40), ("release", "0", 0)]
    # The same 20 steps either way: 20 x 20 ms + 20 prefill tokens x 1 ms.
    assert run.steps == ours.steps == 20
    assert run.end_s == ours.end_s == pytest.approx(0.420)


def test_the_victim_of_a_full_pool_depends_on_the_grow_order():
    # Pool of 3 blocks; A ("0") and B ("1"): prompt 16, output 3 (maximum length 19).
    # Step 1 admits both (a block each) and prefills both: each samples token 1 and needs
    # slot 17, a second block, with one block free.
    two = [TraceRequest(0.0, 16, 3), TraceRequest(0.0, 16, 3)]
    run, decisions, made = replay("decodes-first", two, 3, max_new_tokens=3)
    # decodes-first grows A first (the earlier decode), to exactly 17: it takes the last
    # block, and B, the latest admitted, preempts itself holding 1 block, to resume at 17.
    # A finishes in step 3 (growing to 18); B comes back at 17 tokens and grows to 18.
    assert decisions == [("admit", "0", 16), ("admit", "1", 16), ("grow", "0", 17), ("preempt", "1", 0),
                         ("grow", "0", 18), ("release", "0", 0), ("admit", "1", 17), ("grow", "1", 18),
                         ("release", "1", 0)]
    assert made[3].freed_blocks == 1 and made[3].detail.endswith("resumes at 17 tokens")
    # vllm grows latest admitted first, to the end of the block (capped at 19): B takes the
    # last block, then A's grow preempts B (the latest admitted) holding 2 blocks, to resume
    # at 19; A needs no grow for slot 18, nor B once back at 19.
    ours, decisions, made = replay("vllm", two, 3, max_new_tokens=3)
    assert decisions == [("admit", "0", 16), ("admit", "1", 16), ("grow", "1", 19), ("preempt", "1", 0),
                         ("grow", "0", 19), ("release", "0", 0), ("admit", "1", 19), ("release", "1", 0)]
    assert made[3].freed_blocks == 2 and made[3].detail.endswith("resumes at 19 tokens")
    # The same steps: 52 ms (32 prefill tokens), 20, 20, 37 (B recomputes 17 tokens), 20.
    assert run.steps == ours.steps == 5
    assert run.end_s == ours.end_s == pytest.approx(0.149)


def test_vllm_submits_every_arrival_decodes_first_only_what_max_num_seqs_runs():
    # max_num_seqs 1, three arrivals at 0, prompt 16, output 1 (each done in its prefill step).
    three = [TraceRequest(0.0, 16, 1)] * 3
    _, decisions, _ = replay("decodes-first", three, 100, max_new_tokens=1, max_num_seqs=1)
    # The engine keeps the other two until one ends: the daemon never queues anything.
    assert [k for k, _, _ in decisions] == ["admit", "release", "admit", "release", "admit", "release"]
    # vllm hands all three to the daemon at once (as the adapter submits every arrival):
    # one is admitted (admit_seqs 1), two queue; each finish admits the next.
    _, decisions, _ = replay("vllm", three, 100, max_new_tokens=1, max_num_seqs=1)
    assert [k for k, _, _ in decisions] == ["admit", "queue", "queue", "release", "admit", "release", "admit", "release"]


def _azure(capsys, *argv: str) -> dict:
    assert main(["replay", "azure", "--offline", "--limit", "20", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_engine_model_is_in_the_settings_and_refuses_grow_ahead(capsys):
    assert _azure(capsys)["settings"] == {"grow_ahead_blocks": 4}  # (the default's, as before)
    assert _azure(capsys, "--engine-model", "vllm")["settings"] == {"engine_model": "vllm"}
    for argv in (["--grow-ahead-blocks", "2"], ["--compare", "a=optimistic:grow_ahead_blocks=2"]):
        assert main(["replay", "azure", "--offline", "--limit", "20", "--engine-model", "vllm", *argv]) == 2
        err = capsys.readouterr().err
        assert "grow_ahead_blocks" in err.replace("-", "_") and "end of each block" in err
        assert len(err.strip().splitlines()) == 1
