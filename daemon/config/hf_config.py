"""A Hugging Face `config.json` (or a shipped preset) -> `ModelInfo`: per-layer KV specs
grouped into a layout, the longest context, the dtypes and a weight estimate. Field meanings
are `hf_fields`'s, the weight estimate `hf_weights`'s."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvbudget.daemon.config.hf_fields import (
    CHUNKED,
    FULL,
    MAMBA,
    MLA,
    NONE,
    SLIDING,
    checkpoint_dtype,
    head_dim,
    int_field,
    layer_kinds,
    num_kv_heads,
    require_window,
    served_dtype,
    text_config,
)
from kvbudget.daemon.config.hf_weights import WeightEstimate, estimate_weights
from kvbudget.daemon.core.spec import (
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
from kvbudget.daemon.core.spec import kv_dtype as parse_kv_dtype
from kvbudget.daemon.core.spec import weight_dtype

PRESETS_DIR = Path(__file__).resolve().parent / "presets"
# Tokens per block when none is given: vLLM's default, and for a model with MLA layers
# what vLLM's FlashMLA backend (its MLA default on Hopper GPUs, H100/H200) requires.
DEFAULT_BLOCK_SIZE = 16
MLA_BLOCK_SIZE = 64
# What vLLM's CUTLASS MLA backend (an MLA default on Blackwell GPUs) sets the block size to.
CUTLASS_MLA_BLOCK_SIZE = 128
# vLLM raises the attention block size of Mamba hybrids in steps of this many tokens.
MAMBA_BLOCK_ALIGNMENT = 16


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
    # What the layout's block size needs said: with none given, why the model got one other
    # than 16 (an MLA model's 64); with one given to an MLA model, that vLLM's default MLA
    # backend would replace it (`given_block_size_note`); "" otherwise. Also among the
    # layout's notes; the daemon logs it at start.
    block_size_note: str = ""

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
    except RecursionError:  # ('[' * 100000: the parser recurses per level)
        raise ValueError(f"{path} is not a model config: nested too deeply") from None
    except ValueError:  # (an integer of more digits than int() takes: 4,300 by default)
        raise ValueError(f"{path} is not a model config: a number in it has too many digits") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return data


def load_model(
    source: str | Path | Mapping[str, Any],
    *,
    kv_dtype: str | None = None,
    block_size: int | None = None,
    token_cap: int | None = None,
) -> ModelInfo:
    """A preset name ("gemma-3-27b"), a path to a config.json or model folder, or a dict.

    `block_size` None: not given, `default_block_size` picks it (16, 64 for MLA)."""
    name, config = read_config(source)
    return model_from_config(
        config, name=name, kv_dtype=kv_dtype, block_size=block_size, token_cap=token_cap
    )


def resolve_max_model_len(
    model: ModelInfo, requested: int | None, *, name: str = "max_model_len"
) -> int:
    """The longest request to serve: `requested` (None: the model's own).

    Past the model's max_position_embeddings is refused, as vLLM refuses it (unless told
    VLLM_ALLOW_LONG_MAX_MODEL_LEN): positions the model never saw. `name` is what the
    message calls the setting (`--max-model-len` for a flag). `kvbudget estimate` and the
    daemon's start both ask here, so they accept the same lengths.
    """
    if requested is None:
        return model.max_model_len
    if isinstance(requested, bool) or not isinstance(requested, int) or requested <= 0:
        raise ValueError(f"{name} must be a positive integer, got {requested!r}")
    if requested > model.max_model_len:
        raise ValueError(
            f"{name} {requested} exceeds the model's max_position_embeddings "
            f"({model.max_model_len})"
        )
    return requested


# ------------------------------------------------------------------------ specs


def mamba_state_bytes(cfg: Mapping[str, Any], dtype_bytes: int) -> int:
    """One state layer's conv + recurrent state for one request, in bytes (vLLM's shapes).

    `dtype_bytes` is the model dtype's, which vLLM's mamba_cache_dtype=auto keeps the state
    in, whatever the attention KV cache dtype is. Three kinds of state layer:
    - gated delta net (Qwen3-Next, `linear_num_value_heads`): conv (kernel - 1) x
      (2 x k_heads x k_dim + v_heads x v_dim), recurrent v_heads x k_dim x v_dim;
    - Mamba-2 (Bamba, granite-4.0-h: `mamba_n_heads`; Nemotron-H: `mamba_num_heads`):
      conv (d_conv - 1) x (d_inner + 2 x n_groups x d_state), SSM heads x head_dim x
      d_state; Nemotron-H keeps the SSM state in `mamba_ssm_cache_dtype`, float32 when the
      config does not say (vLLM's default for that model);
    - Mamba-1 (Jamba): d_inner = mamba_expand x hidden_size, conv (d_conv - 1) x d_inner,
      SSM d_inner x d_state.
    """
    if cfg.get("linear_num_value_heads") is not None:
        k_heads = int_field(cfg, "linear_num_key_heads")
        v_heads = int_field(cfg, "linear_num_value_heads")
        k_dim = int_field(cfg, "linear_key_head_dim")
        v_dim = int_field(cfg, "linear_value_head_dim")
        kernel = int_field(cfg, "linear_conv_kernel_dim", 4)
        conv = (kernel - 1) * (2 * k_heads * k_dim + v_heads * v_dim)
        return (conv + v_heads * k_dim * v_dim) * dtype_bytes
    if cfg.get("mamba_num_heads") is not None:  # Nemotron-H's names
        heads, head = int_field(cfg, "mamba_num_heads"), int_field(cfg, "mamba_head_dim")
        d_inner, groups = heads * head, int_field(cfg, "n_groups", 1)
        d_state, d_conv = int_field(cfg, "ssm_state_size"), int_field(cfg, "conv_kernel", 4)
        ssm_name = cfg.get("mamba_ssm_cache_dtype") or "float32"
        try:
            ssm_bytes = weight_dtype(str(ssm_name)).bits // 8
        except ValueError:
            raise ValueError(
                f"config field 'mamba_ssm_cache_dtype' has unsupported value {ssm_name!r}"
            ) from None
        conv = (d_conv - 1) * (d_inner + 2 * groups * d_state)
        return conv * dtype_bytes + heads * head * d_state * ssm_bytes
    if cfg.get("mamba_n_heads") is not None:  # Bamba, granite-4.0-h
        heads, head = int_field(cfg, "mamba_n_heads"), int_field(cfg, "mamba_d_head")
        d_inner = int_field(cfg, "mamba_expand", 2) * int_field(cfg, "hidden_size")
        groups = int_field(cfg, "mamba_n_groups", 1)
        d_state, d_conv = int_field(cfg, "mamba_d_state"), int_field(cfg, "mamba_d_conv", 4)
        conv = (d_conv - 1) * (d_inner + 2 * groups * d_state)
        return (conv + heads * head * d_state) * dtype_bytes
    d_inner = int_field(cfg, "mamba_expand", 2) * int_field(cfg, "hidden_size")
    conv = (int_field(cfg, "mamba_d_conv", 4) - 1) * d_inner
    ssm = d_inner * int_field(cfg, "mamba_d_state", 16)
    return (conv + ssm) * dtype_bytes


def model_from_config(
    config: Mapping[str, Any],
    *,
    name: str = "",
    kv_dtype: str | None = None,
    block_size: int | None = None,
    token_cap: int | None = None,
) -> ModelInfo:
    """`block_size` None: not given; an explicit one is used as given, MLA or not (a Mamba
    hybrid's is still raised so a page holds the state), with a note when vLLM's default
    MLA backend would not use it (`given_block_size_note`)."""
    _check_positive("block_size", block_size)
    _check_positive("token_cap", token_cap)
    cfg = text_config(config)
    kinds, rule = layer_kinds(cfg)
    served = served_dtype(cfg)
    cache_dtype = parse_kv_dtype(kv_dtype) if kv_dtype is not None else served
    notes = [f"layer kinds from {rule}"]
    if not set(kinds) - {MAMBA, NONE}:
        raise ValueError(
            f"config fields make every layer mamba ({rule}): with no attention layer there "
            "is no page to size blocks by"
        )
    if block_size is None:
        block_size, block_size_note = default_block_size(kinds)
    else:
        block_size_note = given_block_size_note(kinds, block_size)
    if block_size_note:
        notes.append(block_size_note)
    specs, cached = _layer_specs(cfg, kinds, block_size, cache_dtype, served, token_cap, notes)

    name = name or str(cfg.get("_name_or_path") or cfg.get("model_type") or "model")
    layout = group_layers(
        specs, model_name=name, notes=tuple(notes), layer_ids=tuple(cached), num_layers=len(kinds)
    )
    return ModelInfo(
        name=name,
        architecture=_architecture(config),
        layout=layout,
        max_model_len=int_field(cfg, "max_position_embeddings"),
        dtype=checkpoint_dtype(cfg),
        kv_dtype=cache_dtype.name,
        weights=estimate_weights(config),
        block_size_note=block_size_note,
    )


def _check_positive(name: str, value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _layer_specs(
    cfg: Mapping[str, Any], kinds: list[str], block_size: int, cache_dtype: KVDtype, served: KVDtype,
    token_cap: int | None,
    notes: list[str],
) -> tuple[list[LayerSpec], list[int]]:
    """The spec of each layer that holds a cache, and those layers' indexes; what is worth
    saying about them goes to `notes`."""
    attention = None
    if set(kinds) & {FULL, SLIDING, CHUNKED}:
        attention = AttentionSpec(
            block_size=block_size,
            num_kv_heads=num_kv_heads(cfg),
            head_size=head_dim(cfg),
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
    cached = [i for i, kind in enumerate(kinds) if kind != NONE]
    if len(cached) < len(kinds):
        notes.append(f"{len(kinds) - len(cached)} layers hold no cache (MLP / MoE only)")
    for kind in (kinds[i] for i in cached):
        if kind == MAMBA:
            assert mamba is not None
            specs.append(mamba)
        elif kind == MLA:
            if token_cap is not None:
                raise ValueError("token_cap applies to K/V attention layers, not MLA latents")
            lora, rope = int_field(cfg, "kv_lora_rank"), int_field(cfg, "qk_rope_head_dim")
            specs.append(MLASpec(block_size, lora, rope, cache_dtype))
        else:
            assert attention is not None
            specs.append(_attention_spec(kind, attention, cfg, token_cap))
    if token_cap is not None:
        notes.append(f"every attention layer capped at {token_cap} tokens")
    return specs, cached


def default_block_size(kinds: list[str]) -> tuple[int, str]:
    """(tokens per block, note) when none is given: DEFAULT_BLOCK_SIZE and no note, or for
    a model with any MLA layer MLA_BLOCK_SIZE and a note that says why.

    vLLM on CUDA serves MLA with a kernel that sets the block size itself: FlashMLA, its
    default on Hopper (the GPUs this tool targets), 64 tokens; CUTLASS MLA, Blackwell's
    default, 128. Sized at 16, the plan's bytes per block, blocks per request and block
    count would all disagree with the engine's.
    """
    if MLA not in kinds:
        return DEFAULT_BLOCK_SIZE, ""
    return MLA_BLOCK_SIZE, (
        f"block size {MLA_BLOCK_SIZE} tokens, as none was given: the model uses MLA, and "
        f"vLLM's FlashMLA backend (its default on Hopper GPUs) uses {MLA_BLOCK_SIZE}; "
        "--block-size 128 (the daemon's block_size = 128) matches CUTLASS MLA on Blackwell"
    )


def given_block_size_note(kinds: list[str], block_size: int) -> str:
    """The note for a block size that was given: "" unless the model has MLA layers and
    vLLM's FlashMLA backend would not keep the size.

    vLLM on CUDA picks the MLA backend's block size even over one the user gave: FlashMLA,
    its default on Hopper, replaces any size that is not a multiple of 64 with 64; CUTLASS
    MLA (a Blackwell default) any that is not a multiple of 128 with 128. The size given is
    still the one planned with (it may be what the engine runs with another backend), but
    the note says that against a default Hopper engine the blocks would not match. Hopper
    is what this tool targets, so multiples of 64 (64, 128, ...) pass without a note.
    """
    if MLA not in kinds or block_size % MLA_BLOCK_SIZE == 0:
        return ""
    return (
        f"block size {block_size} tokens, as given: the model uses MLA, and vLLM's FlashMLA "
        f"backend (its default on Hopper GPUs) would use {MLA_BLOCK_SIZE} instead (CUTLASS MLA "
        f"on Blackwell {CUTLASS_MLA_BLOCK_SIZE}), so the plan's blocks would not match such an "
        "engine's; give the block size the engine really uses"
    )


def _attention_spec(
    kind: str, base: AttentionSpec, cfg: Mapping[str, Any], token_cap: int | None
) -> LayerSpec:
    args = (base.block_size, base.num_kv_heads, base.head_size, base.dtype)
    if token_cap is not None:
        return CappedAttentionSpec(*args, token_cap=token_cap)
    if kind == SLIDING:
        return SlidingWindowSpec(*args, sliding_window=require_window(cfg))
    if kind == CHUNKED:
        return ChunkedLocalAttentionSpec(
            *args, attention_chunk_size=int_field(cfg, "attention_chunk_size")
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
