"""Worst-case and current block counts per request and KV-cache group (pure functions).

This module owns every formula that turns tokens into blocks. Admission, reclamation,
`estimate` and the replayer call these and never re-derive them, so what admission
promises and what the pool actually holds cannot drift apart.

Notation (vLLM's): B block size, L tokens the request may reach (prompt + max new tokens,
capped at max_model_len), F tokens in flight per step (max_num_batched_tokens x batches),
W a sliding window, C an attention chunk, T an engine's token cap per layer (`--token-cap`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import gcd

from kvbudget.daemon.core.spec import KVCacheGroup, KVCacheLayout, LayerKind, LayerSpec

# Enum members as module constants: `LayerKind.X` is a ~70 ns metaclass lookup on Python
# 3.11, and block_slots / blocks_out_of_window run on every grow and release.
_MAMBA, _CROSS, _CAPPED = LayerKind.MAMBA, LayerKind.CROSS, LayerKind.CAPPED
_SLIDING, _CHUNKED = LayerKind.SLIDING, LayerKind.CHUNKED


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------------------- worst case
# Each function: the most blocks one layer group can hold at once for a request that
# reaches `num_tokens` tokens, with `F` tokens computed per step.


def _worst_full(spec: LayerSpec, num_tokens: int, F: int) -> int:
    return cdiv(num_tokens, spec.block_size)


def _worst_sliding(spec: LayerSpec, num_tokens: int, F: int) -> int:
    # W - 1 earlier tokens are in view plus the F being computed; +1 because the window
    # need not start on a block boundary. A request shorter than that holds all it has.
    W = spec.sliding_window  # type: ignore[union-attr]
    return min(cdiv(min(W - 1 + F, num_tokens), spec.block_size) + 1, cdiv(num_tokens, spec.block_size))


def _worst_chunked(spec: LayerSpec, num_tokens: int, F: int) -> int:
    # vLLM's cdiv(min(C + F, L), B) when C is a multiple of B (every shipped model). Else
    # the current chunk may start mid-block, and the held span reaches back to the block
    # boundary before it: up to B - gcd(C, B) tokens more, so at most
    # (B - gcd(C, B)) + (C - 1) + F tokens from the first held block's start (C = 12, B = 8,
    # F = 10: 23 computed, 33 slots hold blocks 1..4, where cdiv(22, 8) says 3).
    C = spec.attention_chunk_size  # type: ignore[union-attr]
    B = spec.block_size
    span = C + F
    if C % B:
        span += B - gcd(C, B) - 1
    return cdiv(min(span, num_tokens), B)


def _worst_capped(spec: LayerSpec, num_tokens: int, F: int) -> int:
    # The engine compresses the layer to at most T tokens: cdiv(min(L, T), B).
    return cdiv(min(num_tokens, spec.token_cap), spec.block_size)  # type: ignore[union-attr]


def _worst_cross(spec: LayerSpec, num_tokens: int, F: int) -> int:
    return cdiv(spec.max_encoder_tokens, spec.block_size)  # type: ignore[union-attr]


def _worst_mamba(spec: LayerSpec, num_tokens: int, F: int) -> int:
    return spec.pages_per_request  # type: ignore[union-attr]


WORST_CASE: dict[LayerKind, Callable[[LayerSpec, int, int], int]] = {
    LayerKind.FULL: _worst_full,
    LayerKind.MLA: _worst_full,
    LayerKind.SLIDING: _worst_sliding,
    LayerKind.CHUNKED: _worst_chunked,
    LayerKind.CAPPED: _worst_capped,
    LayerKind.CROSS: _worst_cross,
    LayerKind.MAMBA: _worst_mamba,
}


def token_cap_binds(extent: int, token_cap: int) -> bool:
    """Whether a token cap T changes a layer that already drops old tokens: a sliding
    window (extent W) or a chunk (extent C). Where it does not, the layer keeps its own
    formula; where it does, the layer is capped (`_worst_capped`).

    T >= W: the layer keeps at most W - 1 computed tokens in view (`blocks_out_of_window`;
    a chunk's C - 1), fewer than T, so the engine's compression never has anything to drop
    and the layer holds what it holds uncapped: the window's min(cdiv(min(W - 1 + F, L), B)
    + 1, cdiv(L, B)) (the chunk's formula for C). Charging cdiv(min(L, T), B) there
    would charge more than no cap for a T well past W - 1 + F (T = 20000 below).
    T < W: the cap binds, and cdiv(min(L, T), B) <= the window's: min(L, T) <= min(W - 1
    + F, L) as T <= W - 1, and <= cdiv(L, B) (a chunk's span C + F > T likewise). So a cap
    never charges more than no cap. W = 4096, B = 16, F = 8192, L = 32768: uncapped 769
    blocks; T = 1024: 64; T = 4096 or 20000: 769 (capped, T = 20000 would be 1250).
    """
    return token_cap < extent


def worst_case_blocks(spec: LayerSpec, num_tokens: int, max_num_batched_tokens: int) -> int:
    """Most blocks one group holds at once for a request reaching `num_tokens` tokens."""
    if num_tokens <= 0:
        return 0
    return WORST_CASE[spec.kind](spec, num_tokens, max_num_batched_tokens)


def naive_blocks(spec: LayerSpec, num_tokens: int) -> int:
    """What a layer-unaware system charges: every token in every layer (the anti-pattern)."""
    if spec.kind is _MAMBA:
        return spec.pages_per_request  # type: ignore[union-attr]
    return cdiv(num_tokens, spec.block_size)


# ---------------------------------------------------------------- the request's life
# `num_tokens`: slots the request needs now (computed + about to be computed).
# `num_computed`: tokens whose KV is written and final.


def blocks_out_of_window(spec: LayerSpec, num_computed: int) -> int:
    """Leading blocks no future token can attend to once `num_computed` tokens are done.

    Sliding window W: the next token attends to the last W - 1 computed ones, so the first
    `max(0, computed - W + 1)` tokens are out of view. Chunked local C: tokens before the
    current chunk's start are out of view. Others never release blocks while running.
    """
    B = spec.block_size
    if spec.kind is _SLIDING:
        return max(0, num_computed - spec.sliding_window + 1) // B  # type: ignore[union-attr]
    if spec.kind is _CHUNKED:
        C = spec.attention_chunk_size  # type: ignore[union-attr]
        return (num_computed // C) * C // B
    return 0


def block_slots(spec: LayerSpec, num_tokens: int) -> int:
    """Block-table length (including released leading slots) for `num_tokens` tokens."""
    if num_tokens <= 0:
        return 0
    kind = spec.kind
    if kind is _MAMBA:
        return spec.pages_per_request  # type: ignore[union-attr]
    if kind is _CROSS:
        return cdiv(spec.max_encoder_tokens, spec.block_size)  # type: ignore[union-attr]
    if kind is _CAPPED:
        return cdiv(min(num_tokens, spec.token_cap), spec.block_size)  # type: ignore[union-attr]
    return cdiv(num_tokens, spec.block_size)


def blocks_held(spec: LayerSpec, num_tokens: int, num_computed: int) -> int:
    """Blocks a group must hold for `num_tokens` slots after `num_computed` are done."""
    slots = block_slots(spec, num_tokens)
    return max(0, slots - min(blocks_out_of_window(spec, num_computed), slots))


# --------------------------------------------------------------------- request totals


@dataclass(frozen=True)
class RequestBudget:
    """Blocks per group for one request; `total` is what it draws from the shared pool."""

    per_group: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.per_group)


def request_worst_case(
    layout: KVCacheLayout, num_tokens: int, max_num_batched_tokens: int
) -> RequestBudget:
    return RequestBudget(
        tuple(worst_case_blocks(g.spec, num_tokens, max_num_batched_tokens) for g in layout.groups)
    )


def request_naive(layout: KVCacheLayout, num_tokens: int) -> RequestBudget:
    return RequestBudget(tuple(naive_blocks(g.spec, num_tokens) for g in layout.groups))


def max_concurrency(
    num_blocks: int, layout: KVCacheLayout, num_tokens: int, max_num_batched_tokens: int
) -> float:
    """vLLM's "Maximum concurrency for N tokens per request": pool / Σ worst case."""
    need = request_worst_case(layout, num_tokens, max_num_batched_tokens).total
    return num_blocks / need if need else float("inf")


def naive_max_concurrency(num_blocks: int, layout: KVCacheLayout, num_tokens: int) -> float:
    need = request_naive(layout, num_tokens).total
    return num_blocks / need if need else float("inf")


def max_model_len_that_fits(
    num_blocks: int, layout: KVCacheLayout, max_num_batched_tokens: int, upper: int
) -> int:
    """Largest L ≤ upper with one request's worst case within the pool (0 if none).

    Worst case is monotone in L, so a binary search is exact.
    """
    lo, hi = 0, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if request_worst_case(layout, mid, max_num_batched_tokens).total <= num_blocks:
            lo = mid
        else:
            hi = mid - 1
    return lo


def cache_hit_tokens(
    groups: Sequence[KVCacheGroup], hits_per_group: Sequence[int], prompt_tokens: int
) -> int:
    """Tokens a request may skip: the smallest hit over groups, never the whole prompt.

    The last prompt token is always recomputed (its logits are needed), as in vLLM.
    """
    if not groups:
        return 0
    B = groups[0].spec.block_size
    hit_blocks = min(hits_per_group)
    return min(hit_blocks * B, max(0, ((prompt_tokens - 1) // B) * B))
