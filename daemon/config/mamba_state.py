"""A state layer's (Mamba, gated delta net) bytes per request on one tensor-parallel rank,
and vLLM's hybrid rule that sizes the attention block so one page holds that state.

vLLM shards a state layer as it shards its projections: the conv channels and the SSM (or
recurrent) heads are split evenly over the tensor-parallel ranks, and a split that is not
even is refused. The shapes and the refusals are vLLM's `MambaStateShapeCalculator` and
its mixers' checks; the rule in words is in docs/architecture/config.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvbudget.daemon.config.hf_fields import int_field
from kvbudget.daemon.core.spec import MambaSpec, weight_dtype

# vLLM raises the attention block size of Mamba hybrids in steps of at least this many
# tokens: the smallest block its attention kernels (FlashAttention's multiples of 16) take.
MAMBA_BLOCK_ALIGNMENT = 16


def _split(total: int, tp: int, what: str) -> int:
    """One rank's share of `total`: vLLM divides it exactly or refuses the layout."""
    if total % tp:
        raise ValueError(
            f"tensor_parallel_size {tp} does not divide the mamba layer's {what} ({total}): "
            "vLLM splits it evenly over the ranks and refuses such a layout"
        )
    return total // tp


def mamba_state_bytes(cfg: Mapping[str, Any], dtype_bytes: int, tp: int = 1) -> int:
    """One state layer's conv + recurrent state for one request on one of `tp` ranks, in
    bytes (vLLM's shapes).

    `dtype_bytes` is the model dtype's, which vLLM's mamba_cache_dtype=auto keeps the state
    in, whatever the attention KV cache dtype is. Three kinds of state layer:
    - gated delta net (Qwen3-Next, `linear_num_value_heads`): conv (kernel - 1) x
      (2 x k_heads x k_dim + v_heads x v_dim) / tp, recurrent v_heads / tp x k_dim x v_dim;
    - Mamba-2 (Bamba, granite-4.0-h: `mamba_n_heads`; Nemotron-H: `mamba_num_heads`):
      conv (d_conv - 1) x (d_inner + 2 x n_groups x d_state) / tp, SSM heads / tp x
      head_dim x d_state. The heads must split evenly, the groups too unless there is one
      group, which every rank then holds (n_groups counts as tp); Nemotron-H keeps the SSM
      state in `mamba_ssm_cache_dtype`, float32 when the config does not say;
    - Mamba-1 (Jamba): d_inner = mamba_expand x hidden_size split evenly, conv (d_conv - 1)
      x d_inner / tp, SSM d_inner / tp x d_state.
    """
    if cfg.get("linear_num_value_heads") is not None:
        k_heads = int_field(cfg, "linear_num_key_heads")
        v_heads = int_field(cfg, "linear_num_value_heads")
        k_dim = int_field(cfg, "linear_key_head_dim")
        v_dim = int_field(cfg, "linear_value_head_dim")
        kernel = int_field(cfg, "linear_conv_kernel_dim", 4)
        channels = _split(2 * k_heads * k_dim + v_heads * v_dim, tp, "conv channels")
        recurrent = _split(v_heads, tp, "value heads") * k_dim * v_dim
        return ((kernel - 1) * channels + recurrent) * dtype_bytes
    if cfg.get("mamba_num_heads") is not None:  # Nemotron-H's names
        heads, head = int_field(cfg, "mamba_num_heads"), int_field(cfg, "mamba_head_dim")
        groups, d_state = int_field(cfg, "n_groups", 1), int_field(cfg, "ssm_state_size")
        d_conv = int_field(cfg, "conv_kernel", 4)
        conv, ssm = _mamba2(heads, head, heads * head, groups, d_state, d_conv, tp)
        return conv * dtype_bytes + ssm * _ssm_bytes(cfg)
    if cfg.get("mamba_n_heads") is not None:  # Bamba, granite-4.0-h
        heads, head = int_field(cfg, "mamba_n_heads"), int_field(cfg, "mamba_d_head")
        d_inner = int_field(cfg, "mamba_expand", 2) * int_field(cfg, "hidden_size")
        groups = int_field(cfg, "mamba_n_groups", 1)
        d_state, d_conv = int_field(cfg, "mamba_d_state"), int_field(cfg, "mamba_d_conv", 4)
        conv, ssm = _mamba2(heads, head, d_inner, groups, d_state, d_conv, tp)
        return (conv + ssm) * dtype_bytes
    d_inner = int_field(cfg, "mamba_expand", 2) * int_field(cfg, "hidden_size")
    rank_inner = _split(d_inner, tp, "d_inner (mamba_expand x hidden_size)")
    conv = (int_field(cfg, "mamba_d_conv", 4) - 1) * rank_inner
    ssm = rank_inner * int_field(cfg, "mamba_d_state", 16)
    return (conv + ssm) * dtype_bytes


def _mamba2(
    heads: int, head: int, d_inner: int, groups: int, d_state: int, d_conv: int, tp: int
) -> tuple[int, int]:
    """(conv, SSM) elements of one Mamba-2 layer on one rank."""
    rank_heads = _split(heads, tp, "SSM heads")
    if groups % tp and groups != 1:
        raise ValueError(
            f"tensor_parallel_size {tp} does not divide the mamba layer's {groups} groups: "
            "vLLM splits them evenly over the ranks (or copies a single one to each) and "
            "refuses such a layout"
        )
    if groups == 1:  # one group: a copy on every rank, as if there were tp of them
        groups = tp
    conv = (d_conv - 1) * _split(d_inner + 2 * groups * d_state, tp, "conv channels")
    return conv, rank_heads * head * d_state


def _ssm_bytes(cfg: Mapping[str, Any]) -> int:
    name = cfg.get("mamba_ssm_cache_dtype") or "float32"
    try:
        return weight_dtype(str(name)).bits // 8
    except ValueError:
        raise ValueError(f"config field 'mamba_ssm_cache_dtype' has unsupported value {name!r}") from None


def align_to_state(state: int, token_page: int, block_size: int) -> tuple[int, MambaSpec, list[str]]:
    """vLLM's hybrid rule, on one rank's figures: (attention block size, the Mamba spec,
    notes). `state` is one rank's state bytes, `token_page` one rank's attention bytes per
    token, `block_size` the one given (or the default).

    The block grows in steps of the kernel alignment, max(16, block_size), until one
    attention page holds a state: alignment x cdiv(state, alignment x token_page), rounded
    up to a multiple of 16; a block already that large is kept. The Mamba page is then
    padded to the attention page, so every page in the pool is the same size.
    """
    alignment = max(MAMBA_BLOCK_ALIGNMENT, block_size)
    needed = alignment * -(-state // (alignment * token_page))
    needed = MAMBA_BLOCK_ALIGNMENT * -(-needed // MAMBA_BLOCK_ALIGNMENT)
    notes = [f"mamba state {state} bytes per layer and request"]
    if block_size < needed:
        notes.append(
            f"attention block size raised from {block_size} to {needed} tokens so one "
            "attention page holds a mamba state (as vLLM does)"
        )
        block_size = needed
    page = block_size * token_page
    if page > state:
        notes.append(f"mamba page padded from {state} to {page} bytes")
    return block_size, MambaSpec(block_size, state, 1, page if page > state else None), notes
