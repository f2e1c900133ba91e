"""Malformed config.json fields: a one-line error naming the field, never a traceback.

Every `kvbudget estimate --model DIR`, `replay --offline --model DIR` and `daemon
--check-config` reads the model through `hf_config.load_model`, so a field read without a
check (a string where a count belongs, a zero period, an int where a list belongs) was a
TypeError or ZeroDivisionError in all three. The cases below are the ones users hit; the
property test mutates every preset's fields at random and holds the rule for all of them.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvbudget.cli.main import main
from kvbudget.daemon.config.hf_config import PRESETS_DIR, model_from_config, preset_names


def preset(name: str) -> dict[str, Any]:
    return json.loads((PRESETS_DIR / f"{name}.json").read_text())


def mutate(config: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    """A copy of `config` with `path` ("a.b" for a nested field) set to `value`."""
    out = copy.deepcopy(config)
    *parents, key = path.split(".")
    node = out
    for parent in parents:
        if not isinstance(node.get(parent), dict):
            node[parent] = {}
        node = node[parent]
    node[key] = value
    return out


# (preset, {field path: value}, the field the message must name)
CASES = [
    ("mistral-7b-v0.1", {"attention_chunk_size": 8192, "no_rope_layers": 5}, "no_rope_layers"),
    ("mistral-7b-v0.1", {"attention_chunk_size": 8192, "no_rope_layers": ["1"] * 32},
     "no_rope_layers"),
    ("mistral-7b-v0.1", {"layer_types": [["x"]] * 32}, "layer_types"),
    ("mistral-7b-v0.1", {"layers_block_type": [{"a": 1}] * 32}, "layers_block_type"),
    ("mistral-7b-v0.1", {"num_local_experts": "8"}, "num_local_experts"),
    ("deepseek-v3", {"q_lora_rank": "1536"}, "q_lora_rank"),
    ("deepseek-v3", {"moe_intermediate_size": "2048"}, "moe_intermediate_size"),
    ("deepseek-v3", {"n_shared_experts": "1"}, "n_shared_experts"),
    ("deepseek-v3", {"first_k_dense_replace": "3"}, "first_k_dense_replace"),
    ("deepseek-v3", {"moe_layer_freq": 0}, "moe_layer_freq"),
    ("jamba-v0.1", {"expert_layer_period": 0}, "expert_layer_period"),
    ("jamba-v0.1", {"expert_layer_offset": 2}, "expert_layer_offset"),
    ("jamba-v0.1", {"attn_layer_offset": True}, "attn_layer_offset"),
    ("llama-4-scout", {"text_config.interleave_moe_layer_step": 0}, "interleave_moe_layer_step"),
    ("mistral-7b-v0.1", {"num_local_experts": 8, "decoder_sparse_step": "2"}, "decoder_sparse_step"),
    ("mistral-7b-v0.1", {"num_local_experts": 8, "mlp_only_layers": 5}, "mlp_only_layers"),
    ("mistral-7b-v0.1", {"num_local_experts": 8, "mlp_only_layers": ["0"]}, "mlp_only_layers"),
    ("gemma-3-27b", {"vision_config.hidden_size": "1024"}, "vision_config.hidden_size"),
    ("gemma-3-27b", {"vision_config.intermediate_size": -1}, "vision_config.intermediate_size"),
    ("gemma-3-27b", {"vision_config": [1]}, "vision_config"),
    # These two made the weight estimate negative: "weights_bytes must be >= 0", a key
    # the user never set.
    ("mistral-7b-v0.1", {"quantization_config": {"quant_method": "gptq", "bits": -4}},
     "quantization_config.bits"),
    ("gemma-3-27b", {"vision_config.num_hidden_layers": -1000}, "vision_config.num_hidden_layers"),
    ("mistral-7b-v0.1", {"quantization_config": {"quant_method": ["gptq"]}},
     "quantization_config.quant_method"),
    ("mistral-7b-v0.1", {"quantization_config": "gptq"}, "quantization_config"),
    # "false" in quotes counted as true (tied embeddings, half the embedding weights)
    ("mistral-7b-v0.1", {"tie_word_embeddings": "false"}, "tie_word_embeddings"),
    ("qwen3-32b", {"use_sliding_window": "false", "sliding_window": 4096}, "use_sliding_window"),
    # a MemoryError: a list of 10^12 layer kinds
    ("mistral-7b-v0.1", {"num_hidden_layers": 10**12}, "num_hidden_layers"),
    ("mistral-7b-v0.1", {"hidden_size": 10**200}, "hidden_size"),
    # KV heads that do not divide the 32 query heads: more of them, or 5 (pages of 40 KiB)
    ("mistral-7b-v0.1", {"num_key_value_heads": 64}, "num_key_value_heads"),
    ("mistral-7b-v0.1", {"num_key_value_heads": 5}, "num_key_value_heads"),
]  # fmt: skip
CASE_IDS = [f"{p}:{','.join(m)}" for p, m, _ in CASES]


def config_of(name: str, mutations: dict[str, object]) -> dict[str, Any]:
    config = preset(name)
    for path, value in mutations.items():
        config = mutate(config, path, value)
    return config


@pytest.mark.parametrize(("name", "mutations", "field"), CASES, ids=CASE_IDS)
def test_malformed_field_is_a_value_error_naming_it(name, mutations, field):
    with pytest.raises(ValueError, match=f"config field '{field}'"):
        model_from_config(config_of(name, mutations))


def test_layer_count_is_bounded_with_a_clear_message():
    with pytest.raises(ValueError, match=r"'num_hidden_layers' must be at most 10,000, got 1,000,000,000,000"):
        model_from_config(config_of("mistral-7b-v0.1", {"num_hidden_layers": 10**12}))
    assert model_from_config(config_of("mistral-7b-v0.1", {"num_hidden_layers": 10_000})).num_layers == 10_000


def test_values_that_mean_something_are_still_read():
    # 0 is a real value for these: no query compression, no dense layers first, every
    # layer slides; true/false flags for no_rope_layers are HF's 1/0.
    assert model_from_config(config_of("deepseek-v3", {"q_lora_rank": None})).num_layers == 61
    assert model_from_config(config_of("deepseek-v3", {"first_k_dense_replace": 0})).num_layers == 61
    qwen = model_from_config(
        config_of("qwen3-32b", {"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 0})
    )
    assert {g.kind.value for g in qwen.layout.groups} == {"sliding_window"}
    flags = [True, True, True, False] * 12
    scout = model_from_config(config_of("llama-4-scout", {"text_config.no_rope_layers": flags}))
    assert scout.layout == model_from_config(preset("llama-4-scout")).layout


def estimate(config: dict[str, Any], *source: str) -> tuple[int, str, str]:
    """`kvbudget estimate --json` in-process on `config`: (exit code, stdout, stderr).

    An exception other than the CLI's own one-line errors escapes `main` and fails the test.
    """
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps(config))
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["estimate", "--model", folder, *source, "--json"])
    return code, out.getvalue(), err.getvalue()


SOURCES = (("--gpu-memory-bytes", "1000GB"), ("--num-gpu-blocks", "10"))


@pytest.mark.parametrize(("name", "mutations", "field"), CASES, ids=CASE_IDS)
@pytest.mark.parametrize("source", SOURCES, ids=lambda s: s[0])
def test_estimate_says_it_in_one_line(name, mutations, field, source):
    code, out, err = estimate(config_of(name, mutations), *source)
    assert code == 2 and out == ""
    (line,) = err.splitlines()
    assert line.startswith(f"kvbudget estimate: error: config field '{field}'")


def run_kvbudget(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvbudget", *args],
        capture_output=True, text=True, timeout=120, check=False, cwd=cwd,
    )  # fmt: skip


def test_daemon_check_config_and_offline_replay_say_it_in_one_line(tmp_path):
    folder = tmp_path / "x"
    folder.mkdir()
    bad = config_of("mistral-7b-v0.1", {"attention_chunk_size": 8192, "no_rope_layers": 5})
    (folder / "config.json").write_text(json.dumps(bad))
    daemon = run_kvbudget(
        "daemon", "--check-config", "--model", str(folder), "--num-gpu-blocks", "100",
        "--listen", f"unix://{tmp_path}/k.sock", "--db-path", str(tmp_path / "d.db"), cwd=tmp_path,
    )  # fmt: skip
    replay = run_kvbudget("replay", "--offline", "mooncake", "--model", str(folder), "--limit", "5", cwd=tmp_path)
    for result, command in ((daemon, "daemon"), (replay, "replay")):
        assert result.returncode == 2, result.stderr
        (line,) = result.stderr.splitlines()
        assert line.startswith(f"kvbudget {command}: error: ")
        assert "config field 'no_rope_layers' must be a list of 0/1 flags, got 5" in line


# ------------------------------------------------------------------ property

# Every field the readers look at (hf_fields, hf_config, hf_weights), nested ones dotted.
FIELDS = (
    "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
    "head_dim", "intermediate_size", "intermediate_size_mlp", "moe_intermediate_size",
    "vocab_size", "max_position_embeddings", "torch_dtype", "dtype", "tie_word_embeddings",
    "layer_types", "layers_block_type", "sliding_window", "sliding_window_pattern",
    "_sliding_window_pattern", "use_sliding_window", "max_window_layers", "model_type",
    "attention_chunk_size", "no_rope_layers", "no_rope_layer_interval", "attn_layer_period",
    "attn_layer_offset", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim",
    "qk_nope_head_dim", "v_head_dim", "mamba_expand", "mamba_d_conv", "mamba_d_state",
    "mamba_dt_rank", "n_routed_experts", "num_local_experts", "num_experts",
    "n_shared_experts", "num_shared_experts", "first_k_dense_replace", "moe_layer_freq",
    "expert_layer_period", "expert_layer_offset", "interleave_moe_layer_step",
    "mlp_only_layers", "decoder_sparse_step", "architectures", "_name_or_path",
    "text_config", "vision_config", "quantization_config",
    "vision_config.hidden_size", "vision_config.intermediate_size",
    "vision_config.num_hidden_layers", "quantization_config.quant_method",
    "quantization_config.bits",
)  # fmt: skip

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([0, 1, 2, 3, 4, 8, 16, 32, 64, 4096, -1, -4, -1000, 10**4, 10**12, 2**40, 2**63]),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(
        ["8", "", "x", "full_attention", "sliding_attention", "mamba", "attention",
         "bfloat16", "float32", "fp8", "mxfp4", "gptq", "gemma2", "llama4"]
    ),
)  # fmt: skip
values = st.one_of(
    scalars,
    st.lists(scalars, max_size=5),
    st.lists(st.sampled_from([0, 1, True, False, "full_attention", "sliding_attention", "mamba"]),
             min_size=30, max_size=66),
    st.lists(st.lists(scalars, max_size=2), max_size=3),
    st.dictionaries(st.sampled_from(["hidden_size", "bits", "quant_method", "num_hidden_layers"]),
                    scalars, max_size=3),
)  # fmt: skip


@st.composite
def mutated_presets(draw) -> dict[str, Any]:
    config = preset(draw(st.sampled_from(preset_names())))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(FIELDS))
        # Gemma 3 and Llama 4 keep the language model's fields in text_config.
        if "text_config" in config and "." not in path and draw(st.booleans()):
            path = f"text_config.{path}"
        if draw(st.integers(0, 9)) == 0:
            config = copy.deepcopy(config)
            *parents, key = path.split(".")
            node = config
            for parent in parents:
                node = node.get(parent) if isinstance(node.get(parent), dict) else {}
            node.pop(key, None)
        else:
            config = mutate(config, path, draw(values))
    return config


# A pool too small for the weights, or for one block, is an answer (exit 2, naming it).
SIZING_ANSWERS = ("no memory left for the KV cache", "for the KV cache is less than one block")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=mutated_presets(), source=st.sampled_from(SOURCES))
def test_mutated_presets_give_a_field_error_or_a_result(config, source):
    try:
        model = model_from_config(config)
    except ValueError as exc:
        assert "config field" in str(exc), str(exc)
        model = None
    if model is not None:
        assert model.weights.weight_bytes >= 0 and model.weights.num_parameters > 0
    code, out, err = estimate(config, *source)
    if code == 0:
        report = json.loads(out)
        assert report["num_blocks"] >= 1 and report["kv_tokens"] >= 0
        assert report["sizing"]["kv_tokens"] == report["kv_tokens"]
        return
    assert code == 2 and out == ""
    (line,) = err.splitlines()
    assert line.startswith("kvbudget estimate: error: ")
    assert "config field" in line or any(answer in line for answer in SIZING_ANSWERS), line
