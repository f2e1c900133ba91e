"""The predictor keeps a window's sorted copy up to date incrementally once a quantile has
been asked of it; every prediction must equal the plain definition: the nearest-rank
quantile of the last `window` outputs (the tenant's once it has `min_samples`, else
everyone's), capped at the request's own maximum."""

from __future__ import annotations

import math
from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from kvbudget.daemon.predictor import OutputLengthPredictor


def nearest_rank(values: deque[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


operations = st.lists(
    st.one_of(
        st.tuples(st.just("observe"), st.sampled_from("ab"), st.integers(1, 40)),
        st.tuples(st.just("predict"), st.sampled_from("ab"), st.integers(1, 60)),
        st.tuples(st.just("preempt"), st.just(""), st.just(0)),
    ),
    min_size=30,
    max_size=120,
)


@settings(max_examples=150, deadline=None)
@given(window=st.integers(1, 8), min_samples=st.integers(1, 5), ops=operations)
def test_predictions_equal_the_quantile_of_the_last_window_outputs(window: int, min_samples: int, ops) -> None:
    predictor = OutputLengthPredictor(quantile=0.9, window=window, min_samples=min_samples, decay=0.01)
    everyone: deque[int] = deque(maxlen=window)
    by_tenant: dict[str, deque[int]] = {}
    for kind, tenant, value in ops:
        if kind == "observe":
            predictor.observe(tenant, value)
            everyone.append(value)
            by_tenant.setdefault(tenant, deque(maxlen=window)).append(value)
        elif kind == "preempt":
            predictor.on_preemption()
        else:
            samples = by_tenant.get(tenant)
            if samples is None or len(samples) < min_samples:
                samples = everyone
            expected = value if len(samples) < min_samples else min(value, nearest_rank(samples, predictor.quantile))
            assert predictor.predict(tenant, value) == expected
