"""A Hugging Face `config.json` (or a shipped preset) -> per-layer KV specs and a layout.

Everything KVBudget knows about config keys lives here: which layer is which kind, the
KV heads and head sizes, the cache dtype, the model's longest context, and a parameter
count for estimating weight memory. The rest of the core sees only `ModelInfo`.

Layer kinds, first rule that applies:
1. `layer_types` ("full_attention", "sliding_attention", "chunked_attention", "mamba"...).
2. MLA (`kv_lora_rank`, DeepSeek V2/V3): every layer one latent cache.
3. Mamba hybrids: `layers_block_type`, or Jamba's `attn_layer_period`/`attn_layer_offset`.
4. `attention_chunk_size` (Llama 4): NoPE layers (`no_rope_layers[i] == 0`, by default every
   4th layer) are global full attention, the rest chunked local attention.
5. `sliding_window_pattern` P (Gemma 3): layer i is full when (i + 1) % P == 0, else sliding.
6. Gemma 2 (`model_type` gemma2): even layers sliding, odd layers full.
7. `use_sliding_window` (Qwen): False -> all full; True -> layers >= `max_window_layers` slide.
8. `sliding_window` set (Mistral): every layer slides.
9. Otherwise every layer is full attention.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvbudget.daemon.spec import (
    AttentionSpec,
    CappedAttentionSpec,
    ChunkedLocalAttentionSpec,
    KVCacheLayout,
    KVDtype,
    LayerSpec,
    MambaSpec,
    MLASpec,
    SlidingWindowSpec,
    group_layers,
)
from kvbudget.daemon.spec import kv_dtype as parse_kv_dtype

PRESETS_DIR = Path(__file__).resolve().parent / "presets"
DEFAULT_BLOCK_SIZE = 16
# vLLM raises the attention block size of Mamba hybrids in steps of this many tokens.
MAMBA_BLOCK_ALIGNMENT = 16
# Llama 4's default NoPE spacing when `no_rope_layers` is empty.
DEFAULT_NO_ROPE_LAYER_INTERVAL = 4

FULL, SLIDING, CHUNKED, MLA, MAMBA = "full", "sliding", "chunked", "mla", "mamba"
_LAYER_TYPE_NAMES = {
    "full_attention": FULL,
    "attention": FULL,
    "sliding_attention": SLIDING,
    "chunked_attention": CHUNKED,
    "mamba": MAMBA,
}


@dataclass(frozen=True)
class WeightEstimate:
    """Parameter count and bytes of the served weights, from config fields alone.

    Parameters (biases ignored; they are < 0.1% of any preset):
      embeddings  vocab x hidden, twice unless `tie_word_embeddings`
      attention   q: hidden x heads x head_dim, k and v: 2 x hidden x kv_heads x head_dim,
                  o: heads x head_dim x hidden
      MLA         q_a/q_b (or q), kv_a: hidden x (kv_lora_rank + rope), kv_b: kv_lora_rank x
                  heads x (nope + v), o: heads x v x hidden
      mamba       in_proj hidden x 2 d_inner, conv d_inner x d_conv, x_proj d_inner x
                  (dt_rank + 2 d_state), dt_proj dt_rank x d_inner, A and D, out_proj
      MLP         3 x hidden x intermediate (gate, up, down) per dense layer, per expert
                  and per shared expert of MoE layers, plus the router hidden x experts
      norms       2 x hidden per layer
    Bytes: the served dtype (2 bytes for fp32/bf16/fp16 checkpoints, as vLLM's dtype=auto
    serves fp32 in 16 bits), except decoder linears under `quantization_config`: fp8 1 byte,
    mxfp4 experts 4.25 bits (4-bit values + one 8-bit scale per 32), gptq/awq `bits`.
    """

    num_parameters: int
    expert_parameters: int
    weight_bytes: int
    note: str


@dataclass(frozen=True)
class ModelInfo:
    """What the budget needs to know about one model."""

    name: str
    architecture: str
    layout: KVCacheLayout
    max_model_len: int  # max_position_embeddings
    dtype: str  # the checkpoint's torch_dtype
    kv_dtype: str
    weights: WeightEstimate

    @property
    def num_layers(self) -> int:
        return self.layout.num_layers


# ------------------------------------------------------------------------ reading


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.json"))


def read_config(source: str | Path | Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """(name, config dict) from a preset name, a config.json path, a model folder, or a dict."""
    if isinstance(source, Mapping):
        return "", dict(source)
    text = str(source)
    if text in preset_names():
        return text, _read_json(PRESETS_DIR / f"{text}.json")
    path = Path(text).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        raise ValueError(
            f"unknown model {text!r}: not a preset ({', '.join(preset_names())}) "
            "and no such config.json"
        )
    name = path.parent.name if path.name == "config.json" else path.stem
    return name, _read_json(path)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return data


def load_model(
    source: str | Path | Mapping[str, Any],
    *,
    kv_dtype: str | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    token_cap: int | None = None,
) -> ModelInfo:
    """A preset name ("gemma-3-27b"), a path to a config.json or model folder, or a dict."""
    name, config = read_config(source)
    return model_from_config(
        config, name=name, kv_dtype=kv_dtype, block_size=block_size, token_cap=token_cap
    )


# ------------------------------------------------------------------------ fields


def text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The language model's fields: a nested `text_config` (Gemma 3, Llama 4) over the top level."""
    nested = config.get("text_config")
    if nested is None:
        return dict(config)
    if not isinstance(nested, Mapping):
        raise ValueError("config field 'text_config' must be an object")
    merged = {k: v for k, v in config.items() if k != "text_config"}
    merged.update(nested)
    return merged


