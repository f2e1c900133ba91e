"""The weights' memory, estimated from a Hugging Face config's fields alone.

Sizing a pool from GPU memory (`kvbudget estimate`, the daemon without `num_gpu_blocks`
or `kv_cache_memory_bytes`) subtracts it from what the KV cache may take, where vLLM
would measure it in a profiling run, unless `weights_bytes` is given: parameters x the
served dtype, quantised linears at their bits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvbudget.daemon.config.hf_fields import (
    MAMBA,
    MAX_LAYERS,
    MLA,
    NONE,
    bool_field,
    first_nonzero_int,
    head_dim,
    int_field,
    int_list,
    layer_kinds,
    num_kv_heads,
    optional_int,
    served_dtype,
    sub_config,
    text_config,
)

# Quantised linears above 32 bits are no quantisation; below 1 bit, no weights.
MAX_QUANT_BITS = 32


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
                  (dt_rank + 2 d_state), dt_proj dt_rank x d_inner, A and D, out_proj;
                  Mamba-2: in_proj hidden x (d_inner + conv_dim + heads), conv, out_proj;
                  gated delta net: in_proj q, k, v, z, b, a, conv, out_proj
      no-cache    Nemotron-H's MLP / MoE layers have no mixer (and its mixers no MLP)
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


def estimate_weights(config: Mapping[str, Any]) -> WeightEstimate:
    """Every field read here is checked (hf_fields), so each term is >= 0 and the estimate
    never blames `weights_bytes` for a field the user wrote wrong."""
    cfg = text_config(config)
    kinds, _ = layer_kinds(cfg)
    hidden = int_field(cfg, "hidden_size")
    vocab = int_field(cfg, "vocab_size")

    embed = vocab * hidden * (1 if bool_field(cfg, "tie_word_embeddings", False) else 2)
    attention = mamba = dense = experts = other = 0
    moe = _moe_layers(cfg, len(kinds))
    # Nemotron-H: a layer is a mixer (M, *) or a feed-forward block (-, E), never both.
    pattern = cfg.get("hybrid_override_pattern")
    for i, kind in enumerate(kinds):
        other += 2 * hidden
        if kind == MLA:
            attention += _mla_params(cfg)
        elif kind == MAMBA:
            mamba += _mamba_params(cfg)
        elif kind != NONE:
            heads, kv, hd = int_field(cfg, "num_attention_heads"), num_kv_heads(cfg), head_dim(cfg)
            attention += 2 * hidden * heads * hd + 2 * hidden * kv * hd
        if isinstance(pattern, str) and pattern[i] in "M*":
            continue
        is_moe = pattern[i] == "E" if isinstance(pattern, str) else moe[i]
        layer_dense, layer_experts = _mlp_params(cfg, is_moe)
        dense += layer_dense
        experts += layer_experts
    other += hidden  # final norm
    other += _vision_params(config)

    served = served_dtype(cfg).bits / 8
    linear_bytes, expert_bytes, note = _bytes_per_weight(config, cfg)

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


def _bytes_per_weight(config: Mapping[str, Any], cfg: Mapping[str, Any]) -> tuple[float, float, str]:
    """(bytes per decoder linear weight, per expert weight, note): the served dtype's, or
    what `quantization_config` says."""
    served = served_dtype(cfg).bits / 8
    linear_bytes, expert_bytes, note = served, served, f"{served_dtype(cfg).name} weights"
    quant = sub_config(config, "quantization_config") or sub_config(cfg, "quantization_config")
    if quant is not None:
        method = quant.get("quant_method") or ""
        if not isinstance(method, str):
            raise ValueError(
                "config field 'quantization_config.quant_method' must be a string, "
                f"got {type(method).__name__}"
            )
        if method == "fp8":
            linear_bytes = expert_bytes = 1.0
            note = "fp8 decoder linears, 16-bit embeddings"
        elif method == "mxfp4":
            expert_bytes = 17 / 32
            note = "mxfp4 experts (4.25 bits), 16-bit rest"
        elif (bits := _quant_bits(quant)) is not None:
            linear_bytes = expert_bytes = bits / 8
            note = f"{bits}-bit {method or 'quantised'} decoder linears"
        else:
            note = f"unknown quant_method {method!r}: counted at {served_dtype(cfg).name}"
    return linear_bytes, expert_bytes, note


def _quant_bits(quant: Mapping[str, Any]) -> int | None:
    """gptq/awq's `bits` per quantised weight; None when the config does not say."""
    return optional_int(quant, "bits", maximum=MAX_QUANT_BITS, where="quantization_config.")


def _mla_params(cfg: Mapping[str, Any]) -> int:
    hidden, heads = int_field(cfg, "hidden_size"), int_field(cfg, "num_attention_heads")
    rope, nope = int_field(cfg, "qk_rope_head_dim"), int_field(cfg, "qk_nope_head_dim")
    v, lora = int_field(cfg, "v_head_dim"), int_field(cfg, "kv_lora_rank")
    # null or 0: queries are not compressed (DeepSeek V2-Lite)
    q_lora = optional_int(cfg, "q_lora_rank", minimum=0)
    q_out = heads * (nope + rope)
    q = hidden * q_lora + q_lora * q_out if q_lora else hidden * q_out
    kv = hidden * (lora + rope) + lora * heads * (nope + v)
    return q + kv + heads * v * hidden


