"""`kvbudget estimate --tensor/pipeline/data-parallel-size` as the user runs it (a subprocess).

Every figure is computed by hand in the comments, from vLLM's rules: KV heads per rank
max(1, heads // tp) (MLA's latent on every rank), each pipeline stage only its layers
(get_pp_indices: even split, the remainder to the stages before the last), and
num_gpu_blocks the same on every worker: the minimum over them, that is the memory per GPU
over the bytes per block of the fullest stage.
"""

from __future__ import annotations

from test_estimate_cli import run, run_json
from test_estimate_cli import write_config as write_llama_config

# A small model whose figures are easy by hand: 10 layers, 16 query and 4 KV heads of 64.
SMALL = {
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_hidden_layers": 10,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "max_position_embeddings": 8192,
}


def write_config(tmp_path, **overrides) -> str:
    return write_llama_config(tmp_path, **{**SMALL, **overrides})


def test_the_issues_worked_example_llama_70b_tp4():
    # 8 KV heads / 4 ranks = 2 x 128 dims, 80 layers: 80 x 2 (K, V) x 16 x 2 x 128 x 2 B
    # = 1,310,720 B per block; 20e9 // 1,310,720 = 15,258 blocks; a 32,768-token request
    # holds 2,048 blocks: 15,258 / 2,048 = 7.45 at once.
    args = ("--model", "llama-3.1-70b", "--tensor-parallel-size", "4", "--kv-cache-memory-bytes", "20e9")
    out = run_json(*args, "--max-model-len", "32768")
    assert out["bytes_per_block"] == 1_310_720 and out["num_blocks"] == 15_258
    assert out["parallel"]["kv_heads_per_rank"] == [2]
    assert round(out["vllm_max_concurrency"], 2) == 7.45
    text = run(*args, "--max-model-len", "32768").stdout
    assert "1,310,720 B" in text and "15,258" in text and "7.45" in text
    # The command exactly as the issue gives it says the block and the pool too.
    plain = run(*args)
    assert plain.returncode == 0, plain.stderr
    assert "1,310,720 B" in plain.stdout and "15,258 blocks" in plain.stdout


def test_tp_beyond_the_kv_heads_replicates_them(tmp_path):
    # 4 KV heads on 8 ranks: one whole head per rank (replicated), as on 4 ranks.
    # page 16 x 1 x (64 + 64) x 2 B = 4,096 B; 10 layers: 40,960 B per block.
    path = write_config(tmp_path)
    for tp in ("4", "8"):
        out = run_json("--model", path, "--tensor-parallel-size", tp, "--kv-cache-memory-bytes", "1e9")
        assert out["parallel"]["kv_heads_per_rank"] == [1]
        assert out["bytes_per_block"] == 40_960
        assert out["num_blocks"] == 10**9 // 40_960  # 24,414


def test_tp_that_splits_no_head_evenly_is_one_line(tmp_path):
    result = run("--model", write_config(tmp_path), "--tensor-parallel-size", "3", "--kv-cache-memory-bytes", "1e9")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "--tensor-parallel-size 3" in result.stderr


def test_pp_pool_is_the_fullest_stage(tmp_path):
    # 10 layers on 4 stages: 2, 3, 3, 2 (vLLM gives the remainder to the stages before the
    # last). Page 16 x 4 x 128 x 2 B = 16,384 B; the fullest stage's block 3 x 16,384
    # = 49,152 B; 1e9 // 49,152 = 20,345 blocks on every GPU.
    out = run_json("--model", write_config(tmp_path), "--pipeline-parallel-size", "4", "--kv-cache-memory-bytes", "1e9")
    p = out["parallel"]
    assert p["stage_layers"] == [[0, 1], [2, 4], [5, 7], [8, 9]]
    assert p["stage_group_sizes"] == [2, 3, 3, 2]
    assert out["bytes_per_block"] == 49_152 and out["num_blocks"] == 20_345
    # the engine's block: a page per layer across its stages, 10 x 16,384
    assert p["bytes_per_block_per_engine"] == 163_840
    # a request's blocks do not depend on the stages: 8,192 tokens = 512 blocks
    assert out["blocks_per_request"] == 512