def _int(cfg: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = cfg.get(key)
    if value is None:
        if default is not None:
            return default
        raise ValueError(f"config field {key!r} is missing")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"config field {key!r} must be a positive integer, got {value!r}")
    return value


def _head_dim(cfg: Mapping[str, Any]) -> int:
    if cfg.get("head_dim") is not None:
        return _int(cfg, "head_dim")
    hidden, heads = _int(cfg, "hidden_size"), _int(cfg, "num_attention_heads")
    if hidden % heads:
        raise ValueError(
            f"config field 'head_dim' is missing and hidden_size {hidden} is not a multiple "
            f"of num_attention_heads {heads}"
        )
    return hidden // heads


def _num_kv_heads(cfg: Mapping[str, Any]) -> int:
    return _int(cfg, "num_key_value_heads", default=_int(cfg, "num_attention_heads"))


def checkpoint_dtype(cfg: Mapping[str, Any]) -> str:
    for key in ("torch_dtype", "dtype"):
        value = cfg.get(key)
        if value is not None:
            if not isinstance(value, str):
                raise ValueError(f"config field {key!r} must be a string, got {value!r}")
            return value.removeprefix("torch.")
    raise ValueError("config field 'torch_dtype' (or 'dtype') is missing")


def _served_dtype(cfg: Mapping[str, Any]) -> KVDtype:
    """The dtype the engine computes in: fp32 checkpoints are served in 16 bits (vLLM auto)."""
    name = checkpoint_dtype(cfg)
    try:
        dtype = parse_kv_dtype(name)
    except ValueError:
        raise ValueError(f"config field 'torch_dtype' has unsupported value {name!r}") from None
    return parse_kv_dtype("bf16") if dtype.bits > 16 else dtype


# ------------------------------------------------------------------------ layer kinds


