"""Reading a Hugging Face `config.json`: its fields, and which kind each layer is. Every key
KVBudget reads goes through here, so a missing or malformed field gets the same message,
naming it, wherever it is used."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvbudget.daemon.core.spec import KVDtype, weight_dtype
from kvbudget.daemon.core.spec import kv_dtype as parse_kv_dtype

# Llama 4's default NoPE spacing when `no_rope_layers` is empty.
DEFAULT_NO_ROPE_LAYER_INTERVAL = 4
# More layers than this is a typo or a broken file, not a model (the deepest published
# decoders have about 130); it also bounds every per-layer list built from the count.
MAX_LAYERS = 10_000
# No model dimension, count or length comes near 2^40; past it, a product of a few of
# them would no longer fit the float the weight estimate is computed in.
MAX_FIELD_VALUE = 2**40

FULL, SLIDING, CHUNKED, MLA, MAMBA = "full", "sliding", "chunked", "mla", "mamba"
# A layer with no cache of its own (Nemotron-H's MLP and MoE layers).
NONE = "none"
# "mamba" is any constant-size recurrent state: Mamba 1/2, or a linear-attention layer
# (Qwen3-Next's gated delta net); which one sizes the state is `hf_config`'s business.
_LAYER_TYPE_NAMES = {
    "full_attention": FULL,
    "attention": FULL,
    "sliding_attention": SLIDING,
    "chunked_attention": CHUNKED,
    "mamba": MAMBA,
    "linear_attention": MAMBA,
}
# Nemotron-H's `hybrid_override_pattern` letters.
_PATTERN_KINDS = {"M": MAMBA, "*": FULL, "-": NONE, "E": NONE}


# ------------------------------------------------------------------------ fields
#
# Every reader takes the key's name as the message shows it: `where` prefixes the object a
# nested field sits in ("vision_config."), so the user finds the line to fix.


def _shown(value: object) -> str:
    """A value for a one-line message: a 10,000-entry list must not become the message."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _int_words(minimum: int) -> str:
    return "a positive integer" if minimum == 1 else f"an integer >= {minimum}"


def _checked_int(name: str, value: object, minimum: int, maximum: int) -> int:
    # bool is an int to Python, but `true` in a config is no count.
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(
            f"config field {name!r} must be {_int_words(minimum)}, got {_shown(value)}"
        )
    if value > maximum:
        shown = f"{value:,}" if value < 10**30 else f"a {len(str(value))}-digit number"
        raise ValueError(f"config field {name!r} must be at most {maximum:,}, got {shown}")
    return value


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


def sub_config(cfg: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    """A nested object (`vision_config`, `quantization_config`); None when absent or null."""
    value = cfg.get(key)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(f"config field {key!r} must be an object, got {_shown(value)}")
    return value


def int_field(
    cfg: Mapping[str, Any],
    key: str,
    default: int | None = None,
    *,
    minimum: int = 1,
    maximum: int = MAX_FIELD_VALUE,
    where: str = "",
) -> int:
    """An integer in [minimum, maximum]; `default` when absent or null, else an error."""
    value = cfg.get(key)
    if value is None:
        if default is not None:
            return default
        raise ValueError(f"config field {where + key!r} is missing")
    return _checked_int(where + key, value, minimum, maximum)


def optional_int(
    cfg: Mapping[str, Any],
    key: str,
    *,
    minimum: int = 1,
    maximum: int = MAX_FIELD_VALUE,
    where: str = "",
) -> int | None:
    """An integer in [minimum, maximum], or None when absent or null."""
    value = cfg.get(key)
    return None if value is None else _checked_int(where + key, value, minimum, maximum)


def first_nonzero_int(cfg: Mapping[str, Any], *keys: str) -> int:
    """The first of `keys` set to a non-zero count (aliases across model families), or 0."""
    for key in keys:
        value = optional_int(cfg, key, minimum=0)
        if value:
            return value
    return 0


def bool_field(cfg: Mapping[str, Any], key: str, default: bool) -> bool:
    value = cfg.get(key)
    if value is None:
        return default
    # "false" in quotes is truthy to Python: the opposite of what was written.
    if not isinstance(value, bool):
        raise ValueError(f"config field {key!r} must be true or false, got {_shown(value)}")
    return value


def int_list(cfg: Mapping[str, Any], key: str, *, minimum: int = 0) -> list[int]:
    """A list of integers >= minimum (layer indices); [] when absent or null."""
    value = cfg.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"config field {key!r} must be a list of integers, got {_shown(value)}")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or item < minimum:
            raise ValueError(
                f"config field {key!r} must list integers >= {minimum}, got {_shown(item)}"
            )
    return list(value)


