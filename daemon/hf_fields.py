"""Reading a Hugging Face `config.json`: its fields, and which kind each layer is.

Every config key KVBudget reads is read through here (`hf_config` turns them into KV
specs, `hf_weights` into a weight estimate), so a missing or malformed field gets the same
message, naming it, wherever it is used.

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

from collections.abc import Mapping
from typing import Any

from kvbudget.daemon.spec import KVDtype
from kvbudget.daemon.spec import kv_dtype as parse_kv_dtype

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


def int_field(cfg: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = cfg.get(key)
    if value is None:
        if default is not None:
            return default
        raise ValueError(f"config field {key!r} is missing")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"config field {key!r} must be a positive integer, got {value!r}")
    return value


def head_dim(cfg: Mapping[str, Any]) -> int:
    if cfg.get("head_dim") is not None:
        return int_field(cfg, "head_dim")
    hidden, heads = int_field(cfg, "hidden_size"), int_field(cfg, "num_attention_heads")
    if hidden % heads:
        raise ValueError(
            f"config field 'head_dim' is missing and hidden_size {hidden} is not a multiple "
            f"of num_attention_heads {heads}"
        )
    return hidden // heads


def num_kv_heads(cfg: Mapping[str, Any]) -> int:
    return int_field(cfg, "num_key_value_heads", default=int_field(cfg, "num_attention_heads"))


def checkpoint_dtype(cfg: Mapping[str, Any]) -> str:
    for key in ("torch_dtype", "dtype"):
        value = cfg.get(key)
        if value is not None:
            if not isinstance(value, str):
                raise ValueError(f"config field {key!r} must be a string, got {value!r}")
            return value.removeprefix("torch.")
    raise ValueError("config field 'torch_dtype' (or 'dtype') is missing")


def served_dtype(cfg: Mapping[str, Any]) -> KVDtype:
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
    n = int_field(cfg, "num_hidden_layers")

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
        period = int_field(cfg, "attn_layer_period")
        offset = cfg.get("attn_layer_offset", 0)
        if not isinstance(offset, int) or not 0 <= offset < period:
            raise ValueError("config field 'attn_layer_offset' must be in [0, attn_layer_period)")
        kinds = [FULL if i % period == offset else MAMBA for i in range(n)]
        return kinds, f"attn_layer_period {period}, offset {offset}"

    if cfg.get("attention_chunk_size") is not None:
        int_field(cfg, "attention_chunk_size")
        rope = cfg.get("no_rope_layers") or []
        if not rope:
            interval = int_field(cfg, "no_rope_layer_interval", DEFAULT_NO_ROPE_LAYER_INTERVAL)
            rope = [int((i + 1) % interval != 0) for i in range(n)]
        if len(rope) < n:
            raise ValueError(f"config field 'no_rope_layers' must list {n} layers")
        kinds = [CHUNKED if rope[i] else FULL for i in range(n)]
        return kinds, "attention_chunk_size + no_rope_layers (NoPE layers global)"

    pattern_keys = ("sliding_window_pattern", "_sliding_window_pattern")
    pattern_key = next((k for k in pattern_keys if cfg.get(k) is not None), None)
    if pattern_key is not None:
        require_window(cfg)
        p = int_field(cfg, pattern_key)
        kinds = [FULL if (i + 1) % p == 0 else SLIDING for i in range(n)]
        return kinds, f"sliding_window_pattern {p}"

    if cfg.get("model_type") == "gemma2":
        require_window(cfg)
        return [SLIDING if i % 2 == 0 else FULL for i in range(n)], "gemma2 alternation"

    if "use_sliding_window" in cfg:
        if not cfg["use_sliding_window"] or cfg.get("sliding_window") is None:
            return [FULL] * n, "use_sliding_window false"
        first = int_field(cfg, "max_window_layers") if cfg.get("max_window_layers") is not None else 0
        return [SLIDING if i >= first else FULL for i in range(n)], "max_window_layers"

    if cfg.get("sliding_window") is not None:
        require_window(cfg)
        return [SLIDING] * n, "sliding_window on every layer"

    return [FULL] * n, "no window fields (all full attention)"


def require_window(cfg: Mapping[str, Any]) -> int:
    return int_field(cfg, "sliding_window")
