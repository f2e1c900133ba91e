"""The engine client's messages: a value the wire cannot carry is a ValueError naming the
request and the field, raised before anything is sent (protobuf's own, "Value out of
range: -1", named neither)."""

from __future__ import annotations

import pytest

from kvbudget.client import step_message
from kvbudget.daemon.core.records import RequestSpec


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"prompt_tokens": -1}, "prompt_tokens"),
        ({"prompt_tokens": 2**32}, "prompt_tokens"),
        ({"max_new_tokens": -5}, "max_new_tokens"),
        ({"prefix_hashes": (1, -2)}, "prefix_hashes"),
        ({"priority": 2**31}, "priority"),
    ],
)
def test_a_value_the_wire_cannot_carry_names_its_field(fields: dict, named: str) -> None:
    spec = RequestSpec(**{"request_id": "r-7", "prompt_tokens": 16, "max_new_tokens": 16, **fields})
    with pytest.raises(ValueError, match=rf"^submit 'r-7': {named}: "):
        step_message("s", submits=[spec])


def test_values_at_the_wire_limits_are_sent() -> None:
    spec = RequestSpec("r-8", 2**32 - 1, 0, prefix_hashes=(0, 2**64 - 1), priority=-(2**31))
    [submit] = step_message("s", submits=[spec]).submits
    assert (submit.prompt_tokens, submit.max_new_tokens, list(submit.prefix_hashes), submit.priority) == (
        2**32 - 1, 0, [0, 2**64 - 1], -(2**31))
