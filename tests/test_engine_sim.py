"""The simulated engine: step-time model, chunked prefill, grow-ahead, preemption and
recompute, call skipping — against a scripted backend whose answers we choose, then
against the real admission controller."""

from __future__ import annotations

import pytest

from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController
from kvbudget.daemon.core.records import Decision, DecisionKind, Reason
from kvbudget.daemon.core.spec import AttentionSpec, SlidingWindowSpec, group_layers, kv_dtype
from kvbudget.daemon.core.step import StepOps
from kvbudget.traces.trace_request import TraceRequest
from kvbudget.traces.replay import ControllerBackend
from kvbudget.traces.sim_engine import EngineConfig
from kvbudget.traces.sim_request import spread_arrivals
from kvbudget.traces.simulation import Simulation

BF16 = kv_dtype("bf16")
FULL = group_layers([AttentionSpec(16, 8, 128, BF16)] * 4, model_name="toy-full")


class ScriptedBackend:
    """Admits every submit with min(prompt, F) slots, grants every grow, except that the
    grows listed in `preempt_on_grow` (1-based count of grow ops) preempt the request;
    an idle poll re-admits preempted requests with the length they had reached."""

    def __init__(self, layout=FULL, num_blocks: int = 10_000, F: int = 8192, preempt_on_grow=()) -> None:
        self.layout = layout
        self.num_blocks = num_blocks
        self.F = F
        self.preempt_on_grow = set(preempt_on_grow)
        self.seq = 0
        self.calls: list[StepOps] = []
        self.grow_count = 0
        self.preempted: dict[str, int] = {}
        self.lengths: dict[str, int] = {}

    def _d(self, kind: DecisionKind, request_id: str, num_tokens: int = 0) -> Decision:
        self.seq += 1
        return Decision(self.seq, 0.0, kind, Reason.FITS, request_id, num_tokens=num_tokens)

    def open_engine(self, engine_id: str) -> None:
        pass

    def step(self, engine_id: str, ops: StepOps, now: float) -> list[Decision]:
        self.calls.append(ops)
        out = [self._d(DecisionKind.RELEASE, r) for r in ops.finishes]
        for request_id, num_tokens in ops.grows:
            self.grow_count += 1
            if self.grow_count in self.preempt_on_grow:
                self.preempted[request_id] = self.lengths[request_id]
                out.append(self._d(DecisionKind.PREEMPT, request_id))
            else:
                self.lengths[request_id] = num_tokens
                out.append(self._d(DecisionKind.GROW, request_id, num_tokens))
        for spec in ops.submits:
            self.lengths[spec.request_id] = min(spec.prompt_tokens, self.F)
            out.append(self._d(DecisionKind.ADMIT, spec.request_id, min(spec.prompt_tokens, self.F)))
        return out

    def poll(self, engine_id: str, now: float) -> list[Decision]:
        return []

    def idle(self, engine_id: str, now: float) -> list[Decision]:
        out = [self._d(DecisionKind.ADMIT, r, n + 1) for r, n in self.preempted.items()]
        self.preempted.clear()
        return out

    def num_free_blocks(self) -> int:
        return self.num_blocks


def _run(requests, backend, **config):
    sim = Simulation(requests, backend.layout, EngineConfig(**config))
    return sim.run(backend)


def test_one_request_by_hand():
    # prompt 100, output 3, B = 16, base 20 ms, 50 us per prefill token:
    # step 0 (t=0):     submit -> ADMIT 100 slots; prefill 100 tokens: 0.020 + 100 x 50e-6
    #                   = 0.025 s; first token at 0.025
    # step 1 (t=0.025): decode needs 101 slots > 100: grow to min(cap = 100 + 3, ...) = 103;
    #                   0.020 s -> t = 0.045
    # step 2 (t=0.045): decode within the grant: no call; t = 0.065
    # step 3 (t=0.065): 3 tokens generated: finish (release) at 0.065
    backend = ScriptedBackend()
    run = _run([TraceRequest(0.0, 100, 3)], backend)
    (r,) = run.requests
    assert r.first_token_s == pytest.approx(0.025)
    assert r.finished_s == pytest.approx(0.065)
    assert run.end_s == pytest.approx(0.065)
    assert run.steps == 3 and run.calls == 3  # step 2 asked nothing: no call
    assert [len(c.submits) for c in backend.calls] == [1, 0, 0]
    assert backend.calls[1].grows == [("0", 103)]
    assert backend.calls[1].progress == [("0", 100)]  # the prompt's blocks: cacheable
    assert backend.calls[2].finishes == ["0"]
    assert r.generated == 3 and r.preemptions == 0


