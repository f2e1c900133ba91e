"""QA: hybrid layouts and the prefix cache under long random request streams (hypothesis
stateful), driving AdmissionController in-process.

Layouts mirror the presets' group mixes at toy sizes (block 8): gpt-oss (sliding + full),
gemma-3 (five sliding groups + full), llama-4 (three chunked groups + full), jamba (seven
Mamba groups + full), deepseek (MLA), and a mix of all attention kinds. Windows and chunks
that are not a multiple of the block size are included on purpose.

Checked after EVERY operation:
- the controller's and pool's integrity (free + held + evictable == capacity, tables ==
  budget formulas, refs == tables, promised <= free);
- per group, what a running request holds is within vLLM's worst case at its length L
  (budget.worst_case_blocks; sliding also: cdiv(W - 1 + in-flight tokens, B) + 1, 1 token
  in flight while decoding; chunked with C not a multiple of B: see
  test_layer_exact_counts; Mamba and cross attention: exactly their pages, always);
- guaranteed reserves exactly the worst case; a request back from a preemption reserves at
  least the worst case of the length it had reached;
- every reservation is within [held, worst case at L] (predictive too, cold or warm);
- guaranteed requests are never denied or preempted;
- a RECLAIM gives back exactly the blocks that left the window, each reference once, and
  a block another request still holds is not counted free;
- a finished request's shared prefix blocks stay held while another request holds them;
  the last holder's release leaves a hashed block cached (evictable), not lost.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController
from kvbudget.daemon.core.budget import blocks_out_of_window, cdiv, worst_case_blocks
from kvbudget.daemon.core.pool import NULL_BLOCK
from kvbudget.daemon.core.predictor import OutputLengthPredictor
from kvbudget.daemon.core.records import DecisionKind, RequestSpec
from kvbudget.daemon.core.requests import Status
from kvbudget.daemon.core.spec import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    LayerKind,
    MambaSpec,
    MLASpec,
    SlidingWindowSpec,
    group_layers,
)

from test_admission_support import B, BF16, drain

MAX_MODEL_LEN = 120
MAX_REQUESTS = 30  # per run: keeps the final drain short


def _full():
    return AttentionSpec(B, 1, 8, BF16)


def _sliding(w):
    return SlidingWindowSpec(B, 1, 8, BF16, sliding_window=w)


def _chunked(c):
    return ChunkedLocalAttentionSpec(B, 1, 8, BF16, attention_chunk_size=c)


HYBRID_LAYOUTS = {
    "gpt-oss": group_layers([_sliding(16), _full()]),
    "gpt-oss-odd-window": group_layers([_sliding(12), _full()]),
    "gemma-3": group_layers([_sliding(20)] * 5 + [_full()]),
    "llama-4": group_layers([_chunked(16)] * 3 + [_full()]),
    "llama-4-odd-chunk": group_layers([_chunked(12)] * 3 + [_full()]),
    "jamba": group_layers([MambaSpec(B, state_bytes=64, pages_per_request=1)] * 7 + [_full()]),
    "jamba-2-pages": group_layers([MambaSpec(B, state_bytes=64, pages_per_request=2)] * 3 + [_full()]),
    "deepseek": group_layers([MLASpec(B, 16, 8, BF16)]),
    "mistral-odd-window": group_layers([_sliding(13)]),
    "cross": group_layers([CrossAttentionSpec(B, 1, 8, BF16, max_encoder_tokens=20), _full()]),
    "mix": group_layers([_sliding(12), _chunked(16), _full(), MLASpec(B, 16, 8, BF16)]),
}


class HybridMachine(RuleBasedStateMachine):
    policy = "optimistic"
    warm_predictor = False

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.next_id = 0
        self.goals: dict[str, int] = {}

    @initialize(
        layout=st.sampled_from(sorted(HYBRID_LAYOUTS)),
        num_blocks=st.integers(20, 90),
        F=st.sampled_from([4, 8, 10, 13, 32]),
        lookahead=st.sampled_from([0, 5]),
        caching=st.booleans() | st.just(True),
        admit_on=st.sampled_from(["whole_prompt", "first_chunk"]),
    )
    def setup(self, layout, num_blocks, F, lookahead, caching, admit_on):
        self.layout_name = layout
        config = AdmissionConfig(
            max_model_len=MAX_MODEL_LEN,
            max_num_batched_tokens=F,
            policy=self.policy,
            admit_on=admit_on,
            enable_prefix_caching=caching,
            lookahead_tokens=lookahead,
            watermark=0.0,
            backfill_depth=2,
            max_head_wait_s=5.0,
        )
        predictor = OutputLengthPredictor(min_samples=4)
        if self.warm_predictor:  # predicts 1 output token: growth past it preempts
            for _ in range(8):
                predictor.observe("a", 1)
                predictor.observe("b", 1)
        self.ctrl = AdmissionController(HYBRID_LAYOUTS[layout], num_blocks, config, predictor=predictor)
        self.F = F

    # ------------------------------------------------------------------ helpers
    def _observe(self, decisions) -> None:
        capacity = self.ctrl.pool.capacity
        for d in decisions:
            if d.policy == "guaranteed":
                assert d.kind not in (DecisionKind.DENY, DecisionKind.PREEMPT), d
            if d.kind is DecisionKind.DENY:
                assert d.reason.value == "not_running", d  # the engine stays within F
            if d.kind is DecisionKind.ADMIT:
                assert sum(d.blocks_reserved) <= capacity, d

    def _window_step_checked(self, r, num_computed: int) -> None:
        """progress() with the queue held: a RECLAIM gives back exactly the leading window
        blocks, one reference each; blocks others still hold stay held."""
        ctrl, pool = self.ctrl, self.ctrl.pool
        leaving: list[int] = []
        for g, group in enumerate(ctrl.layout.groups):
            if group.kind in (LayerKind.SLIDING, LayerKind.CHUNKED):
                table = r.tables[g]
                out = min(blocks_out_of_window(group.spec, num_computed), len(table))
                leaving += [b for b in table[:out] if b != NULL_BLOCK]
        refs_before = {b: pool.ref_count(b) for b in leaving}
        returned = sum(1 for b in leaving if refs_before[b] == 1)
        free_before = pool.num_free_blocks
        ctrl.hold_queue()
        decisions = ctrl.progress(r.request_id, num_computed, self.now)
        reclaimed = [d for d in decisions if d.kind is DecisionKind.RECLAIM]
        assert sum(d.freed_blocks for d in reclaimed) == len(leaving), (reclaimed, leaving)
        assert pool.num_free_blocks - free_before == returned, (free_before, pool.num_free_blocks, returned)
        for b in leaving:
            assert pool.ref_count(b) == refs_before[b] - 1, b
            assert all(b not in t for t in r.tables), f"block {b} still in a table after RECLAIM"
        self._observe(decisions + ctrl.release_queue(self.now))

    def _step(self, rid: str, chunk: int | None = None) -> None:
        r = self.ctrl.request(rid)
        if r.status is not Status.RUNNING:
            return
        self._window_step_checked(r, r.num_tokens)
        if r.status is not Status.RUNNING:
            return
        goal = self.goals[rid]
        if r.num_tokens >= goal:
            self._end(rid, True)
            return
        prefill_to = max(r.spec.prompt_tokens, r.resume_len)
        if r.num_tokens < prefill_to:
            target = min(prefill_to, r.num_tokens + min(chunk or self.F, self.F))
        else:
            target = r.num_tokens + 1
        self._observe(self.ctrl.grow(rid, min(target, r.max_len, max(goal, r.num_tokens)), self.now))

    def _end(self, rid: str, finish: bool) -> None:
        """finish / abort with the queue held: each of its blocks loses one reference; one
        that reaches 0 is free, or evictable if hashed (still found under its hash)."""
        ctrl, pool = self.ctrl, self.ctrl.pool
        r = ctrl.request(rid)
        mine = [b for t in r.tables for b in t if b != NULL_BLOCK]
        refs = {b: pool.ref_count(b) for b in mine}
        hashed = {b: pool._hash_of[b] for b in mine}
        evictable_before = pool.num_evictable_blocks
        ctrl.hold_queue()
        decisions = (ctrl.finish if finish else ctrl.abort)(rid, self.now)
        became_evictable = 0
        for b in mine:
            assert pool.ref_count(b) == refs[b] - 1, f"block {b}: ref {refs[b]} -> {pool.ref_count(b)}"
            if refs[b] == 1 and hashed[b] is not None:
                assert pool.lookup(hashed[b]) == b, f"block {b} lost its cache entry"
                became_evictable += 1
            elif refs[b] > 1 and hashed[b] is not None:
                assert pool.lookup(hashed[b]) == b, f"shared block {b} dropped from the cache"
        assert pool.num_evictable_blocks == evictable_before + became_evictable
        self._observe(decisions + ctrl.release_queue(self.now))

    # ------------------------------------------------------------------ rules
    @precondition(lambda self: self.next_id < MAX_REQUESTS)
    @rule(
        prompt=st.integers(1, 70),
        max_new=st.one_of(st.none(), st.integers(0, 50)),
        out_share=st.floats(0.0, 1.0),
        family=st.integers(0, 2),
        shared_blocks=st.sampled_from([0, 2, 5, 9]),
        priority=st.integers(0, 1),
        tenant=st.sampled_from(["a", "b"]),
    )
    def submit(self, prompt, max_new, out_share, family, shared_blocks, priority, tenant):
        self.next_id += 1
        rid = f"r{self.next_id}"
        hashes = tuple(
            family * 1000 + i if i < shared_blocks else 10**6 + self.next_id * 1000 + i
            for i in range(prompt // B)
        )
        L = min(prompt + (MAX_MODEL_LEN if max_new is None else max_new), MAX_MODEL_LEN)
        self.goals[rid] = prompt + int(out_share * (L - prompt))
        spec = RequestSpec(rid, prompt, max_new, hashes, priority, tenant, "e1", None, self.now)
        self._observe(self.ctrl.submit(spec, self.now))

    @precondition(lambda self: self.next_id < MAX_REQUESTS)
    @rule(n=st.integers(2, 4), prompt=st.integers(9, 50), family=st.integers(0, 2))
    def burst(self, n, prompt, family):
        """Same-prefix long-output requests at once: sharing, then growth pressure."""
        for i in range(n):
            self.submit(prompt, None, (i + 1) / n, family, 9, 1, "ab"[i % 2])

    @precondition(lambda self: self.ctrl.num_running > 0)
    @rule(pick=st.integers(0, 1000), chunk=st.integers(1, 32))
    def step_one(self, pick, chunk):
        """One request's step; a prefill chunk of `chunk` tokens (capped at F): partial
        chunks when the step's token budget is shared."""
        running = sorted(self.ctrl.running_requests(), key=lambda r: r.order)
        self._step(running[pick % len(running)].request_id, chunk)

    @precondition(lambda self: self.ctrl.num_running > 0)
    @rule()
    def step_all(self):
        for r in sorted(self.ctrl.running_requests(), key=lambda r: r.order):
            self._step(r.request_id)

    @precondition(lambda self: self.ctrl.num_running > 0)
    @rule(pick=st.integers(0, 1000), ahead=st.integers(1, 32))
    def grow_ahead(self, pick, ahead):
        """A request asks for up to F slots past what it computed at once (a partial
        chunk, or the most the contract allows): preemption-inducing growth."""
        running = sorted(self.ctrl.running_requests(), key=lambda r: r.order)
        r = running[pick % len(running)]
        self._window_step_checked(r, r.num_tokens)
        if r.status is not Status.RUNNING:
            return
        target = min(r.num_computed + min(ahead, self.F), r.max_len)
        if target > r.num_tokens:
            self._observe(self.ctrl.grow(r.request_id, target, self.now))

    @rule(pick=st.integers(0, 1000), finish=st.booleans())
    def end_one(self, pick, finish):
        running = sorted(self.ctrl.running_requests(), key=lambda r: r.order)
        if running:
            self._end(running[pick % len(running)].request_id, finish)

    @precondition(lambda self: self.ctrl.num_waiting > 0)
    @rule(pick=st.integers(0, 1000))
    def abort_waiting(self, pick):
        waiting = self.ctrl.waiting_requests()
        self._observe(self.ctrl.abort(waiting[pick % len(waiting)].request_id, self.now))

    @rule(dt=st.floats(0.0, 3.0))
    def tick(self, dt):
        self.now += dt
        self._observe(self.ctrl.schedule(self.now))

    # ------------------------------------------------------------- invariants
    @invariant()
    def integrity(self):
        self.ctrl.check_integrity()

    @invariant()
    def held_and_reserved_within_the_formulas(self):
        F = self.F
        first_chunk = self.ctrl.config.admit_on == "first_chunk"
        reserving = self.ctrl.config.predictive_admission == "reserve"
        for r in self.ctrl.running_requests():
            L = r.max_len
            for g, group in enumerate(self.ctrl.layout.groups):
                spec, held = group.spec, r.held[g]
                worst = worst_case_blocks(spec, L, F)
                assert held <= worst, (self.layout_name, r.request_id, g, held, worst)
                assert r.held[g] <= max(r.held[g], r.base[g]) <= max(worst, held), (r.request_id, g)
                assert r.base[g] <= worst, f"{r.request_id} g{g}: base {r.base[g]} > worst {worst}"
                if r.policy == "guaranteed":
                    assert r.base[g] == worst, (r.request_id, g, r.base[g], worst)
                elif r.resume_len and ((r.policy == "predictive" and reserving) or (r.policy == "optimistic" and first_chunk)):
                    # back from a preemption: its recompute is covered (no self-preemption);
                    # optimistic admitting on the whole prompt, and predictive admitting on the
                    # predicted peak, reserve nothing (as vLLM)
                    resumed = worst_case_blocks(spec, r.resume_len, F)
                    assert r.base[g] >= resumed, (r.request_id, g, r.base[g], resumed)
                in_flight = r.num_tokens - r.num_computed  # <= F; 1 while decoding
                if spec.kind is LayerKind.SLIDING:
                    # W - 1 tokens in view + those in flight, +1 for a window starting mid-block
                    assert held <= cdiv(spec.sliding_window - 1 + in_flight, B) + 1, (r.request_id, g, held)
                elif spec.kind is LayerKind.CHUNKED:
                    assert held <= cdiv(spec.attention_chunk_size + F, B) + 1
                elif spec.kind is LayerKind.MAMBA:
                    assert held == spec.pages_per_request, (r.request_id, g, held)
                elif spec.kind is LayerKind.CROSS:
                    assert held == cdiv(spec.max_encoder_tokens, B), (r.request_id, g, held)

    def teardown(self):
        """Everything finishes; nothing is left held, cached blocks are all evictable."""
        if not hasattr(self, "ctrl"):
            return
        drain(self, MAX_MODEL_LEN)
        pool = self.ctrl.pool
        assert pool.num_held_blocks == 0
        assert pool.num_free_blocks == pool.capacity
        assert pool.num_evictable_blocks == pool.num_cached_blocks


def _machine(policy: str, warm: bool = False):
    machine = type(f"Hybrid_{policy}_{'warm' if warm else 'cold'}", (HybridMachine,), {"policy": policy, "warm_predictor": warm})
    test = machine.TestCase
    test.settings = settings(max_examples=30, stateful_step_count=40, deadline=None)
    return test


TestHybridOptimistic = _machine("optimistic")
TestHybridGuaranteed = _machine("guaranteed")
TestHybridPredictiveCold = _machine("predictive")
TestHybridPredictiveWarm = _machine("predictive", warm=True)
