"""The predictor keeps a window's sorted copy up to date incrementally once a quantile has
been asked of it; every prediction must equal the plain definition: the nearest-rank
quantile of the last `window` outputs (the tenant's once it has `min_samples`, else
everyone's), capped at the request's own maximum. Only the `max_tenant_windows` tenants
that finished a request most recently keep a window: a tenant whose window went starts
again from nothing."""

from __future__ import annotations

import math
from collections import OrderedDict, deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbudget.daemon.core.predictor import OutputLengthPredictor


def nearest_rank(values: deque[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


operations = st.lists(
    st.one_of(
        st.tuples(st.just("observe"), st.sampled_from("abc"), st.integers(1, 40)),
        st.tuples(st.just("predict"), st.sampled_from("abc"), st.integers(1, 60)),
        st.tuples(st.just("preempt"), st.just(""), st.just(0)),
    ),
    min_size=30,
    max_size=120,
)


@settings(max_examples=150, deadline=None)
@given(window=st.integers(1, 8), min_samples=st.integers(1, 5), max_windows=st.integers(1, 4), ops=operations)
def test_predictions_equal_the_quantile_of_the_last_window_outputs(
    window: int, min_samples: int, max_windows: int, ops
) -> None:
    predictor = OutputLengthPredictor(
        quantile=0.9, window=window, min_samples=min_samples, decay=0.01, max_tenant_windows=max_windows
    )
    everyone: deque[int] = deque(maxlen=window)
    by_tenant: OrderedDict[str, deque[int]] = OrderedDict()  # least recently finished first
    for kind, tenant, value in ops:
        if kind == "observe":
            predictor.observe(tenant, value)
            everyone.append(value)
            if tenant in by_tenant:
                by_tenant.move_to_end(tenant)
            elif len(by_tenant) == max_windows:
                by_tenant.popitem(last=False)
            by_tenant.setdefault(tenant, deque(maxlen=window)).append(value)
            assert predictor.num_samples(tenant) == len(by_tenant[tenant])
        elif kind == "preempt":
            predictor.on_preemption()
        else:
            samples = by_tenant.get(tenant)
            if samples is None or len(samples) < min_samples:
                samples = everyone
            expected = value if len(samples) < min_samples else min(value, nearest_rank(samples, predictor.quantile))
            assert predictor.predict(tenant, value) == expected


def test_tenant_windows_are_bounded_and_the_recent_ones_stay() -> None:
    # Tenant names need not repeat over a daemon's weeks (a user, an API key): a window per
    # name ever seen grew without bound. A busy tenant keeps its window through a flood of
    # one-off names, since every finish of its own makes it the most recent.
    predictor = OutputLengthPredictor(min_samples=1, max_tenant_windows=100)
    for i in range(10_000):
        predictor.observe(f"user-{i}", 500)
        predictor.observe("busy", 40)
    assert predictor.num_samples("busy") == 256  # a full window
    assert predictor.num_samples("user-9999") == 1
    assert predictor.num_samples("user-9901") == 1  # the 99 newest one-off names, and busy
    assert predictor.num_samples("user-9900") == 0  # ...not the one before: predicted from everyone's
    assert sum(predictor.num_samples(f"user-{i}") for i in range(10_000)) == 99
    assert predictor.predict("busy", 1000) == 40
    assert predictor.predict("user-5", 1000) == 500  # everyone's p90 (half 40s, half 500s)


def test_max_tenant_windows_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_tenant_windows must be >= 1, got 0"):
        OutputLengthPredictor(max_tenant_windows=0)