def test_chunked_prefill_grows_chunk_by_chunk_within_F():
    # prompt 20,000 with F = 8,192: chunks 8,192 + 8,192 + 3,616.
    # Admission grants min(prompt, F) = 8,192; the second chunk needs 16,384 slots and may
    # ask at most computed + F = 16,384; the third needs 20,000 (= the whole prompt).
    # time to first token: 2 x (0.020 + 8192 x 50e-6) + (0.020 + 3616 x 50e-6)
    #   = 2 x 0.4296 + 0.2008 = 1.06 s
    backend = ScriptedBackend()
    run = _run([TraceRequest(0.0, 20_000, 1)], backend)
    (r,) = run.requests
    grows = [g for c in backend.calls for g in c.grows]
    assert grows == [("0", 16_384), ("0", 20_000)]
    assert r.first_token_s == pytest.approx(1.06)
    assert r.finished_s == pytest.approx(1.06)  # output 1: done with the prefill


def test_grow_ahead_means_few_calls_while_decoding():
    # prompt 160 (10 blocks), output 200: decode from slot 161 to 359.
    # Each grow asks 4 blocks (64 slots) past the need, so one grow per 65 decode steps:
    # grows at needs 161, 226, 291, 356 -> 4 grow calls for 199 decode steps.
    backend = ScriptedBackend()
    run = _run([TraceRequest(0.0, 160, 200)], backend)
    grows = [g for c in backend.calls for g in c.grows]
    assert grows == [("0", 225), ("0", 290), ("0", 355), ("0", 360)]  # capped at 160 + 200
    assert run.calls == 1 + 4 + 1  # submit, grows, finish
    assert run.steps == 200  # 1 prefill step + 199 decode steps


def test_preempted_request_recomputes_from_scratch():
    # prompt 100, output 3. The first grow (step 1) preempts it: it keeps its 1 generated
    # token but loses its KV. The step runs nothing (t += 20 ms idle: 0.045); the idle
    # poll re-admits it with 101 slots; it recomputes 101 tokens: 0.020 + 101 x 50e-6 =
    # 0.02505 -> t = 0.07005, token 2; step: grow (granted), token 3 -> t = 0.09005; finish.
    backend = ScriptedBackend(preempt_on_grow={1})
    run = _run([TraceRequest(0.0, 100, 3)], backend)
    (r,) = run.requests
    assert r.preemptions == 1 and run.decisions_by_kind["preempt"] == 1
    assert r.first_token_s == pytest.approx(0.025)  # ttft counts the first token ever
    assert r.finished_s == pytest.approx(0.09005)
    assert r.generated == 3


def test_max_num_seqs_holds_requests_in_the_engine():
    # 3 requests arrive together with max_num_seqs = 2: the third is submitted only
    # after one of the first two finished (output 2: finished at the start of step 2).
    backend = ScriptedBackend()
    run = _run([TraceRequest(0.0, 32, 2)] * 3, backend, max_num_seqs=2)
    assert [len(c.submits) for c in backend.calls if c.submits] == [2, 1]
    assert all(r.generated == 2 for r in run.requests)
    later = max(run.requests, key=lambda r: r.admitted_s)
    assert later.admitted_s > 0


def test_spread_arrivals_keeps_distinct_times_and_spreads_buckets():
    reqs = [TraceRequest(t, 10, 1) for t in (0.0, 0.0, 0.0, 3.0, 4.5)]
    spread = spread_arrivals(reqs, seed=1)
    assert spread[0] == 0.0 and spread[3:] == [3.0, 4.5]
    assert all(0.0 <= t < 3.0 for t in spread[:3]) and spread[:3] == sorted(spread[:3])
    assert spread == spread_arrivals(reqs, seed=1)
    assert spread != spread_arrivals(reqs, seed=2)


def test_spread_arrivals_of_an_unsorted_trace_match_the_sorted_one():
    # One value per request in the order given, as if the requests had come sorted.
    times = (3.0, 0.0, 4.5, 0.0, 0.0)
    spread = spread_arrivals([TraceRequest(t, 10, 1) for t in times], seed=1)
    ordered = spread_arrivals([TraceRequest(t, 10, 1) for t in sorted(times)], seed=1)
    assert [spread[i] for i in (1, 3, 4, 0, 2)] == ordered
    assert spread[1] == 0.0 and min(spread) == 0.0


def test_simulation_counts_time_from_the_earliest_arrival_not_the_first_row():
    # Rows out of time order (the first arrives at 10 s, the second at 0): measured from
    # the first row, the second arrived at -10 s, "waited" 10 s and the run took 0.2 s.
    backend = ScriptedBackend()
    run = _run([TraceRequest(10.0, 100, 10), TraceRequest(0.0, 100, 10)], backend)
    by_arrival = sorted(run.requests, key=lambda r: r.arrival_s)
    assert [r.arrival_s for r in by_arrival] == [0.0, 10.0]
    assert all(r.admitted_s - r.arrival_s < 0.1 for r in run.requests)
    assert run.end_s >= 10.0


