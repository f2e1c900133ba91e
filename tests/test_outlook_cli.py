"""`kvbudget ask`'s line says a prefix-cache hit when the admission would be one (the
answer's reason is the ADMIT decision's: `fits` or `prefix_hit`)."""

from __future__ import annotations

from kvbudget.cli.cmd_ask import answer_fields, render
from kvbudget.v1 import observer_pb2


def test_an_admission_with_prefix_hits_says_so():
    answer = observer_pb2.AskAdmissionResponse(
        admit_now=True, reason="prefix_hit", blocks_needed=[4], blocks_needed_total=2, blocks_free=6, blocks_spare=2,
    )  # fmt: skip
    assert render(answer_fields(answer)) == (
        "admitted now (prefix_hit); needs 2 blocks; 6 free, 2 spare, 0 cached; 0 requests ahead needing 0"
    )
    plain = observer_pb2.AskAdmissionResponse(admit_now=True, reason="fits", blocks_needed_total=2)
    assert render(answer_fields(plain)).startswith("admitted now; needs 2 blocks")