def layer_kinds(cfg: Mapping[str, Any]) -> tuple[list[str], str]:
    """Per-layer kind (full, sliding, chunked, mla, mamba) and the rule that decided it."""
    n = _int(cfg, "num_hidden_layers")

    layer_types = cfg.get("layer_types")
    if layer_types:
        if not isinstance(layer_types, list) or len(layer_types) != n:
            raise ValueError(
                f"config field 'layer_types' must list {n} layers (num_hidden_layers)"
            )
        kinds = []
        for name in layer_types:
            if name not in _LAYER_TYPE_NAMES:
                raise ValueError(f"config field 'layer_types' has unsupported type {name!r}")
            kinds.append(_LAYER_TYPE_NAMES[name])
        return kinds, "layer_types"

    if cfg.get("kv_lora_rank") is not None:
        return [MLA] * n, "kv_lora_rank (MLA)"

    block_types = cfg.get("layers_block_type")
    if block_types:
        if not isinstance(block_types, list) or len(block_types) != n:
            raise ValueError(f"config field 'layers_block_type' must list {n} layers")
        kinds = []
        for name in block_types:
            if name not in ("attention", "mamba"):
                raise ValueError(f"config field 'layers_block_type' has unsupported type {name!r}")
            kinds.append(FULL if name == "attention" else MAMBA)
        return kinds, "layers_block_type"
    if cfg.get("attn_layer_period") is not None:
        period = _int(cfg, "attn_layer_period")
        offset = cfg.get("attn_layer_offset", 0)
        if not isinstance(offset, int) or not 0 <= offset < period:
            raise ValueError("config field 'attn_layer_offset' must be in [0, attn_layer_period)")
        kinds = [FULL if i % period == offset else MAMBA for i in range(n)]
        return kinds, f"attn_layer_period {period}, offset {offset}"

    if cfg.get("attention_chunk_size") is not None:
        _int(cfg, "attention_chunk_size")
        rope = cfg.get("no_rope_layers") or []
        if not rope:
            interval = _int(cfg, "no_rope_layer_interval", DEFAULT_NO_ROPE_LAYER_INTERVAL)
            rope = [int((i + 1) % interval != 0) for i in range(n)]
        if len(rope) < n:
            raise ValueError(f"config field 'no_rope_layers' must list {n} layers")
        kinds = [CHUNKED if rope[i] else FULL for i in range(n)]
        return kinds, "attention_chunk_size + no_rope_layers (NoPE layers global)"

    pattern_keys = ("sliding_window_pattern", "_sliding_window_pattern")
    pattern_key = next((k for k in pattern_keys if cfg.get(k) is not None), None)
    if pattern_key is not None:
        _require_window(cfg)
        p = _int(cfg, pattern_key)
        kinds = [FULL if (i + 1) % p == 0 else SLIDING for i in range(n)]
        return kinds, f"sliding_window_pattern {p}"

    if cfg.get("model_type") == "gemma2":
        _require_window(cfg)
        return [SLIDING if i % 2 == 0 else FULL for i in range(n)], "gemma2 alternation"

    if "use_sliding_window" in cfg:
        if not cfg["use_sliding_window"] or cfg.get("sliding_window") is None:
            return [FULL] * n, "use_sliding_window false"
        first = _int(cfg, "max_window_layers") if cfg.get("max_window_layers") is not None else 0
        return [SLIDING if i >= first else FULL for i in range(n)], "max_window_layers"

    if cfg.get("sliding_window") is not None:
        _require_window(cfg)
        return [SLIDING] * n, "sliding_window on every layer"

    return [FULL] * n, "no window fields (all full attention)"


def _require_window(cfg: Mapping[str, Any]) -> int:
    return _int(cfg, "sliding_window")


# ------------------------------------------------------------------------ specs


def mamba_state_bytes(cfg: Mapping[str, Any], dtype_bytes: int) -> int:
    """One Mamba-1 layer's state for one request (Jamba's fields).

    d_inner = mamba_expand x hidden_size; conv state (d_conv - 1) x d_inner elements,
    SSM state d_inner x d_state elements; both in the model dtype (vLLM's
    mamba_cache_dtype=auto), whatever the attention KV cache dtype is.
    """
    d_inner = _int(cfg, "mamba_expand", 2) * _int(cfg, "hidden_size")
    conv = (_int(cfg, "mamba_d_conv", 4) - 1) * d_inner
    ssm = d_inner * _int(cfg, "mamba_d_state", 16)
    return (conv + ssm) * dtype_bytes


def model_from_config(
    config: Mapping[str, Any],
    *,
    name: str = "",
    kv_dtype: str | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    token_cap: int | None = None,
) -> ModelInfo:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    if token_cap is not None and (
        isinstance(token_cap, bool) or not isinstance(token_cap, int) or token_cap <= 0
    ):
        raise ValueError(f"token_cap must be a positive integer, got {token_cap!r}")

    cfg = text_config(config)
    kinds, rule = layer_kinds(cfg)
    served = _served_dtype(cfg)
    cache_dtype = parse_kv_dtype(kv_dtype) if kv_dtype is not None else served
    notes = [f"layer kinds from {rule}"]
    if set(kinds) == {MAMBA}:
        raise ValueError("a model of Mamba layers only has no attention page to size blocks by")

    attention = None
    if set(kinds) & {FULL, SLIDING, CHUNKED}:
        attention = AttentionSpec(
            block_size=block_size,
            num_kv_heads=_num_kv_heads(cfg),
            head_size=_head_dim(cfg),
            dtype=cache_dtype,
        )

    mamba = None
    if MAMBA in kinds:
        assert attention is not None
        block_size, mamba, mamba_notes = _align_mamba(cfg, attention, served)
        attention = AttentionSpec(
            block_size, attention.num_kv_heads, attention.head_size, attention.dtype
        )
        notes.extend(mamba_notes)

    specs: list[LayerSpec] = []
    for kind in kinds:
        if kind == MAMBA:
            assert mamba is not None
            specs.append(mamba)
        elif kind == MLA:
            if token_cap is not None:
                raise ValueError("token_cap applies to K/V attention layers, not MLA latents")
            lora, rope = _int(cfg, "kv_lora_rank"), _int(cfg, "qk_rope_head_dim")
            specs.append(MLASpec(block_size, lora, rope, cache_dtype))
        else:
            assert attention is not None
            specs.append(_attention_spec(kind, attention, cfg, token_cap))
    if token_cap is not None:
        notes.append(f"every attention layer capped at {token_cap} tokens")

    name = name or str(cfg.get("_name_or_path") or cfg.get("model_type") or "model")
    layout = group_layers(specs, model_name=name, notes=tuple(notes))
    return ModelInfo(
        name=name,
        architecture=_architecture(config),
        layout=layout,
        max_model_len=_int(cfg, "max_position_embeddings"),
        dtype=checkpoint_dtype(cfg),
        kv_dtype=cache_dtype.name,
        weights=estimate_weights(config),
    )