def test_max_new_tokens_is_a_floor_and_defaults_to_the_longest_output():
    backend = ScriptedBackend()
    trace = [TraceRequest(0.0, 100, 10), TraceRequest(0.0, 100, 40)]
    sim = Simulation(trace, backend.layout, EngineConfig())
    assert sim.max_new_tokens == 40 and {r.max_new for r in sim.requests.values()} == {40}
    # given: each request asks for it, or for its own output if that is longer (it must fit)
    sim = Simulation(trace, backend.layout, EngineConfig(max_new_tokens=20))
    assert sorted(r.max_new for r in sim.requests.values()) == [20, 40]
    assert sim.run(backend).max_new_tokens == 20


def test_against_the_real_controller_guaranteed_is_never_denied():
    # A toy hybrid model (2 full + 2 sliding W=64 layers) on a small pool, 40 requests.
    layout = group_layers(
        [AttentionSpec(16, 2, 64, BF16), SlidingWindowSpec(16, 2, 64, BF16, sliding_window=64)] * 2
    )
    requests = [TraceRequest(i * 0.05, 200 + 37 * (i % 7), 20 + 11 * (i % 5)) for i in range(40)]
    controller = AdmissionController(
        layout, 300, AdmissionConfig(max_model_len=1024, max_num_batched_tokens=256, policy="guaranteed")
    )
    sim = Simulation(requests, layout, EngineConfig(max_num_batched_tokens=256, max_model_len=1024))
    run = sim.run(ControllerBackend(controller))
    controller.check_integrity()
    assert run.decisions_by_kind.get("deny", 0) == 0
    assert run.decisions_by_kind.get("preempt", 0) == 0
    assert all(r.generated == r.output for r in run.requests)
    assert run.stalled == 0
    # every block came back: the pool is as free as when it started
    assert controller.pool.num_free_blocks == controller.pool.capacity


def test_two_engines_share_a_pool_through_preemptions_and_prefix_hits():
    # Mooncake's first 80 requests (prefix ids, long prompts) on a pool that holds only a
    # few of them: optimistic preempts, preempted requests come back with cache hits.
    from kvbudget.daemon.config.hf_config import load_model
    from kvbudget.traces.loaders import load_trace

    layout = load_model("llama-3.1-8b").layout
    trace = load_trace("mooncake", limit=80)
    controller = AdmissionController(layout, 3_000, AdmissionConfig(max_model_len=131_072))
    sim = Simulation(trace.requests, layout, EngineConfig(), engines=2, spread_s=3.0)
    run = sim.run(ControllerBackend(controller))
    controller.check_integrity()
    assert run.decisions_by_kind["preempt"] > 0
    assert {r.engine for r in run.requests} == {0, 1}
    assert run.stalled == 0
    done = [r for r in run.requests if r.finished_s is not None]
    assert all(r.generated == r.output for r in done)
    assert len(done) + run.decisions_by_kind.get("reject", 0) == 80
    assert controller.pool.num_held_blocks == 0  # cached prefix blocks stay, but unreferenced


def test_decisions_arriving_out_of_order_are_applied_by_seq():
    # Live, with several engines, engine B's request can be preempted and re-admitted by
    # engine A's call; B may read its own Step reply before those events. The engine
    # applies a request's decisions by seq: older ones are stale.
    from kvbudget.traces.sim_request import QUEUED, RUNNING

    sim = Simulation([TraceRequest(0.0, 100, 5)], FULL, EngineConfig())
    r, engine = sim.requests["0"], sim.engines[0]
    engine.arrivals.clear()
    r.state, engine.num_queued, engine.in_flight = QUEUED, 1, 1  # as if submitted

    def d(seq: int, kind: DecisionKind, num_tokens: int = 0, reason: Reason = Reason.FITS) -> Decision:
        return Decision(seq, 0.0, kind, reason, "0", num_tokens=num_tokens)

    sim.apply([d(1, DecisionKind.ADMIT, 100)], 0.0)
    assert (r.state, r.granted, engine.num_running) == (RUNNING, 100, 1)
    # seq 2 PREEMPT and seq 3 ADMIT: the re-admission arrives first, then the preemption
    sim.apply([d(3, DecisionKind.ADMIT, 64)], 0.0)
    sim.apply([d(2, DecisionKind.PREEMPT)], 0.0)
    assert (r.state, r.granted, r.preemptions) == (RUNNING, 64, 1)
    assert (engine.num_running, engine.num_queued) == (1, 0)
    # a growth denied as "not running" (seq 5) says a PREEMPT (seq 4) is on its way
    sim.apply([d(5, DecisionKind.DENY, reason=Reason.NOT_RUNNING)], 0.0)
    sim.apply([d(4, DecisionKind.PREEMPT)], 0.0)
    assert (r.state, r.preemptions, engine.num_running, engine.num_queued) == (QUEUED, 2, 0, 1)
    assert sim.decisions == 5  # every decision is counted once, stale or not
