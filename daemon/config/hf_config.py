"""A Hugging Face `config.json` (or a shipped preset) -> `ModelInfo`: per-layer KV specs
grouped into a layout, the longest context, the dtypes and a weight estimate. Field meanings
are `hf_fields`'s, the weight estimate `hf_weights`'s."""

from __future__ import annotations

import dataclasses
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
    LayerKind,
    LayerSpec,
    MLASpec,
    SlidingWindowSpec,
    group_layers,
)
from kvbudget.daemon.core.spec import kv_dtype as parse_kv_dtype
from kvbudget.daemon.config.mamba_state import align_to_state, mamba_state_bytes
from kvbudget.daemon.config.parallel import rank_kv_heads
from kvbudget.daemon.core.budget import token_cap_binds

PRESETS_DIR = Path(__file__).resolve().parent / "presets"
# Tokens per block when none is given: vLLM's default, and for a model with MLA layers
# what vLLM's FlashMLA backend (its MLA default on Hopper GPUs, H100/H200) requires.
DEFAULT_BLOCK_SIZE = 16
MLA_BLOCK_SIZE = 64
# What vLLM's CUTLASS MLA backend (an MLA default on Blackwell GPUs) sets the block size to.
CUTLASS_MLA_BLOCK_SIZE = 128


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
    # The layout is one tensor-parallel rank's of this many (its KV heads and state split).
    tensor_parallel_size: int = 1

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
    tensor_parallel_size: int = 1,
) -> ModelInfo:
    """A preset name ("gemma-3-27b"), a path to a config.json or model folder, or a dict.

    `block_size` None: not given, `default_block_size` picks it (16, 64 for MLA).
    `tensor_parallel_size` > 1: the layout of one rank of such an engine (`model_from_config`)."""
    name, config = read_config(source)
    return model_from_config(
        config, name=name, kv_dtype=kv_dtype, block_size=block_size, token_cap=token_cap,
        tensor_parallel_size=tensor_parallel_size,
    )  # fmt: skip


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


def model_from_config(
    config: Mapping[str, Any],
    *,
    name: str = "",
    kv_dtype: str | None = None,
    block_size: int | None = None,
    token_cap: int | None = None,
    tensor_parallel_size: int = 1,
) -> ModelInfo:
    """`block_size` None: not given; an explicit one is used as given, MLA or not (a Mamba
    hybrid's is still raised so a page holds the state), with a note when vLLM's default
    MLA backend would not use it (`given_block_size_note`).

    With `tensor_parallel_size` tp > 1 the layout is one rank's, built from that rank's
    shapes as vLLM builds it: its KV heads (`rank_kv_heads`), its share of each state
    layer (`mamba_state_bytes`), and a hybrid's block sized on those (`align_to_state`),
    so a hybrid's block size may differ from one GPU's. MLA latents are whole on each rank.
    """
    _check_positive("block_size", block_size)
    _check_positive("token_cap", token_cap)
    _check_positive("tensor_parallel_size", tensor_parallel_size)
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
    tp = tensor_parallel_size
    specs, cached = _layer_specs(cfg, kinds, block_size, cache_dtype, served, token_cap, tp, notes)
    _check_attention_heads(cfg, tp)

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
        tensor_parallel_size=tp,
    )


def _check_positive(name: str, value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_attention_heads(cfg: Mapping[str, Any], tp: int) -> None:
    """vLLM's first check of a layout (here after the KV heads', whose message says more):
    the query heads split evenly, even where the KV heads are replicated."""
    heads = int_field(cfg, "num_attention_heads") if tp > 1 else 1
    if heads % tp:
        raise ValueError(
            f"tensor_parallel_size {tp} does not divide the model's {heads} attention heads "
            "(vLLM refuses such a layout)"
        )


def _layer_specs(
    cfg: Mapping[str, Any], kinds: list[str], block_size: int, cache_dtype: KVDtype, served: KVDtype,
    token_cap: int | None,
    tp: int,
    notes: list[str],
) -> tuple[list[LayerSpec], list[int]]:
    """The spec of each layer that holds a cache on one of `tp` ranks, and those layers'
    indexes; what is worth saying about them goes to `notes`."""
    attention = None
    if set(kinds) & {FULL, SLIDING, CHUNKED}:
        heads = num_kv_heads(cfg)
        attention = AttentionSpec(block_size, rank_kv_heads(heads, tp), head_dim(cfg), cache_dtype)
        if tp > 1:
            notes.append(f"tensor parallel {tp}: one rank holds {attention.num_kv_heads} of {heads} KV heads")

    mamba = None
    if MAMBA in kinds:
        assert attention is not None
        token_page = dataclasses.replace(attention, block_size=1).page_size_bytes
        state = mamba_state_bytes(cfg, served.bits // 8, tp)
        block_size, mamba, mamba_notes = align_to_state(state, token_page, block_size)
        attention = dataclasses.replace(attention, block_size=block_size)
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
        kept = sorted({s.describe() for s in specs if s.kind in (LayerKind.SLIDING, LayerKind.CHUNKED)})
        notes.append(
            f"every attention layer capped at {token_cap} tokens" if not kept else
            f"attention layers capped at {token_cap} tokens, but for {', '.join(kept)}: "
            "a window or chunk no longer than the cap, which never binds there"
        )  # fmt: skip
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
    """The layer's spec; with a cap, capped unless its window or chunk is at most the cap
    (then the cap never binds: `budget.token_cap_binds`)."""
    args = (base.block_size, base.num_kv_heads, base.head_size, base.dtype)
    spec: LayerSpec = base
    if kind == SLIDING:
        spec = SlidingWindowSpec(*args, sliding_window=require_window(cfg))
    elif kind == CHUNKED:
        spec = ChunkedLocalAttentionSpec(*args, attention_chunk_size=int_field(cfg, "attention_chunk_size"))
    extent = getattr(spec, "sliding_window", 0) or getattr(spec, "attention_chunk_size", 0)
    if token_cap is not None and (not extent or token_cap_binds(extent, token_cap)):
        return CappedAttentionSpec(*args, token_cap=token_cap)
    return spec


def _architecture(config: Mapping[str, Any]) -> str:
    archs = config.get("architectures")
    if isinstance(archs, list) and archs:
        return str(archs[0])
    return str(config.get("model_type", ""))
