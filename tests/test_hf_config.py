"""HF config.json -> layer specs, groups, page sizes and weight estimates.

Every page size below is vLLM's: block_size x kv_heads x (head_k + head_v) x dtype bytes,
or block_size x (kv_lora_rank + qk_rope_head_dim) x dtype bytes for MLA; quantised caches
add 4 scale bytes (fp16 scale + zero point) per K or V vector of one head (spec.py).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvbudget.daemon.config.hf_config import (
    load_model,
    mamba_state_bytes,
    model_from_config,
    preset_names,
    read_config,
    resolve_max_model_len,
)
from kvbudget.daemon.core.spec import (
    AttentionSpec,
    CappedAttentionSpec,
    ChunkedLocalAttentionSpec,
    LayerKind,
    MambaSpec,
    MLASpec,
    SlidingWindowSpec,
)

EXPECTED_PRESETS = {
    "llama-3.1-8b", "llama-3.1-70b", "mistral-7b-v0.1", "gemma-2-9b", "gemma-3-27b",
    "gpt-oss-120b", "qwen3-32b", "deepseek-v3", "llama-4-scout", "jamba-v0.1",
}  # fmt: skip


def small_config(**overrides):
    """A 32-layer, 8-KV-head, head-dim-128 bf16 model; page 16 x 8 x 256 x 2 = 65536 B."""
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 32768,
        "vocab_size": 32000,
        "torch_dtype": "bfloat16",
    }
    cfg.update(overrides)
    return {k: v for k, v in cfg.items() if v is not None}


def kinds_of(model):
    return [(g.kind, len(g.layer_ids)) for g in model.layout.groups]


# ------------------------------------------------------------------ presets


def test_all_required_presets_ship():
    assert EXPECTED_PRESETS <= set(preset_names())


@pytest.mark.parametrize("name", sorted(EXPECTED_PRESETS))
def test_every_preset_parses_and_covers_every_layer_once(name):
    model = load_model(name)
    layer_ids = sorted(i for g in model.layout.groups for i in g.layer_ids)
    assert layer_ids == list(range(model.num_layers))
    assert model.max_model_len > 0
    assert all(len(g.layer_ids) <= model.layout.group_size for g in model.layout.groups)


def test_llama_3_1_8b_one_full_group():
    m = load_model("llama-3.1-8b")
    assert kinds_of(m) == [(LayerKind.FULL, 32)]
    # 16 tokens x 8 KV heads x (128 + 128) x 2 bytes = 65536; x 32 layers = 2 MiB per block
    assert m.layout.page_size_bytes == 65536
    assert m.layout.bytes_per_block == 2 * 2**20
    assert m.max_model_len == 131072
    assert m.kv_dtype == "bf16"


def test_llama_3_1_70b_one_full_group_of_80():
    m = load_model("llama-3.1-70b")
    assert kinds_of(m) == [(LayerKind.FULL, 80)]
    assert m.layout.page_size_bytes == 65536  # 16 x 8 x 256 x 2


def test_mistral_slides_on_every_layer():
    m = load_model("mistral-7b-v0.1")
    assert kinds_of(m) == [(LayerKind.SLIDING, 32)]
    assert m.layout.groups[0].spec.sliding_window == 4096
    assert m.max_model_len == 32768


def test_gemma_2_alternates_sliding_and_full():
    m = load_model("gemma-2-9b")
    # 42 layers: even ones slide (W 4096), odd ones are global; 21 = 21 -> group size 21.
    assert kinds_of(m) == [(LayerKind.SLIDING, 21), (LayerKind.FULL, 21)]
    assert m.layout.groups[0].layer_ids == tuple(range(0, 42, 2))
    # head_dim 256: 16 x 8 x (256 + 256) x 2 = 131072 B
    assert m.layout.page_size_bytes == 131072
    # The checkpoint is fp32, served (and cached) in 16 bits as vLLM's dtype=auto does.
    assert m.dtype == "float32" and m.kv_dtype == "bf16"


def test_gemma_3_27b_groups_follow_vllm_rule():
    m = load_model("gemma-3-27b")  # nested text_config
    full = tuple(range(5, 62, 6))  # (i + 1) % 6 == 0: 5, 11, ..., 59
    assert len(full) == 10
    # 62 layers = 52 sliding + 10 full. vLLM: group size = smallest count (10) unless the
    # largest is < 1.5x it (52 is not) -> cdiv(52, 10) = 6 sliding groups, the 52 layers
    # dealt round-robin as vLLM deals them (group j: sliding layers j, j + 6, ...) ->
    # 9, 9, 9, 9, 8, 8; plus 1 full group of 10: 7 groups, all sharing the pool.
    assert m.layout.group_size == 10
    assert kinds_of(m) == [(LayerKind.SLIDING, 9)] * 4 + [(LayerKind.SLIDING, 8)] * 2 + [
        (LayerKind.FULL, 10),
    ]
    sliding = [i for i in range(62) if i not in full]
    assert m.layout.groups[0].layer_ids == tuple(sliding[0::6])
    assert m.layout.groups[-1].layer_ids == full
    assert m.layout.groups[0].spec.sliding_window == 1024
    # 16 x 16 KV heads x (128 + 128) x 2 = 131072 B; x 10 layers = 1310720 B per block
    assert m.layout.page_size_bytes == 131072
    assert m.layout.bytes_per_block == 1310720
    assert m.max_model_len == 131072


def test_gpt_oss_120b_layer_types():
    m = load_model("gpt-oss-120b")
    assert kinds_of(m) == [(LayerKind.SLIDING, 18), (LayerKind.FULL, 18)]
    assert m.layout.groups[0].spec.sliding_window == 128
    assert m.layout.page_size_bytes == 16 * 8 * (64 + 64) * 2  # 32768


def test_qwen3_32b_sliding_window_disabled():
    m = load_model("qwen3-32b")
    assert kinds_of(m) == [(LayerKind.FULL, 64)]
    assert m.max_model_len == 40960


def test_deepseek_v3_mla_page():
    m = load_model("deepseek-v3")
    assert kinds_of(m) == [(LayerKind.MLA, 61)]
    # MLA, 64-token blocks when none is given (vLLM's FlashMLA on Hopper):
    # 64 x (512 + 64) x 2 = 73728 B per layer and block
    assert m.layout.block_size == 64
    assert m.layout.page_size_bytes == 73728
    assert m.layout.bytes_per_block == 73728 * 61
    # fp8: 64 x 576 x 1 = 36864 B
    assert load_model("deepseek-v3", kv_dtype="fp8").layout.page_size_bytes == 36864
    # int4: 576 x 4 bits = 288 B + 4 scale bytes = 292 B per token; x 64 = 18688 B
    assert load_model("deepseek-v3", kv_dtype="int4").layout.page_size_bytes == 18688
    # 16-token blocks when asked for: 16 x 576 x 2 = 18432 B; int4 16 x 292 = 4672 B
    assert load_model("deepseek-v3", block_size=16).layout.page_size_bytes == 18432
    assert load_model("deepseek-v3", kv_dtype="int4", block_size=16).layout.page_size_bytes == 4672


def test_llama_4_scout_nope_layers_global_rest_chunked():
    m = load_model("llama-4-scout")
    # no_rope_layers is empty -> every 4th layer (3, 7, ..., 47) is NoPE = global full
    # attention; the other 36 are chunked local (C 8192). Group size 12 -> 3 + 1 groups.
    assert kinds_of(m) == [(LayerKind.CHUNKED, 12)] * 3 + [(LayerKind.FULL, 12)]
    assert m.layout.groups[-1].layer_ids == tuple(range(3, 48, 4))
    assert m.layout.groups[0].spec.attention_chunk_size == 8192
    assert m.max_model_len == 10485760


def test_jamba_mamba_pages_padded_and_block_raised():
    m = load_model("jamba-v0.1")
    attention_ids = (4, 12, 20, 28)  # i % attn_layer_period 8 == attn_layer_offset 4
    # Mamba state: d_inner = 2 x 4096 = 8192; conv (4 - 1) x 8192 = 24576, ssm 8192 x 16
    # = 131072 elements; (24576 + 131072) x 2 bytes = 311296 B.
    # Attention per token: 8 KV heads x (128 + 128) x 2 = 4096 B. Block raised to
    # 16 x cdiv(311296, 16 x 4096) = 16 x 5 = 80 tokens; page 80 x 4096 = 327680 B >= state.
    assert m.layout.block_size == 80
    assert m.layout.page_size_bytes == 327680
    # 28 mamba + 4 attention layers; group size 4 -> 7 mamba groups + 1 attention group.
    assert m.layout.group_size == 4
    assert kinds_of(m) == [(LayerKind.MAMBA, 4)] * 7 + [(LayerKind.FULL, 4)]
    assert m.layout.groups[-1].layer_ids == attention_ids
    mamba = m.layout.groups[0].spec
    assert isinstance(mamba, MambaSpec)
    assert mamba.state_bytes == 311296 and mamba.page_size_bytes == 327680
    assert mamba.pages_per_request == 1
    assert any("raised from 16 to 80" in note for note in m.layout.notes)
    assert any("padded from 311296 to 327680" in note for note in m.layout.notes)


def test_mamba_state_formula():
    cfg = {"hidden_size": 1024, "mamba_expand": 2, "mamba_d_conv": 4, "mamba_d_state": 16}
    # d_inner 2048: conv 3 x 2048 = 6144, ssm 2048 x 16 = 32768 -> 38912 elements x 2 B
    assert mamba_state_bytes(cfg, 2) == 77824


def test_mamba_block_not_raised_when_already_big_enough():
    cfg = small_config(
        layers_block_type=["mamba", "attention"] * 16,
        mamba_expand=2, mamba_d_conv=4, mamba_d_state=16,
    )  # fmt: skip
    m = model_from_config(cfg, block_size=128)
    # state 311296 B; attention page at block 128: 128 x 4096 = 524288 B >= state -> keep 128
    assert m.layout.block_size == 128
    assert m.layout.page_size_bytes == 524288


# ------------------------------------------------------------------ dtypes and pages


def test_fp8_int4_int2_page_sizes():
    base = 16 * 8  # block x KV heads
    assert load_model("llama-3.1-8b", kv_dtype="fp16").layout.page_size_bytes == base * 256 * 2
    # fp8: 16 x 8 x (128 + 128) x 1 = 32768
    assert load_model("llama-3.1-8b", kv_dtype="fp8").layout.page_size_bytes == 32768
    # int4: each 128-dim vector packs to 64 B + 4 scale bytes = 68 B; 16 x 8 x (68 + 68) = 17408
    assert load_model("llama-3.1-8b", kv_dtype="int4").layout.page_size_bytes == 17408
    # int2: 32 B + 4 = 36 B per vector; 16 x 8 x 72 = 9216
    assert load_model("llama-3.1-8b", kv_dtype="int2").layout.page_size_bytes == 9216


def test_kv_dtype_override_does_not_touch_mamba_state():
    m = load_model("jamba-v0.1", kv_dtype="fp8")
    # Attention per token at fp8: 8 x 256 x 1 = 2048 B; state stays bf16 311296 B ->
    # block 16 x cdiv(311296, 16 x 2048) = 16 x 10 = 160 tokens; page 160 x 2048 = 327680.
    assert m.layout.block_size == 160
    assert m.layout.groups[0].spec.state_bytes == 311296


def test_defaults_kv_heads_and_head_dim():
    m = model_from_config(small_config(num_key_value_heads=None, hidden_size=2048))
    spec = m.layout.groups[0].spec
    assert spec.num_kv_heads == 32  # defaults to num_attention_heads
    assert spec.head_size == 64  # hidden_size 2048 / 32 heads


def test_dtype_key_alias():
    m = model_from_config(small_config(torch_dtype=None, dtype="float16"))
    assert m.kv_dtype == "fp16" and m.dtype == "float16"


def test_block_size_is_used():
    m = model_from_config(small_config(), block_size=32)
    assert m.layout.block_size == 32
    assert m.layout.page_size_bytes == 32 * 8 * 256 * 2


# ------------------------------------------------------------------ layer-kind rules


def test_layer_types_hybrid():
    cfg = small_config(
        layer_types=["sliding_attention", "full_attention"] * 16, sliding_window=4096
    )
    m = model_from_config(cfg)
    assert kinds_of(m) == [(LayerKind.SLIDING, 16), (LayerKind.FULL, 16)]


def test_qwen_max_window_layers_when_enabled():
    cfg = small_config(use_sliding_window=True, sliding_window=4096, max_window_layers=28)
    m = model_from_config(cfg)
    # layers 0..27 full, 28..31 sliding; counts 28 and 4 -> group size 4
    assert kinds_of(m) == [(LayerKind.FULL, 4)] * 7 + [(LayerKind.SLIDING, 4)]


def test_token_cap_turns_every_attention_layer_capped():
    # 512 is under gemma-3's 1024-token window, so the sliding layers are capped too
    # (a cap at or over the window leaves them sliding: test_token_cap_window)
    m = load_model("gemma-3-27b", token_cap=512)
    specs = {g.spec for g in m.layout.groups}
    assert len(specs) == 1
    (spec,) = specs
    assert isinstance(spec, CappedAttentionSpec) and spec.token_cap == 512
    assert m.layout.page_size_bytes == 131072  # the cap changes admission, not the page


def test_token_cap_rejected_for_mla():
    with pytest.raises(ValueError, match="MLA"):
        load_model("deepseek-v3", token_cap=1024)


def test_spec_types():
    assert isinstance(load_model("llama-3.1-8b").layout.groups[0].spec, AttentionSpec)
    assert isinstance(load_model("mistral-7b-v0.1").layout.groups[0].spec, SlidingWindowSpec)
    scout = load_model("llama-4-scout").layout.groups[0].spec
    assert isinstance(scout, ChunkedLocalAttentionSpec)
    assert isinstance(load_model("deepseek-v3").layout.groups[0].spec, MLASpec)


@given(
    n=st.integers(1, 64),
    pattern=st.integers(2, 8),
    heads=st.sampled_from([1, 2, 4, 8, 16]),
)
def test_sliding_window_pattern_property(n, pattern, heads):
    cfg = small_config(
        num_hidden_layers=n, num_key_value_heads=heads, sliding_window=512,
        sliding_window_pattern=pattern,
    )  # fmt: skip
    m = model_from_config(cfg)
    full = {i for g in m.layout.groups if g.kind is LayerKind.FULL for i in g.layer_ids}
    assert full == {i for i in range(n) if (i + 1) % pattern == 0}
    assert m.layout.page_size_bytes == 16 * heads * 256 * 2


# ------------------------------------------------------------------ errors name the key


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"num_hidden_layers": None}, "num_hidden_layers"),
        ({"torch_dtype": None}, "torch_dtype"),
        ({"max_position_embeddings": None}, "max_position_embeddings"),
        ({"num_attention_heads": None}, "num_attention_heads"),
        ({"num_hidden_layers": -2}, "num_hidden_layers"),
        ({"torch_dtype": "float7"}, "torch_dtype"),
        ({"sliding_window_pattern": 6}, "sliding_window"),
        ({"layer_types": ["full_attention"] * 3}, "layer_types"),
        ({"layer_types": ["linear_attention"] * 32}, "layer_types"),
        ({"kv_lora_rank": 512}, "qk_rope_head_dim"),
        ({"hidden_size": 4000, "num_attention_heads": 24}, "head_dim"),
        ({"text_config": 5}, "text_config"),
    ],
)
def test_missing_or_bad_fields_name_the_key(overrides, key):
    with pytest.raises(ValueError, match=key):
        model_from_config(small_config(**overrides))


def test_bad_kv_dtype_and_block_size():
    with pytest.raises(ValueError, match="kv dtype"):
        model_from_config(small_config(), kv_dtype="int3")
    # fp32 is a checkpoint dtype, never a cache dtype (the daemon's config said otherwise)
    with pytest.raises(ValueError, match="unknown kv dtype 'fp32'"):
        model_from_config(small_config(), kv_dtype="fp32")
    with pytest.raises(ValueError, match="torch_dtype"):
        model_from_config(small_config(torch_dtype="int4"))  # a cache dtype, no checkpoint's
    with pytest.raises(ValueError, match="block_size"):
        model_from_config(small_config(), block_size=0)
    with pytest.raises(ValueError, match="token_cap"):
        model_from_config(small_config(), token_cap=-1)


def test_vllm_fp8_cache_names_are_one_byte():
    for name in ("fp8_e4m3", "fp8_e5m2"):
        m = load_model("llama-3.1-8b", kv_dtype=name)
        assert m.kv_dtype == "fp8" and m.layout.page_size_bytes == 32768


def test_max_model_len_past_the_models_positions_is_refused():
    m = load_model("llama-3.1-8b")  # max_position_embeddings 131072
    assert resolve_max_model_len(m, None) == 131072
    assert resolve_max_model_len(m, 4096) == 4096
    assert resolve_max_model_len(m, 131072) == 131072
    with pytest.raises(
        ValueError, match=r"^max_model_len 131073 exceeds the model's max_position_embeddings \(131072\)$"
    ):
        resolve_max_model_len(m, 131073)
    with pytest.raises(ValueError, match="^--max-model-len 200000 exceeds"):
        resolve_max_model_len(m, 200000, name="--max-model-len")
    with pytest.raises(ValueError, match="max_model_len must be a positive integer"):
        resolve_max_model_len(m, 0)


# ------------------------------------------------------------------ sources


def test_unknown_preset_names_the_presets():
    with pytest.raises(ValueError, match="unknown model 'llama-9'.*gemma-3-27b"):
        load_model("llama-9")


def test_config_path_and_folder(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(small_config()))
    by_file = load_model(folder / "config.json")
    by_folder = load_model(str(folder))
    assert by_file.name == by_folder.name == "my-model"
    assert by_file.layout == by_folder.layout


def test_unreadable_config(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_model(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        load_model(bad)


def test_dict_source():
    name, cfg = read_config({"a": 1})
    assert name == "" and cfg == {"a": 1}


# ------------------------------------------------------------------ weights


def test_llama_3_1_8b_parameter_count_exact():
    w = load_model("llama-3.1-8b").weights
    # embeddings: 128256 x 4096 = 525,336,576, untied -> x2 = 1,050,673,152
    # per layer: q+o 2 x 4096 x 32 x 128 = 33,554,432; k+v 2 x 4096 x 8 x 128 = 8,388,608;
    #   MLP 3 x 4096 x 14336 = 176,160,768; norms 2 x 4096 = 8,192 -> 218,112,000; x 32
    #   = 6,979,584,000; final norm 4096. Total 8,030,261,248 (the published count).
    assert w.num_parameters == 8_030_261_248
    assert w.weight_bytes == 2 * 8_030_261_248


@pytest.mark.parametrize(
    ("name", "published"),
    [
        ("llama-3.1-70b", 70.55e9),
        ("mistral-7b-v0.1", 7.24e9),
        ("gemma-2-9b", 9.24e9),
        ("gemma-3-27b", 27.4e9),
        ("qwen3-32b", 32.8e9),
        ("gpt-oss-120b", 116.8e9),
        ("deepseek-v3", 671e9),
        ("llama-4-scout", 109e9),
        ("jamba-v0.1", 51.6e9),
    ],
)
def test_parameter_estimates_within_a_few_percent(name, published):
    w = load_model(name).weights
    assert abs(w.num_parameters - published) / published < 0.03


def test_quantised_weight_bytes():
    oss = load_model("gpt-oss-120b").weights
    # experts 36 x 128 x 3 x 2880 x 2880 = 114.65e9 params at 17/32 B = 60.9 GB, + ~2.1e9
    # other params at 2 B: about 65 GB, the published checkpoint's size.
    assert oss.expert_parameters == 36 * 128 * 3 * 2880 * 2880
    assert 63e9 < oss.weight_bytes < 67e9
    ds = load_model("deepseek-v3").weights
    # fp8 decoder linears (1 B) + bf16 embeddings: ~672 GB for 671e9 parameters
    assert 665e9 < ds.weight_bytes < 680e9