def test_sliding_window_tp_and_pp(tmp_path):
    # 6 layers, sliding / full alternating: two groups of 3 (sliding 0, 2, 4; full 1, 3, 5).
    # TP 2: 2 KV heads per rank, page 16 x 2 x 128 x 2 B = 8,192 B. PP 2: stages 0-2 and
    # 3-5; stage 0 holds sliding 0, 2 and full 1, stage 1 sliding 4 and full 3, 5: 2 layers
    # of a group each, so a block is 2 x 8,192 = 16,384 B; 1e9 // 16,384 = 61,035.
    path = write_config(
        tmp_path, num_hidden_layers=6, sliding_window=1024,
        layer_types=["sliding_attention", "full_attention"] * 3,
    )  # fmt: skip
    out = run_json(
        "--model", path, "--tensor-parallel-size", "2", "--pipeline-parallel-size", "2",
        "--kv-cache-memory-bytes", "1e9", "--max-model-len", "8192",
    )  # fmt: skip
    assert out["page_size_bytes"] == 8_192 and out["group_size"] == 2
    assert out["bytes_per_block"] == 16_384 and out["num_blocks"] == 61_035
    assert out["parallel"]["stage_group_sizes"] == [2, 2]
    # per request the groups are the model's: full 8,192 / 16 = 512 blocks; sliding holds
    # the window's blocks (as without parallelism)
    single = run_json("--model", path, "--kv-cache-memory-bytes", "1e9", "--max-model-len", "8192")
    assert out["blocks_per_request"] == single["blocks_per_request"]
    assert [g["blocks_per_request"] for g in out["groups"]] == [g["blocks_per_request"] for g in single["groups"]]


def test_mla_latent_is_replicated_on_every_rank():
    # DeepSeek-V3: one latent of 512 + 64 = 576 values x 2 B per token and layer, block 64:
    # a page of 73,728 B whatever the TP. 61 layers on 2 stages: 31 and 30, so a block is
    # 31 x 73,728 = 2,285,568 B; 80e9 // 2,285,568 = 35,002 blocks.
    base = ("--model", "deepseek-v3", "--kv-cache-memory-bytes", "80e9")
    tp8 = run_json(*base, "--tensor-parallel-size", "8")
    assert tp8["page_size_bytes"] == 73_728 and tp8["bytes_per_block"] == 61 * 73_728
    out = run_json(*base, "--tensor-parallel-size", "8", "--pipeline-parallel-size", "2")
    assert out["parallel"]["stage_layers"] == [[0, 30], [31, 60]]
    assert out["bytes_per_block"] == 2_285_568 and out["num_blocks"] == 35_002


def test_data_parallel_engines_have_separate_pools():
    args = ("--model", "llama-3.1-70b", "--tensor-parallel-size", "4", "--kv-cache-memory-bytes", "20e9")
    out = run_json(*args, "--data-parallel-size", "2", "--max-model-len", "32768")
    p = out["parallel"]
    # the pool is one engine's, the same as with one replica; the engines only add up
    assert out["num_blocks"] == p["num_blocks_per_engine"] == 15_258
    assert p["gpus"] == 8 and p["num_blocks_all_engines"] == 30_516
    assert p["kv_cache_bytes_per_engine"] == 80 * 10**9
    text = run(*args, "--data-parallel-size", "2").stdout
    assert "2 engines, each with its own pool" in text and "per GPU" in text and "per engine" in text


def test_weights_per_rank_size_the_pool_from_gpu_memory(tmp_path):
    # --weights-bytes is one GPU's: 141e9 x 0.9 - 40e9 = 86.9e9 for the KV cache per GPU.
    out = run_json(
        "--model", "llama-3.1-70b", "--tensor-parallel-size", "4", "--gpu-memory-bytes", "141e9",
        "--weights-bytes", "40e9",
    )  # fmt: skip
    assert out["sizing"]["kv_cache_bytes"] == 86_900_000_000
    assert out["num_blocks"] == 86_900_000_000 // 1_310_720
    # estimated: the model's weights split over the 4 GPUs (the issue: 141 GB on one GPU
    # left nothing; on 4 it fits)
    est = run_json("--model", "llama-3.1-70b", "--tensor-parallel-size", "4", "--gpu-memory-bytes", "80e9")
    assert est["sizing"]["weights_bytes"] == -(-est["estimated_weight_bytes"] // 4)


def test_bad_parallel_sizes_are_one_line(tmp_path):
    for flag, value in (
        ("--tensor-parallel-size", "0"), ("--data-parallel-size", "x"),
        ("--pipeline-parallel-size", "11"),
    ):  # fmt: skip
        result = run("--model", write_config(tmp_path), flag, value, "--kv-cache-memory-bytes", "1e9")
        assert result.returncode != 0 and result.stderr.count("\n") == 1, result.stderr
        assert flag in result.stderr and "Traceback" not in result.stderr
