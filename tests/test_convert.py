"""The hot-path converters build exactly the messages and specs the plain way builds.

`convert._build_decision` sets fields one by one and skips defaults, and
`convert.submit_to_spec` asks HasField only when it must: both for speed (every Step).
Here they are checked against the obvious construction (every field as a keyword) on
random values, including the edges: zeros, empty groups, several groups, a negative
max_new_tokens (a prompt rejected past max_model_len), an explicit max_new_tokens of 0.
"""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from kvbudget.daemon.wire import convert
from kvbudget.daemon.core.records import Decision, DecisionKind, Reason
from kvbudget.v1 import common_pb2, engine_pb2

COUNTS = st.integers(0, 2**32 - 1)
SMALL = st.sampled_from([0, 1, 7, 127, 128, 300])
GROUPS = st.integers(0, 3)


@st.composite
def decisions(draw) -> Decision:
    groups = draw(GROUPS)
    per_group = st.tuples(*[SMALL] * groups)
    return Decision(
        seq=draw(st.integers(0, 2**63)),
        time_s=draw(st.floats(allow_nan=False)),
        kind=draw(st.sampled_from(list(DecisionKind))),
        reason=draw(st.sampled_from(list(Reason))),
        request_id=draw(st.text(max_size=5)),
        engine_id=draw(st.text(max_size=5)),
        tenant=draw(st.sampled_from(["", "t", "é"])),
        policy=draw(st.sampled_from(["", *convert.POLICY_NAMES])),
        prompt_tokens=draw(COUNTS),
        max_new_tokens=draw(st.sampled_from([-5, -1, 0, 1, 16, 2**32 - 1])),
        num_tokens=draw(COUNTS),
        num_computed=draw(COUNTS),
        blocks_reserved=draw(per_group),
        blocks_held=draw(per_group),
        new_block_ids=tuple(draw(st.lists(st.lists(COUNTS, max_size=3).map(tuple), min_size=groups, max_size=groups))),
        freed_blocks=draw(SMALL),
        cached_hit_blocks=draw(SMALL),
        num_free_blocks=draw(COUNTS),
        num_waiting=draw(SMALL),
        num_running=draw(SMALL),
        detail=draw(st.sampled_from(["", "why"])),
    )


def plain(d: Decision) -> common_pb2.Decision:
    """Every field as a constructor keyword: slow, and obviously right."""
    return common_pb2.Decision(
        seq=d.seq, time_unix_s=d.time_s, kind=convert.kind_to_proto(d.kind), reason=d.reason.value,
        request_id=d.request_id, engine_id=d.engine_id, tenant=d.tenant, policy=convert.policy_to_proto(d.policy),
        prompt_tokens=d.prompt_tokens, max_new_tokens=max(0, d.max_new_tokens), num_tokens=d.num_tokens,
        num_computed_tokens=d.num_computed, blocks_reserved=d.blocks_reserved, blocks_held=d.blocks_held,
        new_blocks=[
            common_pb2.GroupBlocks(group_index=i, block_ids=ids) for i, ids in enumerate(d.new_block_ids) if ids
        ],
        freed_blocks=d.freed_blocks, cached_hit_blocks=d.cached_hit_blocks, num_free_blocks=d.num_free_blocks,
        num_waiting=d.num_waiting, num_running=d.num_running, detail=d.detail,
    )


@given(d=decisions())
def test_decision_to_proto_is_the_plain_message(d: Decision) -> None:
    built = convert.decision_to_proto(d)
    assert built == plain(d)
    assert built.SerializeToString(deterministic=True) == plain(d).SerializeToString(deterministic=True)


@given(batch=st.lists(decisions(), max_size=4), engine_id=st.sampled_from([None, "", "a"]))
def test_add_decisions_appends_the_plain_messages_of_the_engine(batch, engine_id) -> None:
    reply = engine_pb2.StepResponse()
    convert.add_decisions(reply.decisions, batch, engine_id)
    assert list(reply.decisions) == [plain(d) for d in batch if engine_id is None or d.engine_id == engine_id]


