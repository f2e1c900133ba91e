"""Future-peak admission (future_peak.py): the predicted occupancy curve of a running batch,
hand-computed (growth, windows, finishes); its peak and a candidate's, against the curve
point by point; and the controller admitting exactly while the predicted peak fits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController, AdmissionError
from kvbudget.daemon.core.future_peak import Item, PeakIndex, delta_at
from kvbudget.daemon.core.predictor import OutputLengthPredictor
from kvbudget.daemon.core.records import DecisionKind, Reason, RequestSpec

from test_admission_support import SMALL_LAYOUTS

# B = 4, G = 1: X holds 3 blocks (11 tokens, 1 slot free) for 2 more steps; Y 2 blocks
# (8 tokens, none free) for 5; Z 1 block (1 token, 3 free) for 3, and its window will
# take 2 blocks more (a = 2).
X, Y, Z = Item(d=2, a=0, f=3, s=1), Item(d=5, a=0, f=2, s=0), Item(d=3, a=2, f=1, s=3)


def test_the_curve_grows_with_each_token_and_drops_at_each_finish():
    """delta(t) = floor((sum_alive 4a + (t - s + 3) - sum_finished 4f) / 4):
    t=0: 4*2 + (2 + 3 + 0) = 13 -> 3
    t=2: 4*2 + (4 + 5 + 2) = 19 -> 4  (X's last step: X at 13 tokens, 4 blocks; Y at 10, 3)
    t=3: X gone, -12: 4*2 + (6 + 3) - 12 = 5 -> 1
    t=5: X and Z gone, -16: (5 + 3) - 16 = -8 -> -2."""
    items = [X, Y, Z]
    assert [delta_at(items, t, 4, 1) for t in (0, 2, 3, 5)] == [3, 4, 1, -2]
    assert PeakIndex(items, 4, 1).peak() == 4


def test_a_candidate_counts_until_its_own_last_step_and_frees_nothing_of_today():
    """Candidate (d=3, a=1, s=2) adds 4*1 + (t - 2 + 3) while alive:
    t=2: 19 + 4 + 3 = 26 -> 6; t=3: 5 + 4 + 4 = 13 -> 3; t=5: -8 -> -2. Peak 6.
    Candidate (d=9, a=5, s=0) outlives all: t=2: 19 + 20 + 5 = 44 -> 11;
    t=9: 20 + 12 - 24 = 8 -> 2. Peak 11."""
    index = PeakIndex([X, Y, Z], 4, 1)
    assert index.peak_with(3, 1, 2) == 6
    assert index.peak_with(9, 5, 0) == 11
    assert PeakIndex([], 4, 1).peak_with(3, 2, 0) == (8 + 3 + 3) // 4  # alone: 2 + 3/4 -> 3


def test_growing_groups_multiply_the_growth_not_the_window_blocks():
    """G = 2 (two full-attention groups): Y alone at t=5: 4*0 + 2 * (5 + 3) = 16 -> 4."""
    assert PeakIndex([Y], 4, 2).peak() == 4


items_strategy = st.lists(
    st.builds(Item, d=st.integers(0, 40), a=st.integers(0, 9), f=st.integers(0, 30), s=st.integers(0, 7)),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(items=items_strategy, block=st.sampled_from((1, 4, 8)), groups=st.integers(0, 3))
def test_the_peak_is_the_curve_s_highest_point_and_at_least_today(items, block, groups):
    items = [it._replace(s=it.s % block) for it in items]
    peak = PeakIndex(items, block, groups).peak()
    horizon = max((it.d for it in items), default=0) + 2
    curve = [delta_at(items, t, block, groups) for t in range(horizon)]
    assert peak == max(curve + [0])
    assert peak >= delta_at(items, 0, block, groups) >= 0  # the pool never holds less than now


@settings(max_examples=300, deadline=None)
@given(items=items_strategy, block=st.sampled_from((1, 4, 8)), groups=st.integers(0, 3),
       d=st.integers(0, 45), a=st.integers(0, 9), s=st.integers(0, 7))  # fmt: skip
def test_adding_a_request_never_lowers_the_peak_and_equals_a_rebuilt_index(items, block, groups, d, a, s):
    items = [it._replace(s=it.s % block) for it in items]
    s %= block
    index = PeakIndex(items, block, groups)
    with_it = index.peak_with(d, a, s)
    assert with_it >= index.peak()
    assert with_it == PeakIndex([*items, Item(d, a, 0, s)], block, groups).peak()


# ------------------------------------------------------------------ what is left to decode


def test_what_is_left_comes_from_the_lengths_seen_past_what_was_generated_per_tenant():
    """Tenant "a" finished 10, 20, 30, 40 tokens; "b" 100 x 4 (min_samples 4). Median,
    nearest rank, of the lengths longer than what the request has generated, minus that."""
    p = OutputLengthPredictor(min_samples=4)
    for n in (10, 20, 30, 40):
        p.observe("a", n)
        p.observe("b", 100)
    assert p.remaining("a", 0, 1000, 0.5) == 20  # rank ceil(0.5 * 4) = 2 of 10, 20, 30, 40
    assert p.remaining("a", 15, 1000, 0.5) == 30 - 15  # of 20, 30, 40: rank 2
    assert p.remaining("a", 15, 8, 0.5) == 8  # never past its own maximum
    assert p.remaining("a", 40, 500, 0.5) == 500  # outlived every one seen: its maximum
    assert p.remaining("b", 15, 1000, 0.5) == 85
    # "c" has no window: everyone's 8 lengths; past 35: 40, 100 x 4 -> rank 3 = 100
    assert p.remaining("c", 35, 1000, 0.5) == 65
    assert OutputLengthPredictor(min_samples=4).remaining("a", 0, 77, 0.5) == 77  # cold: its maximum


def test_preemptions_raise_the_quantile_of_what_is_left_the_same_share():
    """One preemption: p90 -> p95, half of the way to 1; the median goes to p75 likewise."""
    p = OutputLengthPredictor(min_samples=4)
    for n in (10, 20, 30, 40):
        p.observe("a", n)
    p.on_preemption()
    assert p.remaining("a", 0, 1000, 0.5) == 30  # rank ceil(0.75 * 4) = 3


# ------------------------------------------------------------------ the controller


def controller(layout: str, num_blocks: int, policy: str = "predictive", **kw) -> AdmissionController:
    """One output length seen (16 tokens, everyone's), so every request is predicted
    exactly: 16 - generated, once past its prompt."""
    predictor = OutputLengthPredictor(min_samples=1)
    predictor.observe("", 16)
    config = AdmissionConfig(max_model_len=64, max_num_batched_tokens=64, policy=policy, watermark=0.0, **kw)
    return AdmissionController(SMALL_LAYOUTS[layout], num_blocks, config, predictor=predictor)


@pytest.mark.parametrize("num_blocks,admitted", [(9, True), (8, False)])
def test_admitted_exactly_while_the_predicted_peak_fits(num_blocks, admitted):
    """Full layout, B = 8. "a" runs (prompt 16: 2 blocks, 16 tokens to go); "c" is the same.
    Both finish at t = 16: 8 * 2 (c's prompt) + (16 + 7) * 2 = 62 -> 7 blocks past today.
    Spare = num_blocks - 2: 7 admits, 6 holds (every request at max_model_len, 2 * 8 = 16
    blocks, would not fit: the peak is what decides)."""
    ctrl = controller("full", num_blocks)
    [a] = ctrl.submit(RequestSpec("a", 16, 24), 0.0)
    assert a.kind is DecisionKind.ADMIT
    [c] = ctrl.submit(RequestSpec("c", 16, 24), 0.0)
    if admitted:
        assert c.kind is DecisionKind.ADMIT and c.blocks_reserved == (2,)  # reserves nothing more
    else:
        assert (c.kind, c.reason) == (DecisionKind.QUEUE, Reason.BUDGET_FULL)
    ctrl.check_integrity()


@pytest.mark.parametrize("num_blocks,admitted", [(8, True), (7, False)])
def test_a_request_about_to_finish_frees_its_blocks_for_the_peak(num_blocks, admitted):
    """"a" has generated 14 of the 16 predicted: 30 tokens in 4 blocks (2 slots free), 2
    steps to go. "c" (prompt 16, 16 to go): at t = 2: 8 * 2 + (2 - 2 + 7) + (2 + 7) = 32
    -> 4; at t = 16 "a" is gone (-4 blocks): 8 * (2 - 4) + 23 = 7 -> 0. Peak 4: spare
    num_blocks - 4 = 4 admits, 3 holds."""
    ctrl = controller("full", num_blocks)
    ctrl.submit(RequestSpec("a", 16, 24), 0.0)
    ctrl.progress("a", 16, 0.0)
    ctrl.grow("a", 30, 0.0)
    ctrl.progress("a", 29, 0.0)
    [c] = ctrl.submit(RequestSpec("c", 16, 24), 0.0)
    assert c.kind is (DecisionKind.ADMIT if admitted else DecisionKind.QUEUE)


@pytest.mark.parametrize("num_blocks,admitted", [(9, True), (8, False)])
def test_what_a_finish_frees_counts_for_a_longer_request_of_another_tenant(num_blocks, admitted):
    """Tenant "short" has finished 8 tokens, "long" 48. "a" (short, prompt 40) has generated
    6: 46 tokens in 6 blocks (2 slots free), 2 steps left. "c" (long, prompt 8: 1 block)
    has 48 left. At t = 2: 8 * 1 + (2 - 2 + 7) + (2 + 7) = 24 -> 3; at t = 48 "a" is gone
    and has freed its 6 blocks: 8 * (1 - 6) + (48 + 7) = 15 -> 1 (without them: 63 -> 7).
    Peak 3: spare num_blocks - 6 = 3 admits, 2 holds."""
    predictor = OutputLengthPredictor(min_samples=1)
    predictor.observe("short", 8)
    predictor.observe("long", 48)
    config = AdmissionConfig(max_model_len=64, max_num_batched_tokens=64, policy="predictive")
    ctrl = AdmissionController(SMALL_LAYOUTS["full"], num_blocks, config, predictor=predictor)
    ctrl.submit(RequestSpec("a", 40, 8, tenant="short"), 0.0)
    ctrl.progress("a", 40, 0.0)
    ctrl.grow("a", 46, 0.0)
    ctrl.progress("a", 45, 0.0)
    [c] = ctrl.submit(RequestSpec("c", 8, 48, tenant="long"), 0.0)
    assert c.kind is (DecisionKind.ADMIT if admitted else DecisionKind.QUEUE)


@pytest.mark.parametrize("num_blocks,admitted", [(21, True), (20, False)])
def test_window_groups_stop_growing_at_their_window(num_blocks, admitted):
    """Hybrid: two sliding groups (W = 16) and a full one, B = 8. Decoding at 32 tokens
    (16 + 16 predicted) a window group holds cdiv(32 + 8, 8) - (32 - 16) // 8 = 3 blocks
    (the engine one block ahead), not 4. "a" holds 2 + 2 + 2: its windows add 1 + 1 (a=2);
    "c" adds 2 + 3 + 3 = 8. At t = 16: 8 * (2 + 8) + 23 + 23 = 126 -> 15 past today:
    spare num_blocks - 6 = 15 admits, 14 holds."""
    ctrl = controller("hybrid", num_blocks)
    ctrl.submit(RequestSpec("a", 16, 24), 0.0)
    [c] = ctrl.submit(RequestSpec("c", 16, 24), 0.0)
    assert c.kind is (DecisionKind.ADMIT if admitted else DecisionKind.QUEUE)


def test_optimistic_peak_gates_optimistic_the_same_way():
    """The boundary case above at spare 6: plain optimistic admits, optimistic_peak holds."""
    plain, gated = controller("full", 8, "optimistic"), controller("full", 8, "optimistic", optimistic_peak=True)
    for ctrl in (plain, gated):
        ctrl.submit(RequestSpec("a", 16, 24), 0.0)
    assert plain.submit(RequestSpec("c", 16, 24), 0.0)[0].kind is DecisionKind.ADMIT
    assert gated.submit(RequestSpec("c", 16, 24), 0.0)[0].reason is Reason.BUDGET_FULL


def test_an_idle_pool_admits_whatever_the_prediction():
    """Nothing running: the peak never holds a request back (it could wait for good)."""
    ctrl = controller("full", 8)
    assert ctrl.submit(RequestSpec("big", 56, 8), 0.0)[0].kind is DecisionKind.ADMIT


@pytest.mark.parametrize("field,value", [("predictive_admission", "guess"), ("peak_quantile", 0.0)])
def test_bad_settings_name_the_field(field, value):
    with pytest.raises(AdmissionError, match=f"^{field}: must"):
        AdmissionConfig(max_model_len=64, **{field: value}).validate()
