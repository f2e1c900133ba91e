"""fit.surely_unrefused: when it says a waiting request's plan cannot be refused whatever
the prefix cache holds, the plan's own refusal agrees (the controller asks backfill first
on its word, sparing a kept-back request its prefix lookup)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvbudget.daemon.core.admission import POLICIES, AdmissionConfig, AdmissionController
from kvbudget.daemon.core.fit import FitCheck
from kvbudget.daemon.core.records import RequestSpec
from kvbudget.daemon.core.requests import Status

from test_admission_support import B, SMALL_LAYOUTS

LAYOUTS = ("full", "hybrid", "chunked", "mla")
# A prompt: how many blocks of one shared prefix family it starts with, and its length.
# Submitted without a try (admit=False) or with one; by a tenant with a quota or not.
requests = st.lists(
    st.tuples(st.integers(0, 6), st.integers(1, 60), st.integers(0, 24), st.booleans(), st.sampled_from("aq")),
    min_size=1, max_size=14,
)


def _agree(ctrl: AdmissionController) -> int:
    """Asserts the bound on every waiting request; returns how often it said yes."""
    fit = FitCheck(ctrl.layout, ctrl.ledger, ctrl.predictor, ctrl.config)
    policy, running, said_yes = ctrl.policy, ctrl.num_running > 0, 0
    for r in ctrl.waiting_requests():
        if fit.surely_unrefused(r, policy, running):
            said_yes += 1
            assert fit.refusal(r, fit.plan(r, policy), policy, running) is None, r.request_id
    return said_yes


@settings(max_examples=300, deadline=None)
@given(
    layout=st.sampled_from(LAYOUTS), policy=st.sampled_from(POLICIES), blocks=st.integers(8, 40),
    watermark=st.sampled_from((0.0, 0.1)), lookahead=st.sampled_from((0, 8)),
    admit_on=st.sampled_from(("whole_prompt", "first_chunk")), reqs=requests,
)
def test_a_request_the_bound_passes_is_never_refused_by_its_plan(
    layout, policy, blocks, watermark, lookahead, admit_on, reqs
) -> None:
    ctrl = AdmissionController(
        SMALL_LAYOUTS[layout], blocks,
        AdmissionConfig(max_model_len=96, max_num_batched_tokens=32, policy=policy, watermark=watermark,
                        lookahead_tokens=lookahead, admit_on=admit_on),
    )  # fmt: skip
    ctrl.set_tenant_quota("q", 0.4)
    for n, (shared, prompt, new, admit, tenant) in enumerate(reqs):
        hashes = tuple(range(min(shared, prompt // B))) + tuple(1000 * (n + 1) + j for j in range(prompt // B))
        spec = RequestSpec(f"r{n}", prompt, new, prefix_hashes=hashes[: prompt // B], tenant=tenant)
        ctrl.submit(spec, float(n), admit=admit)
        _agree(ctrl)
        for r in ctrl.running_requests():  # compute what is held: full prompt blocks are published
            if r.status is Status.RUNNING:
                ctrl.progress(r.request_id, r.num_tokens, float(n))
        if n % 3 == 2 and ctrl.num_running:
            ctrl.finish(ctrl.running_requests()[0].request_id, float(n))
        _agree(ctrl)
        if not ctrl.num_running:  # (a request submitted untried into an idle pool: its pass)
            ctrl.schedule(float(n))
        ctrl.check_integrity()


def test_the_bound_says_yes_for_a_small_request_in_a_roomy_pool_and_no_when_hits_matter() -> None:
    # Optimistic, whole prompt, one full-attention group, B = 8, 20 blocks, watermark 0.
    # A (96 tokens, 12 blocks) runs; 8 spare. W (40 tokens) needs at most 5: yes. V (72
    # tokens: 9 blocks > 8 spare) fits only thanks to the 6 blocks of A's prompt it
    # shares: the bound cannot tell, it says no (the plan then decides: it fits).
    ctrl = AdmissionController(
        SMALL_LAYOUTS["full"], 20,
        AdmissionConfig(max_model_len=128, max_num_batched_tokens=128, policy="optimistic", watermark=0.0),
    )
    ctrl.submit(RequestSpec("A", 96, 8, prefix_hashes=tuple(range(12))), 0.0)
    ctrl.progress("A", 96, 0.0)
    ctrl.submit(RequestSpec("W", 40, 0), 0.0, admit=False)
    ctrl.submit(RequestSpec("V", 72, 0, prefix_hashes=tuple(range(6)) + (50, 51, 52)), 0.0, admit=False)
    fit = FitCheck(ctrl.layout, ctrl.ledger, ctrl.predictor, ctrl.config)
    w, v = ctrl.request("W"), ctrl.request("V")
    assert ctrl.ledger.spare == 8
    assert fit.surely_unrefused(w, ctrl.policy, True)
    assert not fit.surely_unrefused(v, ctrl.policy, True)
    plan = fit.plan(v, ctrl.policy)
    assert (plan.hit.num_blocks, plan.need) == (6, 9 - 6)
    assert fit.refusal(v, plan, ctrl.policy, True) is None
