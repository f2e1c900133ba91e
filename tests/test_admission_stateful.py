"""Random request streams through the controller, for every policy (hypothesis stateful).

After every step: `check_integrity` (pool, tables == budget formulas, counters, sharing,
promised <= free, no deadlock); held blocks per group never above the budget worst case at
L (the toy engine stays within F slots of what it computed); under `guaranteed` no
request is ever denied growth or preempted. At the end the engine drains everything:
every request finishes, so none waits forever. Steps may hold the queue until their frees
and grows are in (nothing admitted before); once admissions are closed (drain) nothing is
admitted and nothing waits.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvbudget.daemon.core.admission import POLICIES, AdmissionConfig, AdmissionController
from kvbudget.daemon.core.budget import worst_case_blocks
from kvbudget.daemon.server.metrics import DECISION_PAIRS
from kvbudget.daemon.core.records import DecisionKind, RequestSpec
from kvbudget.daemon.core.requests import Status

from test_admission_support import B, SMALL_LAYOUTS, drain, engine_step

MAX_MODEL_LEN = 96


class AdmissionMachine(RuleBasedStateMachine):
    policy = "optimistic"
    switch_policies = False

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.next_id = 0
        self.goals: dict[str, int] = {}
        self.decisions = 0
        self.drained = False

    @initialize(
        layout=st.sampled_from(sorted(SMALL_LAYOUTS)),
        num_blocks=st.integers(16, 64),
        F=st.sampled_from([8, 16, 64]),
        backfill=st.integers(0, 3),
        max_queue_len=st.sampled_from([0, 4]),
        watermark=st.sampled_from([0.0, 0.05]),
        lookahead=st.sampled_from([0, 3]),
        caching=st.booleans(),
    )
    def setup(self, layout, num_blocks, F, backfill, max_queue_len, watermark, lookahead, caching):
        config = AdmissionConfig(
            max_model_len=MAX_MODEL_LEN,
            max_num_batched_tokens=F,
            policy=self.policy,
            enable_prefix_caching=caching,
            lookahead_tokens=lookahead,
            watermark=watermark,
            max_queue_len=max_queue_len,
            backfill_depth=backfill,
            max_head_wait_s=4.0,
        )
        self.ctrl = AdmissionController(SMALL_LAYOUTS[layout], num_blocks, config)
        self.ctrl.set_tenant_quota("b", 0.5, weight=2.0)

    # ------------------------------------------------------------------ rules
    def _observe(self, decisions) -> None:
        seqs = [d.seq for d in decisions]
        assert seqs == list(range(self.decisions + 1, self.decisions + 1 + len(seqs))), seqs
        self.decisions += len(seqs)
        preempted = [d.request_id for d in decisions if d.kind is DecisionKind.PREEMPT]
        assert len(preempted) == len(set(preempted)), f"preempt -> readmit -> preempt: {preempted}"
        for d in decisions:
            # /metrics creates a series at 0 for each pair it knows; one missing from its table
            # would appear only at its first decision (rate() loses that burst).
            assert (d.kind, d.reason) in DECISION_PAIRS, f"({d.kind.value}, {d.reason.value}) not in DECISION_PAIRS"
            assert not (self.drained and d.kind is DecisionKind.ADMIT), f"admitted while drained: {d}"
            if d.kind in (DecisionKind.DENY, DecisionKind.PREEMPT) and d.policy == "guaranteed":
                raise AssertionError(f"guaranteed request {d.request_id} got {d.kind.value}: {d}")
            if d.kind is DecisionKind.DENY:
                assert d.reason.value == "not_running", d  # the toy engine respects F

    @rule(
        prompt=st.integers(1, 60),
        max_new=st.one_of(st.none(), st.integers(0, 40)),
        out_share=st.floats(0.0, 1.0),
        family=st.integers(0, 2),
        shared_blocks=st.sampled_from([0, 3, 10]),
        priority=st.integers(0, 2),
        tenant=st.sampled_from(["a", "b"]),
        engine=st.sampled_from(["e1", "e2"]),
        deadline=st.one_of(st.none(), st.floats(0.0, 6.0)),
    )
    def submit(self, prompt, max_new, out_share, family, shared_blocks, priority, tenant, engine, deadline):
        self.next_id += 1
        rid = f"r{self.next_id}"
        hashes = tuple(
            family * 1000 + i if i < shared_blocks else 10**6 + self.next_id * 1000 + i
            for i in range(prompt // B)
        )
        spec = RequestSpec(
            rid, prompt, max_new, hashes, priority, tenant, engine,
            None if deadline is None else self.now + deadline, self.now,
        )
        L = min(prompt + (MAX_MODEL_LEN if max_new is None else max_new), MAX_MODEL_LEN)
        self.goals[rid] = prompt + int(out_share * (L - prompt))
        self._observe(self.ctrl.submit(spec, self.now))

    @rule(n=st.integers(2, 4), prompt=st.integers(1, 40), family=st.integers(0, 2), priority=st.integers(0, 2))
    def submit_burst(self, n, prompt, family, priority):
        """Several long-output requests at once: pressure on the pool, preemptions."""
        for i in range(n):
            self.submit(prompt, None, (i + 1) / n, family, 3, priority, "a", "e1", None)

    @precondition(lambda self: self.ctrl.num_running > 0)
    @rule(pick=st.integers(0, 1000))
    def step_one(self, pick):
        running = sorted(self.ctrl.running_requests(), key=lambda r: r.order)
        r = running[pick % len(running)]
        self._observe(engine_step(self.ctrl, r.request_id, self.goals[r.request_id], self.now))

    @precondition(lambda self: self.ctrl.num_running > 0)
    @rule()
    def step_all(self):
        for r in sorted(self.ctrl.running_requests(), key=lambda r: r.order):
            if r.status is Status.RUNNING:
                self._observe(engine_step(self.ctrl, r.request_id, self.goals[r.request_id], self.now))

    @precondition(lambda self: self.ctrl.num_running > 0)
    @rule()
    def step_all_held(self):
        """Every running request's step as one engine Step: the queue held until its
        frees and grows are in (the daemon's and the replayer's way)."""
        self.ctrl.hold_queue()
        held: list = []
        for r in sorted(self.ctrl.running_requests(), key=lambda r: r.order):
            if r.status is Status.RUNNING:
                held += engine_step(self.ctrl, r.request_id, self.goals[r.request_id], self.now)
        assert not [d for d in held if d.kind is DecisionKind.ADMIT], "admitted from a held queue"
        released = self.ctrl.release_queue(self.now)
        self._observe(held + released)
        assert {d.kind for d in released} <= {DecisionKind.ADMIT, DecisionKind.REJECT}, released

    @precondition(lambda self: not self.drained)
    @rule()
    def drain(self):
        self.drained = True
        decisions = self.ctrl.close_admissions(self.now)
        assert {(d.kind, d.reason.value) for d in decisions} <= {(DecisionKind.REJECT, "draining")}, decisions
        self._observe(decisions)

    @rule(pick=st.integers(0, 1000), finish=st.booleans())
    def end_one(self, pick, finish):
        known = sorted(r.request_id for r in self.ctrl.running_requests() + self.ctrl.waiting_requests())
        if known:
            rid = known[pick % len(known)]
            call = self.ctrl.finish if finish else self.ctrl.abort
            self._observe(call(rid, self.now))

    @rule(engine=st.sampled_from(["e1", "e2"]))
    def expire(self, engine):
        self._observe(self.ctrl.expire_engine(engine, self.now))

    @rule(dt=st.floats(0.0, 3.0))
    def tick(self, dt):
        self.now += dt
        self._observe(self.ctrl.schedule(self.now))

    @precondition(lambda self: self.switch_policies)
    @rule(policy=st.sampled_from(POLICIES))
    def switch(self, policy):
        self._observe(self.ctrl.set_policy(policy, self.now))

    # ------------------------------------------------------------- invariants
    @invariant()
    def integrity(self):
        self.ctrl.check_integrity()

    @invariant()
    def nothing_waits_once_drained(self):
        if self.drained:
            assert self.ctrl.num_waiting == 0

    @invariant()
    def held_within_worst_case(self):
        F = self.ctrl.config.max_num_batched_tokens
        for r in self.ctrl.running_requests():
            for g, group in enumerate(self.ctrl.layout.groups):
                assert r.held[g] <= worst_case_blocks(group.spec, r.max_len, F), (r.request_id, g)

    def teardown(self):
        """Drain: every request finishes (no deadlock, no livelock, nobody waits forever).

        A running request needs at most MAX_MODEL_LEN steps, so a long stretch without any
        request leaving means something loops."""
        if not hasattr(self, "ctrl"):
            return
        drain(self, MAX_MODEL_LEN)
        assert self.ctrl.pool.num_held_blocks == 0


def _machine(policy: str, switch: bool = False):
    machine = type(f"Machine_{policy}", (AdmissionMachine,), {"policy": policy, "switch_policies": switch})
    test = machine.TestCase
    test.settings = settings(max_examples=40, stateful_step_count=50, deadline=None)
    return test


TestOptimistic = _machine("optimistic")
TestGuaranteed = _machine("guaranteed")
TestPredictive = _machine("predictive")
TestNaive = _machine("naive")
TestSwitching = _machine("optimistic", switch=True)