def name_list(cfg: Mapping[str, Any], key: str, n: int, names: Mapping[str, str]) -> list[str]:
    """One name per layer (`layer_types`, `layers_block_type`), mapped through `names`."""
    value = cfg.get(key)
    if not isinstance(value, list) or len(value) != n:
        raise ValueError(f"config field {key!r} must list {n} layers (num_hidden_layers)")
    kinds = []
    for name in value:
        if not isinstance(name, str) or name not in names:
            raise ValueError(f"config field {key!r} has unsupported type {_shown(name)}")
        kinds.append(names[name])
    return kinds


def num_layers(cfg: Mapping[str, Any]) -> int:
    return int_field(cfg, "num_hidden_layers", maximum=MAX_LAYERS)


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
    heads = int_field(cfg, "num_attention_heads")
    kv_heads = int_field(cfg, "num_key_value_heads", default=heads)
    # Each KV head serves a whole group of query heads (GQA; MQA at 1, MHA at all): a count
    # that does not divide the heads is no model Transformers or vLLM loads, and its pages
    # would be sized for one.
    if heads % kv_heads:
        raise ValueError(
            f"config field 'num_key_value_heads' ({kv_heads}) must divide 'num_attention_heads' ({heads})"
        )
    return kv_heads


def checkpoint_dtype(cfg: Mapping[str, Any]) -> str:
    for key in ("torch_dtype", "dtype"):
        value = cfg.get(key)
        if value is not None:
            if not isinstance(value, str):
                raise ValueError(f"config field {key!r} must be a string, got {_shown(value)}")
            return value.removeprefix("torch.")
    raise ValueError("config field 'torch_dtype' (or 'dtype') is missing")


def served_dtype(cfg: Mapping[str, Any]) -> KVDtype:
    """The dtype the engine computes in: fp32 checkpoints are served in 16 bits (vLLM auto)."""
    name = checkpoint_dtype(cfg)
    try:
        dtype = weight_dtype(name)
    except ValueError:
        raise ValueError(f"config field 'torch_dtype' has unsupported value {name!r}") from None
    return parse_kv_dtype("bf16") if dtype.bits > 16 else dtype


# ------------------------------------------------------------------------ layer kinds


def layer_kinds(cfg: Mapping[str, Any]) -> tuple[list[str], str]:
    """Per-layer kind (full, sliding, chunked, mla, mamba) and the rule that decided it: the
    first of the rules below whose fields the config has."""
    n = num_layers(cfg)
    if cfg.get("layer_types"):
        return name_list(cfg, "layer_types", n, _LAYER_TYPE_NAMES), "layer_types"
    if cfg.get("kv_lora_rank") is not None:
        return [MLA] * n, "kv_lora_rank (MLA)"
    return _hybrid_kinds(cfg, n) or _chunked_kinds(cfg, n) or _window_kinds(cfg, n)


