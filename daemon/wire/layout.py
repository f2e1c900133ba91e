"""The layout a client rebuilds from the daemon's pool plan, to count blocks as it does.

The other direction, `convert.plan_to_proto`, is the daemon's; this one is the clients'
(live replay's simulated engine, the doctor).
"""

from __future__ import annotations

from kvbudget.daemon.core.spec import (
    AttentionSpec,
    CappedAttentionSpec,
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    KVCacheGroup,
    KVCacheLayout,
    LayerKind,
    LayerSpec,
    MambaSpec,
    MLASpec,
    SlidingWindowSpec,
    kv_dtype,
)
from kvbudget.v1 import common_pb2


def layout_from_plan(plan: common_pb2.PoolPlan) -> KVCacheLayout:
    """`convert.plan_to_proto`'s inverse, as far as counting blocks goes: the daemon's block size
    and groups, each of its own kind, so a client (live replay's simulated engine, the
    doctor) counts blocks per group as the daemon does. ValueError for a group it cannot
    rebuild.

    The plan gives no head counts or dtypes, so the specs' own page sizes are placeholders
    (the layout's page size is the plan's); none of them counts blocks.
    """
    block_size = plan.block_size_tokens or 16
    groups = [KVCacheGroup(_spec_from_plan_group(g, block_size), tuple(g.layer_ids)) for g in plan.groups]
    if not groups:
        groups.append(KVCacheGroup(AttentionSpec(block_size, 1, 1, kv_dtype("bf16")), (0,)))
    return KVCacheLayout(
        block_size=block_size, groups=tuple(groups), group_size=plan.layers_per_group or 1,
        page_size_bytes=plan.page_size_bytes, num_layers=sum(len(g.layer_ids) for g in groups),
        model_name=plan.model,
    )  # fmt: skip


def _spec_from_plan_group(group: common_pb2.KVCacheGroup, block_size: int) -> LayerSpec:
    """The spec of one plan group (convert.plan_to_proto wrote it), with what counts blocks."""
    bf16 = kv_dtype("bf16")
    kind = group.layer_type
    if kind == LayerKind.SLIDING.value:
        return SlidingWindowSpec(block_size, 1, 1, bf16, sliding_window=group.sliding_window_tokens)
    if kind == LayerKind.CHUNKED.value:
        return ChunkedLocalAttentionSpec(block_size, 1, 1, bf16, attention_chunk_size=group.attention_chunk_tokens)
    if kind == LayerKind.CAPPED.value:
        return CappedAttentionSpec(block_size, 1, 1, bf16, token_cap=group.token_cap)
    if kind == LayerKind.MLA.value:
        return MLASpec(block_size, 1, 0, bf16)
    if kind == LayerKind.MAMBA.value:
        # A daemon older than the field sends 0: every Mamba spec it built held one page.
        return MambaSpec(block_size, state_bytes=1, pages_per_request=group.state_pages_per_request or 1)
    if kind == LayerKind.CROSS.value:
        if not group.max_encoder_tokens:
            # No safe guess: the encoder's length is not bounded by max_model_len.
            raise ValueError(
                f"group {group.group_index} (cross_attention) does not say its encoder length "
                "(max_encoder_tokens): the daemon is older than this client"
            )
        return CrossAttentionSpec(block_size, 1, 1, bf16, max_encoder_tokens=group.max_encoder_tokens)
    # full_attention, or a kind newer than this build: every token cached, the most any
    # kind whose blocks grow with the request holds.
    return AttentionSpec(block_size, 1, 1, bf16)