@given(
    max_new_tokens=st.sampled_from([None, 0, 1, 2**32 - 1]),
    hashes=st.lists(st.integers(0, 2**64 - 1), max_size=3),
    deadline=st.sampled_from([0.0, 2.5, math.inf]),
)
def test_submit_to_spec_reads_presence_and_hashes_as_the_plain_way(max_new_tokens, hashes, deadline) -> None:
    submit = engine_pb2.Submit(request_id="r", prompt_tokens=64, prefix_hashes=hashes, deadline_unix_s=deadline)
    if max_new_tokens is not None:
        submit.max_new_tokens = max_new_tokens  # explicitly 0 is 0, not "unset"
    spec = convert.submit_to_spec(submit, "e", 1.0)
    assert spec.max_new_tokens == (submit.max_new_tokens if submit.HasField("max_new_tokens") else None)
    assert spec.max_new_tokens == max_new_tokens
    assert spec.prefix_hashes == tuple(hashes)
    assert spec.deadline_s == (deadline or None)


def test_a_snapshot_says_which_daemon_process_took_it() -> None:
    from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController

    from test_admission_support import SMALL_LAYOUTS

    controller = AdmissionController(SMALL_LAYOUTS["full"], 30, AdmissionConfig(max_model_len=64))
    msg = convert.snapshot_to_proto(controller.snapshot(1005.0), started_unix_s=1000.0, daemon_version="0.4.0")
    assert (msg.time_unix_s, msg.started_unix_s, msg.daemon_version) == (1005.0, 1000.0, "0.4.0")
    # A core with no daemon around it (tests, benches) does not say: 0 and "", as an older daemon.
    bare = convert.snapshot_to_proto(controller.snapshot(1005.0))
    assert (bare.started_unix_s, bare.daemon_version) == (0.0, "")


def test_names_a_reader_shows_known_unspecified_and_newer_values():
    for kind in DecisionKind:
        assert convert.kind_name(convert.kind_to_proto(kind)) == kind.value
    for policy in convert.POLICY_NAMES:
        assert convert.policy_name(convert.policy_to_proto(policy)) == policy
    assert convert.kind_name(common_pb2.DECISION_KIND_UNSPECIFIED) == "unspecified"
    assert convert.policy_name(common_pb2.POLICY_UNSPECIFIED) == "unspecified"
    assert convert.kind_name(999) == "999"  # a kind newer than this build: its number
    assert convert.policy_name(999) == "999"


def test_each_group_says_its_layer_type_as_a_name_and_as_the_enum() -> None:
    """KVCacheGroup.layer_kind and GroupState.layer_kind (the closed set, as an enum) beside
    the layer_type names clients read already: the same kind in both."""
    from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController

    from test_admission_support import SMALL_LAYOUTS

    sliding = ("sliding_window", common_pb2.LAYER_TYPE_SLIDING_WINDOW)
    expected = {"hybrid": [sliding, sliding, ("full_attention", common_pb2.LAYER_TYPE_FULL_ATTENTION)],
                "chunked": [("chunked_local", common_pb2.LAYER_TYPE_CHUNKED_LOCAL),
                            ("full_attention", common_pb2.LAYER_TYPE_FULL_ATTENTION)],
                "mla": [("mla", common_pb2.LAYER_TYPE_MLA)],
                "mamba": [("mamba", common_pb2.LAYER_TYPE_MAMBA),
                          ("full_attention", common_pb2.LAYER_TYPE_FULL_ATTENTION)]}
    for name, kinds in expected.items():
        layout = SMALL_LAYOUTS[name]
        plan = convert.plan_to_proto(layout, 30, max_model_len=64, max_num_batched_tokens=16)
        assert [(g.layer_type, g.layer_kind) for g in plan.groups] == kinds, name
        snapshot = convert.snapshot_to_proto(AdmissionController(layout, 30, AdmissionConfig(max_model_len=64))
                                             .snapshot(1.0))
        assert [(g.layer_type, g.layer_kind) for g in snapshot.groups] == kinds, name
