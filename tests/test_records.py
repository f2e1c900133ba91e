"""`records.new_decision` is the fast constructor: it must make an ordinary Decision."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbudget.daemon.core.records import Decision, DecisionKind, Reason, RequestSpec, new_decision, new_request_spec

_ids = st.tuples(st.integers(0, 10_000), st.integers(0, 10_000))
decision_args = st.tuples(
    st.integers(0, 2**40),  # seq
    st.floats(allow_nan=False, allow_infinity=False),  # time_s
    st.sampled_from(list(DecisionKind)),
    st.sampled_from(list(Reason)),
    st.text(max_size=8),  # request_id
    st.text(max_size=8),  # engine_id
    st.text(max_size=8),  # tenant
    st.sampled_from(["optimistic", "guaranteed", ""]),
    *(st.integers(0, 10_000) for _ in range(4)),  # prompt, max_new, num_tokens, num_computed
    _ids,  # blocks_reserved
    _ids,  # blocks_held
    st.tuples(st.tuples(st.integers(1, 99)), st.tuples()),  # new_block_ids
    *(st.integers(0, 10_000) for _ in range(5)),  # freed, cached_hit, free, waiting, running
    st.text(max_size=12),  # detail
)


def test_arguments_follow_the_dataclass_fields() -> None:
    # One argument per field, in field order: positional calls mean the same in both.
    code = new_decision.__code__
    assert code.co_varnames[: code.co_argcount] == tuple(f.name for f in dataclasses.fields(Decision))


@settings(deadline=None, max_examples=50)
@given(decision_args)
def test_new_decision_equals_the_dataclass_constructor(args: tuple) -> None:
    fast = new_decision(*args)
    slow = Decision(*args)
    assert type(fast) is Decision
    assert fast == slow
    assert hash(fast) == hash(slow)
    assert dataclasses.astuple(fast) == dataclasses.astuple(slow)
    assert {fast, slow} == {slow}


def test_new_decision_is_frozen_and_replaceable() -> None:
    d = new_decision(
        7, 1.5, DecisionKind.ADMIT, Reason.FITS, "r1", "e1", "t", "guaranteed",
        16, 16, 16, 0, (2,), (1,), ((5,),), 0, 0, 99, 0, 1, "",
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.seq = 8  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del d.request_id  # type: ignore[misc]
    changed = dataclasses.replace(d, seq=8)
    assert changed.seq == 8 and changed.request_id == "r1" and d.seq == 7
    assert repr(d) == repr(Decision(*dataclasses.astuple(d)))


spec_args = st.tuples(
    st.text(max_size=8),  # request_id
    st.integers(1, 10_000),  # prompt_tokens
    st.none() | st.integers(1, 10_000),  # max_new_tokens
    st.tuples(st.integers(), st.integers()),  # prefix_hashes
    st.integers(-5, 5),  # priority
    st.text(max_size=8),  # tenant
    st.text(max_size=8),  # engine_id
    st.none() | st.floats(0, 1e10),  # deadline_s
    st.floats(0, 1e10),  # arrival_s
)


@settings(deadline=None, max_examples=50)
@given(spec_args)
def test_new_request_spec_equals_the_dataclass_constructor(args: tuple) -> None:
    fast, slow = new_request_spec(*args), RequestSpec(*args)
    assert type(fast) is RequestSpec and fast == slow and hash(fast) == hash(slow)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.priority = 1  # type: ignore[misc]
    assert dataclasses.replace(fast, tenant="x").tenant == "x"


def test_new_request_spec_arguments_follow_the_dataclass_fields() -> None:
    code = new_request_spec.__code__
    assert code.co_varnames[: code.co_argcount] == tuple(f.name for f in dataclasses.fields(RequestSpec))