def _mamba_params(cfg: Mapping[str, Any]) -> int:
    hidden = int_field(cfg, "hidden_size")
    if cfg.get("linear_num_value_heads") is not None:  # gated delta net (Qwen3-Next)
        k_heads = int_field(cfg, "linear_num_key_heads")
        v_heads = int_field(cfg, "linear_num_value_heads")
        k_dim = int_field(cfg, "linear_key_head_dim")
        v_dim = int_field(cfg, "linear_value_head_dim")
        keys, values = k_heads * k_dim, v_heads * v_dim
        conv = (2 * keys + values) * int_field(cfg, "linear_conv_kernel_dim", 4)
        # in_proj q, k, v, z and the b, a gates; conv; out_proj
        return hidden * (2 * keys + 2 * values + 2 * v_heads) + conv + values * hidden
    if cfg.get("mamba_num_heads") is not None or cfg.get("mamba_n_heads") is not None:  # Mamba-2
        nemotron = cfg.get("mamba_num_heads") is not None
        heads = int_field(cfg, "mamba_num_heads" if nemotron else "mamba_n_heads")
        head = int_field(cfg, "mamba_head_dim" if nemotron else "mamba_d_head")
        d_inner = heads * head if nemotron else int_field(cfg, "mamba_expand", 2) * hidden
        groups = int_field(cfg, "n_groups" if nemotron else "mamba_n_groups", 1)
        d_state = int_field(cfg, "ssm_state_size" if nemotron else "mamba_d_state")
        d_conv = int_field(cfg, "conv_kernel" if nemotron else "mamba_d_conv", 4)
        conv_dim = d_inner + 2 * groups * d_state
        # in_proj z, xBC, dt; conv; A, D, dt_bias; gated norm; out_proj
        in_proj = hidden * (d_inner + conv_dim + heads)
        return in_proj + conv_dim * d_conv + 3 * heads + d_inner * (1 + hidden)
    d_inner = int_field(cfg, "mamba_expand", 2) * hidden
    d_state, d_conv = int_field(cfg, "mamba_d_state", 16), int_field(cfg, "mamba_d_conv", 4)
    dt_rank = int_field(cfg, "mamba_dt_rank", math.ceil(hidden / 16))
    return (
        hidden * 2 * d_inner
        + d_inner * d_conv
        + d_inner * (dt_rank + 2 * d_state)
        + dt_rank * d_inner
        + d_inner * d_state
        + d_inner
        + d_inner * hidden
    )


def _mlp_params(cfg: Mapping[str, Any], is_moe: bool) -> tuple[int, int]:
    """(dense parameters, expert parameters) of one layer's feed-forward block."""
    hidden = int_field(cfg, "hidden_size")
    if not is_moe:
        # Llama 4 calls its dense layers' width intermediate_size_mlp (intermediate_size
        # is the expert width there).
        width = optional_int(cfg, "intermediate_size_mlp") or int_field(cfg, "intermediate_size")
        return 3 * hidden * width, 0
    num_experts = _num_experts(cfg)
    width = optional_int(cfg, "moe_intermediate_size") or int_field(cfg, "intermediate_size")
    shared = first_nonzero_int(cfg, "n_shared_experts", "num_shared_experts")
    if cfg.get("model_type") in ("llama4_text", "llama4"):
        shared = 1  # every Llama 4 MoE layer has one shared expert
    router = hidden * num_experts
    return 3 * hidden * width * shared + router, 3 * hidden * width * num_experts


def _num_experts(cfg: Mapping[str, Any]) -> int:
    return first_nonzero_int(cfg, "n_routed_experts", "num_local_experts", "num_experts")


def _moe_layers(cfg: Mapping[str, Any], n: int) -> list[bool]:
    """Which of the `n` layers have a mixture of experts for a feed-forward block."""
    if _num_experts(cfg) <= 1:
        return [False] * n
    first_dense = optional_int(cfg, "first_k_dense_replace", minimum=0, maximum=MAX_LAYERS)
    if first_dense is not None:  # DeepSeek
        freq = int_field(cfg, "moe_layer_freq", 1, maximum=MAX_LAYERS)
        return [i >= first_dense and i % freq == 0 for i in range(n)]
    period = optional_int(cfg, "expert_layer_period", maximum=MAX_LAYERS)
    if period is not None:  # Jamba
        offset = int_field(cfg, "expert_layer_offset", 0, minimum=0)
        if offset >= period:
            raise ValueError(
                "config field 'expert_layer_offset' must be in [0, expert_layer_period)"
            )
        return [i % period == offset for i in range(n)]
    step = optional_int(cfg, "interleave_moe_layer_step", maximum=MAX_LAYERS)
    if step is not None:  # Llama 4
        return [(i + 1) % step == 0 for i in range(n)]
    dense_only = set(int_list(cfg, "mlp_only_layers"))  # Qwen MoE
    step = int_field(cfg, "decoder_sparse_step", 1, maximum=MAX_LAYERS)
    return [i not in dense_only and (i + 1) % step == 0 for i in range(n)]


def _vision_params(config: Mapping[str, Any]) -> int:
    """A ViT tower: layers x (4 h^2 attention + 2 h i MLP); small next to the LM."""
    vision = sub_config(config, "vision_config")
    where = "vision_config."
    h = optional_int(vision, "hidden_size", where=where) if vision is not None else None
    if vision is None or h is None:
        return 0
    i = int_field(vision, "intermediate_size", 4 * h, where=where)
    layers = int_field(vision, "num_hidden_layers", 0, minimum=0, maximum=MAX_LAYERS, where=where)
    return layers * (4 * h * h + 2 * h * i)