def _hybrid_kinds(cfg: Mapping[str, Any], n: int) -> tuple[list[str], str] | None:
    """Attention layers among mamba (or linear attention) layers, by the hybrids' fields."""
    if cfg.get("layers_block_type"):
        names = {"attention": FULL, "mamba": MAMBA}
        return name_list(cfg, "layers_block_type", n, names), "layers_block_type"
    if cfg.get("attn_layer_period") is not None:
        period = int_field(cfg, "attn_layer_period")
        offset = int_field(cfg, "attn_layer_offset", 0, minimum=0)
        if offset >= period:
            raise ValueError("config field 'attn_layer_offset' must be in [0, attn_layer_period)")
        kinds = [FULL if i % period == offset else MAMBA for i in range(n)]
        return kinds, f"attn_layer_period {period}, offset {offset}"
    if cfg.get("hybrid_override_pattern") is not None:
        return _pattern_kinds(cfg, n), "hybrid_override_pattern"
    if cfg.get("attn_layer_indices") is not None:
        attention = set(int_list(cfg, "attn_layer_indices"))
        if any(i >= n for i in attention):
            raise ValueError(f"config field 'attn_layer_indices' must list layers below {n}")
        return [FULL if i in attention else MAMBA for i in range(n)], "attn_layer_indices"
    if cfg.get("full_attention_interval") is not None:
        interval = int_field(cfg, "full_attention_interval", maximum=MAX_LAYERS)
        kinds = [FULL if (i + 1) % interval == 0 else MAMBA for i in range(n)]
        return kinds, f"full_attention_interval {interval} (the rest linear attention)"
    return None


def _chunked_kinds(cfg: Mapping[str, Any], n: int) -> tuple[list[str], str] | None:
    """Chunked attention with NoPE layers global (Llama 4)."""
    if cfg.get("attention_chunk_size") is None:
        return None
    int_field(cfg, "attention_chunk_size")
    rope = _no_rope_layers(cfg)
    if not rope:
        interval = int_field(cfg, "no_rope_layer_interval", DEFAULT_NO_ROPE_LAYER_INTERVAL)
        rope = [int((i + 1) % interval != 0) for i in range(n)]
    if len(rope) < n:
        raise ValueError(f"config field 'no_rope_layers' must list {n} layers")
    kinds = [CHUNKED if rope[i] else FULL for i in range(n)]
    return kinds, "attention_chunk_size + no_rope_layers (NoPE layers global)"


def _window_kinds(cfg: Mapping[str, Any], n: int) -> tuple[list[str], str]:
    """Sliding-window layers by the window fields; all full attention without them."""
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
        if not bool_field(cfg, "use_sliding_window", False):
            return [FULL] * n, "use_sliding_window false"
        if cfg.get("sliding_window") is None:  # (as transformers: no window, nothing slides)
            return [FULL] * n, "use_sliding_window true without a sliding_window (all full attention)"
        # (0 is meaningful: every layer slides.)
        first = int_field(cfg, "max_window_layers", 0, minimum=0)
        return [SLIDING if i >= first else FULL for i in range(n)], "max_window_layers"

    if cfg.get("sliding_window") is not None:
        require_window(cfg)
        return [SLIDING] * n, "sliding_window on every layer"

    return [FULL] * n, "no window fields (all full attention)"


def _pattern_kinds(cfg: Mapping[str, Any], n: int) -> list[str]:
    pattern = cfg.get("hybrid_override_pattern")
    if not isinstance(pattern, str) or len(pattern) != n:
        raise ValueError(
            f"config field 'hybrid_override_pattern' must be a string of {n} letters "
            "(num_hidden_layers)"
        )
    unknown = sorted(set(pattern) - set(_PATTERN_KINDS))
    if unknown:
        raise ValueError(
            f"config field 'hybrid_override_pattern' has unsupported layer letter {unknown[0]!r} "
            "(known: M mamba, * attention, - MLP, E MoE)"
        )
    return [_PATTERN_KINDS[c] for c in pattern]


def _no_rope_layers(cfg: Mapping[str, Any]) -> list[int]:
    """Llama 4's flag per layer: 1 the layer uses RoPE (chunked local), 0 NoPE (global).

    HF writes 0/1; JSON's true/false mean the same. [] when absent, null or empty.
    """
    value = cfg.get("no_rope_layers")
    if value is None:
        return []
    # (bool is an int, so `isinstance(r, int)` lets true/false through on purpose.)
    if not isinstance(value, list) or not all(isinstance(r, int) and r in (0, 1) for r in value):
        raise ValueError(
            f"config field 'no_rope_layers' must be a list of 0/1 flags, got {_shown(value)}"
        )
    return [int(r) for r in value]


def require_window(cfg: Mapping[str, Any]) -> int:
    return int_field(cfg, "sliding_window")