def _attention_spec(
    kind: str, base: AttentionSpec, cfg: Mapping[str, Any], token_cap: int | None
) -> LayerSpec:
    args = (base.block_size, base.num_kv_heads, base.head_size, base.dtype)
    if token_cap is not None:
        return CappedAttentionSpec(*args, token_cap=token_cap)
    if kind == SLIDING:
        return SlidingWindowSpec(*args, sliding_window=_require_window(cfg))
    if kind == CHUNKED:
        return ChunkedLocalAttentionSpec(
            *args, attention_chunk_size=_int(cfg, "attention_chunk_size")
        )
    return base


def _align_mamba(
    cfg: Mapping[str, Any], attention: AttentionSpec, served: KVDtype
) -> tuple[int, MambaSpec, list[str]]:
    """vLLM's hybrid rule: raise the attention block size to a multiple of 16 tokens whose
    page holds a Mamba state, then pad the Mamba page to that attention page."""
    state = mamba_state_bytes(cfg, served.bits // 8)
    per_token = AttentionSpec(1, attention.num_kv_heads, attention.head_size, attention.dtype)
    step = MAMBA_BLOCK_ALIGNMENT * per_token.page_size_bytes
    needed = MAMBA_BLOCK_ALIGNMENT * -(-state // step)
    block_size = attention.block_size
    notes = [f"mamba state {state} bytes per layer and request"]
    if block_size < needed:
        notes.append(
            f"attention block size raised from {block_size} to {needed} tokens so one "
            "attention page holds a mamba state (as vLLM does)"
        )
        block_size = needed
    page = block_size * per_token.page_size_bytes
    if page > state:
        notes.append(f"mamba page padded from {state} to {page} bytes")
    return block_size, MambaSpec(block_size, state, 1, page if page > state else None), notes


def _architecture(config: Mapping[str, Any]) -> str:
    archs = config.get("architectures")
    if isinstance(archs, list) and archs:
        return str(archs[0])
    return str(config.get("model_type", ""))


# ------------------------------------------------------------------------ weights


def estimate_weights(config: Mapping[str, Any]) -> WeightEstimate:
    cfg = text_config(config)
    kinds, _ = layer_kinds(cfg)
    n = len(kinds)
    hidden = _int(cfg, "hidden_size")
    vocab = _int(cfg, "vocab_size")

    embed = vocab * hidden * (1 if cfg.get("tie_word_embeddings", False) else 2)
    attention = mamba = dense = experts = other = 0
    for i, kind in enumerate(kinds):
        other += 2 * hidden
        if kind == MLA:
            attention += _mla_params(cfg)
        elif kind == MAMBA:
            mamba += _mamba_params(cfg)
        else:
            heads, kv, hd = _int(cfg, "num_attention_heads"), _num_kv_heads(cfg), _head_dim(cfg)
            attention += 2 * hidden * heads * hd + 2 * hidden * kv * hd
        layer_dense, layer_experts = _mlp_params(cfg, i)
        dense += layer_dense
        experts += layer_experts
    other += hidden  # final norm
    other += _vision_params(config)

    served = _served_dtype(cfg).bits / 8
    linear_bytes, expert_bytes, note = served, served, f"{_served_dtype(cfg).name} weights"
    quant = config.get("quantization_config") or cfg.get("quantization_config")
    if isinstance(quant, Mapping):
        method = str(quant.get("quant_method", ""))
        if method == "fp8":
            linear_bytes = expert_bytes = 1.0
            note = "fp8 decoder linears, 16-bit embeddings"
        elif method == "mxfp4":
            expert_bytes = 17 / 32
            note = "mxfp4 experts (4.25 bits), 16-bit rest"
        elif isinstance(quant.get("bits"), int):
            linear_bytes = expert_bytes = quant["bits"] / 8
            note = f"{quant['bits']}-bit {method or 'quantised'} decoder linears"
        else:
            note = f"unknown quant_method {method!r}: counted at {_served_dtype(cfg).name}"

    total = embed + attention + mamba + dense + experts + other
    weight_bytes = (
        (embed + other) * served
        + (attention + mamba + dense) * linear_bytes
        + experts * expert_bytes
    )
    return WeightEstimate(
        num_parameters=total,
        expert_parameters=experts,
        weight_bytes=int(weight_bytes),
        note=note,
    )


def _mla_params(cfg: Mapping[str, Any]) -> int:
    hidden, heads = _int(cfg, "hidden_size"), _int(cfg, "num_attention_heads")
    rope, nope = _int(cfg, "qk_rope_head_dim"), _int(cfg, "qk_nope_head_dim")
    v, lora = _int(cfg, "v_head_dim"), _int(cfg, "kv_lora_rank")
    q_lora = cfg.get("q_lora_rank")
    q_out = heads * (nope + rope)
    q = hidden * q_lora + q_lora * q_out if q_lora else hidden * q_out
    kv = hidden * (lora + rope) + lora * heads * (nope + v)
    return q + kv + heads * v * hidden


def _mamba_params(cfg: Mapping[str, Any]) -> int:
    hidden = _int(cfg, "hidden_size")
    d_inner = _int(cfg, "mamba_expand", 2) * hidden
    d_state, d_conv = _int(cfg, "mamba_d_state", 16), _int(cfg, "mamba_d_conv", 4)
    dt_rank = _int(cfg, "mamba_dt_rank", math.ceil(hidden / 16))
    return (
        hidden * 2 * d_inner
        + d_inner * d_conv
        + d_inner * (dt_rank + 2 * d_state)
        + dt_rank * d_inner
        + d_inner * d_state
        + d_inner
        + d_inner * hidden
    )


def _mlp_params(cfg: Mapping[str, Any], layer: int) -> tuple[int, int]:
    """(dense parameters, expert parameters) of layer `layer`'s feed-forward block."""
    hidden = _int(cfg, "hidden_size")
    num_experts = (
        cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg.get("num_experts") or 0
    )
    if num_experts <= 1 or not _is_moe_layer(cfg, layer):
        # Llama 4 calls its dense layers' width intermediate_size_mlp (intermediate_size
        # is the expert width there).
        key = "intermediate_size_mlp" if cfg.get("intermediate_size_mlp") else "intermediate_size"
        return 3 * hidden * _int(cfg, key), 0
    width = cfg.get("moe_intermediate_size") or _int(cfg, "intermediate_size")
    shared = cfg.get("n_shared_experts") or cfg.get("num_shared_experts") or 0
    if cfg.get("model_type") in ("llama4_text", "llama4"):
        shared = 1  # every Llama 4 MoE layer has one shared expert
    router = hidden * num_experts
    return 3 * hidden * width * shared + router, 3 * hidden * width * num_experts


def _is_moe_layer(cfg: Mapping[str, Any], layer: int) -> bool:
    if cfg.get("first_k_dense_replace") is not None:  # DeepSeek
        freq = cfg.get("moe_layer_freq", 1) or 1
        return layer >= cfg["first_k_dense_replace"] and layer % freq == 0
    if cfg.get("expert_layer_period") is not None:  # Jamba
        return layer % cfg["expert_layer_period"] == cfg.get("expert_layer_offset", 0)
    if cfg.get("interleave_moe_layer_step") is not None:  # Llama 4
        step = cfg["interleave_moe_layer_step"]
        return (layer + 1) % step == 0
    if layer in (cfg.get("mlp_only_layers") or []):  # Qwen MoE
        return False
    step = cfg.get("decoder_sparse_step", 1) or 1
    return (layer + 1) % step == 0


def _vision_params(config: Mapping[str, Any]) -> int:
    """A ViT tower: layers x (4 h^2 attention + 2 h i MLP); small next to the LM."""
    vision = config.get("vision_config")
    if not isinstance(vision, Mapping) or not vision.get("hidden_size"):
        return 0
    h = vision["hidden_size"]
    i = vision.get("intermediate_size", 4 * h)
    layers = vision.get("num_hidden_layers", 0)
    return layers * (4 * h * h + 2 * h * i)
