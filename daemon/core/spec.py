"""KV-cache specs: one small frozen dataclass per layer type, and vLLM-style grouping.

A *page* is what one layer stores for one block of `block_size` tokens. Layers with the
same spec are grouped into KV-cache groups of `group_size` layers; a pool block is one page
of every layer of one group, so `bytes_per_block = page_size_bytes * group_size` and block
counts mean what vLLM's `num_gpu_blocks` means.
"""

from __future__ import annotations

import enum
from collections import defaultdict
from dataclasses import dataclass, field


class LayerKind(str, enum.Enum):
    FULL = "full_attention"
    SLIDING = "sliding_window"
    CHUNKED = "chunked_local"
    MLA = "mla"
    MAMBA = "mamba"
    CROSS = "cross_attention"
    CAPPED = "capped"


@dataclass(frozen=True)
class KVDtype:
    """Storage of one cached element.

    Quantised caches (int4, int2) are assumed to use per-token, per-head asymmetric
    quantisation (KIVI-style): each K or V vector of one head carries an fp16 scale and
    an fp16 zero point, i.e. `scale_bytes_per_vector = 4` on top of the packed bits.
    For MLA, one latent vector per token carries one such pair.
    """

    name: str
    bits: int
    scale_bytes_per_vector: int = 0

    def vector_bytes(self, dim: int) -> int:
        packed_bits = dim * self.bits
        return -(-packed_bits // 8) + self.scale_bytes_per_vector


_FP32 = KVDtype("fp32", 32)
_BF16 = KVDtype("bf16", 16)
_FP16 = KVDtype("fp16", 16)
_FP8 = KVDtype("fp8", 8)

# What a KV cache may be stored in: the names `kvbudget estimate --kv-dtype` and the
# daemon's `kv_dtype` both take (one table, so the two cannot drift apart). vLLM's
# `--kv-cache-dtype` spellings (bfloat16, fp8_e4m3, fp8_e5m2) are here too; both fp8
# formats are one byte. No fp32: no engine keeps a 4-byte cache (vLLM serves fp32
# checkpoints in 16 bits, and its cache with them).
KV_DTYPES: dict[str, KVDtype] = {
    "bf16": _BF16,
    "fp16": _FP16,
    "fp8": _FP8,
    "int4": KVDtype("int4", 4, scale_bytes_per_vector=4),
    "int2": KVDtype("int2", 2, scale_bytes_per_vector=4),
    "bfloat16": _BF16,
    "float16": _FP16,
    "half": _FP16,
    "fp8_e4m3": _FP8,
    "fp8_e5m2": _FP8,
}
KV_DTYPE_NAMES = "bf16, fp16, fp8, int4, int2 (or bfloat16, float16, fp8_e4m3, fp8_e5m2)"

# What a checkpoint's weights may be stored in (Hugging Face `torch_dtype` / `dtype`).
WEIGHT_DTYPES: dict[str, KVDtype] = {
    "bf16": _BF16,
    "bfloat16": _BF16,
    "fp16": _FP16,
    "float16": _FP16,
    "half": _FP16,
    "fp32": _FP32,
    "float32": _FP32,
    "fp8": _FP8,
    "fp8_e4m3": _FP8,
    "fp8_e5m2": _FP8,
}


def kv_dtype(name: str) -> KVDtype:
    """A KV-cache dtype by name (KV_DTYPES)."""
    try:
        return KV_DTYPES[name.lower()]
    except (KeyError, AttributeError):
        raise ValueError(f"unknown kv dtype {name!r}; expected one of {KV_DTYPE_NAMES}") from None


def weight_dtype(name: str) -> KVDtype:
    """A checkpoint's dtype by name (WEIGHT_DTYPES)."""
    try:
        return WEIGHT_DTYPES[name.lower()]
    except (KeyError, AttributeError):
        raise ValueError(f"unknown weight dtype {name!r}") from None


@dataclass(frozen=True)
class AttentionSpec:
    """Full attention: every token of the request stays in the cache."""

    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: KVDtype
    head_size_v: int | None = None  # None: same as head_size

    kind = LayerKind.FULL

    @property
    def page_size_bytes(self) -> int:
        k = self.dtype.vector_bytes(self.head_size)
        v = self.dtype.vector_bytes(self.head_size_v or self.head_size)
        return self.block_size * self.num_kv_heads * (k + v)

    def describe(self) -> str:
        return self.kind.value


@dataclass(frozen=True)
class SlidingWindowSpec(AttentionSpec):
    sliding_window: int = 0
    kind = LayerKind.SLIDING

    def describe(self) -> str:
        return f"sliding_window W={self.sliding_window}"


@dataclass(frozen=True)
class ChunkedLocalAttentionSpec(AttentionSpec):
    attention_chunk_size: int = 0
    kind = LayerKind.CHUNKED

    def describe(self) -> str:
        return f"chunked_local C={self.attention_chunk_size}"


@dataclass(frozen=True)
class CappedAttentionSpec(AttentionSpec):
    """A layer whose engine compresses the cache to at most `token_cap` tokens (Ada-KV style).

    Only admission uses the cap; which tokens the engine keeps is not our business.
    """

    token_cap: int = 0
    kind = LayerKind.CAPPED

    def describe(self) -> str:
        return f"capped cap={self.token_cap}"


@dataclass(frozen=True)
class CrossAttentionSpec(AttentionSpec):
    max_encoder_tokens: int = 0
    kind = LayerKind.CROSS

    def describe(self) -> str:
        return f"cross_attention enc={self.max_encoder_tokens}"


@dataclass(frozen=True)
class MLASpec:
    """DeepSeek multi-head latent attention: one compressed latent per token."""

    block_size: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    dtype: KVDtype

    kind = LayerKind.MLA

    @property
    def page_size_bytes(self) -> int:
        return self.block_size * self.dtype.vector_bytes(self.kv_lora_rank + self.qk_rope_head_dim)

    def describe(self) -> str:
        return self.kind.value


@dataclass(frozen=True)
class MambaSpec:
    """A state-space layer: a constant state per request, whatever its length.

    `state_bytes` is the conv + SSM state of one layer for one request.
    `page_size_padded` lets grouping pad the page to the attention page size, as vLLM does.
    """

    block_size: int
    state_bytes: int
    pages_per_request: int = 1
    page_size_padded: int | None = None

    kind = LayerKind.MAMBA

    @property
    def page_size_bytes(self) -> int:
        return self.page_size_padded or self.state_bytes

    def describe(self) -> str:
        return self.kind.value


LayerSpec = (
    AttentionSpec
    | SlidingWindowSpec
    | ChunkedLocalAttentionSpec
    | CappedAttentionSpec
    | CrossAttentionSpec
    | MLASpec
    | MambaSpec
)


@dataclass(frozen=True)
class KVCacheGroup:
    """Layers that share one spec and one block table."""

    spec: LayerSpec
    layer_ids: tuple[int, ...]

    @property
    def kind(self) -> LayerKind:
        return self.spec.kind


@dataclass(frozen=True)
class KVCacheLayout:
    """How a model's layers map onto one shared block pool."""

    block_size: int
    groups: tuple[KVCacheGroup, ...]
    group_size: int  # layers per group = tensors a block spans
    page_size_bytes: int  # one common page size across groups
    num_layers: int
    model_name: str = ""
    notes: tuple[str, ...] = field(default=())

    @property
    def bytes_per_block(self) -> int:
        return self.page_size_bytes * self.group_size

    @property
    def num_groups(self) -> int:
        return len(self.groups)


def group_layers(
    layer_specs: list[LayerSpec],
    *,
    model_name: str = "",
    notes: tuple[str, ...] = (),
    layer_ids: tuple[int, ...] | None = None,
    num_layers: int | None = None,
) -> KVCacheLayout:
    """Group per-layer specs the way vLLM v1 does for a uniform page size.

    Layers with equal specs form one type. The group size is the smallest type's layer
    count, or the largest's when the largest is under 1.5x the smallest (less padding:
    vLLM's current rule, which pads 12 sliding + 13 full to 13 + 13). A type of n layers
    becomes cdiv(n, group_size) groups, and its layers are dealt out round-robin (group j
    takes the type's layers j, j + k, j + 2k... for k groups), as vLLM deals them, so the
    padding is spread over the type's groups: 52 sliding layers in groups of 10 are
    9, 9, 9, 9, 8, 8, not 10, 10, 10, 10, 10, 2. Padded slots waste memory exactly as
    they do in vLLM: every group's block spans group_size pages.
    Page sizes are made uniform by padding every page to the largest one.

    `layer_ids` names each spec's model layer (default: 0, 1, 2...), for models whose
    layers do not all hold a cache (an MLP-only layer has no spec); `num_layers` is the
    model's layer count (default: one per spec).
    """
    if not layer_specs:
        raise ValueError("a model needs at least one KV-cache layer")
    if layer_ids is None:
        layer_ids = tuple(range(len(layer_specs)))
    if len(layer_ids) != len(layer_specs):
        raise ValueError("layer_ids must name one layer per spec")
    block_sizes = {s.block_size for s in layer_specs}
    if len(block_sizes) != 1:
        raise ValueError(f"layers disagree on block size: {sorted(block_sizes)}")
    block_size = block_sizes.pop()

    by_spec: dict[LayerSpec, list[int]] = defaultdict(list)
    for layer_id, spec in zip(layer_ids, layer_specs):
        by_spec[spec].append(layer_id)

    counts = [len(ids) for ids in by_spec.values()]
    group_size = min(counts)
    if max(counts) < min(counts) * 1.5:
        group_size = max(counts)

    groups: list[KVCacheGroup] = []
    for spec, ids in by_spec.items():
        num_groups = -(-len(ids) // group_size)
        for j in range(num_groups):
            groups.append(KVCacheGroup(spec, tuple(ids[j::num_groups])))

    page_size = max(s.page_size_bytes for s in by_spec)
    return KVCacheLayout(
        block_size=block_size,
        groups=tuple(groups),
        group_size=group_size,
        page_size_bytes=page_size,
        num_layers=len(layer_specs) if num_layers is None else num_layers,
        model_name=model_name,
        notes=notes,
    )
