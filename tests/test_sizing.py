"""Pool sizing from GPU memory, explicit bytes or a block count, and the concurrency it buys.

Hand-computed cases (issue #2): max concurrency for full attention, all-SWA and a
half/half hybrid at max_model_len 16384, F = 1024, block 16; max_model_len "auto" for a
32-layer, 32-KV-head, head-dim-128 fp16 model in 8 GiB.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvbudget.daemon.core import budget
from kvbudget.daemon.config.hf_config import load_model, model_from_config
from kvbudget.daemon.config.sizing import (
    SOURCE_BLOCKS,
    SOURCE_GPU,
    SOURCE_KV_BYTES,
    kv_tokens,
    memory_source_conflict,
    size_from_gpu_memory,
    size_from_kv_cache_bytes,
    size_from_num_blocks,
    size_pool,
)

GiB = 2**30
L, F = 16384, 1024


def config(num_kv_heads=8, dtype="bfloat16", **extra):
    cfg = {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": num_kv_heads,
        "max_position_embeddings": 32768,
        "vocab_size": 32000,
        "torch_dtype": dtype,
    }
    cfg.update(extra)
    return cfg


FULL = model_from_config(config()).layout
ALL_SWA = model_from_config(config(sliding_window=4096)).layout
HALF_HALF = model_from_config(
    config(layer_types=["sliding_attention", "full_attention"] * 16, sliding_window=4096)
).layout


# ------------------------------------------------------------------ hand-computed


def test_full_attention_concurrency():
    # page 16 x 8 x (128 + 128) x 2 = 65536 B; 32 layers in one group -> 2 MiB per block
    pool = size_from_kv_cache_bytes(FULL, 8 * GiB)
    assert pool.bytes_per_block == 2 * 2**20
    assert pool.num_blocks == 4096  # 8 GiB / 2 MiB
    # per request: cdiv(16384, 16) = 1024 blocks -> 4096 / 1024 = 4.0 requests
    assert budget.request_worst_case(FULL, L, F).total == 1024
    assert budget.max_concurrency(pool.num_blocks, FULL, L, F) == 4.0
    assert budget.naive_max_concurrency(pool.num_blocks, FULL, L) == 4.0


def test_all_sliding_window_concurrency():
    pool = size_from_kv_cache_bytes(ALL_SWA, 8 * GiB)
    assert pool.num_blocks == 4096  # same page and group size as full attention
    # per request: cdiv(min(4095 + 1024, 16384), 16) + 1 = cdiv(5119, 16) + 1 = 320 + 1 = 321
    assert budget.request_worst_case(ALL_SWA, L, F).per_group == (321,)
    assert budget.max_concurrency(pool.num_blocks, ALL_SWA, L, F) == pytest.approx(4096 / 321)
    assert 4096 / 321 == pytest.approx(12.760, abs=1e-3)
    # naive: every layer charged 1024 blocks -> 4.0
    assert budget.naive_max_concurrency(pool.num_blocks, ALL_SWA, L) == 4.0


def test_half_half_hybrid_concurrency():
    # 16 sliding + 16 full layers -> group size 16, two groups; block = 65536 x 16 = 1 MiB
    pool = size_from_kv_cache_bytes(HALF_HALF, 8 * GiB)
    assert HALF_HALF.group_size == 16 and HALF_HALF.num_groups == 2
    assert pool.bytes_per_block == 2**20
    assert pool.num_blocks == 8192  # 8 GiB / 1 MiB
    # per request: sliding group 321 + full group 1024 = 1345 -> 8192 / 1345 = 6.0907...
    assert budget.request_worst_case(HALF_HALF, L, F).per_group == (321, 1024)
    assert budget.max_concurrency(pool.num_blocks, HALF_HALF, L, F) == pytest.approx(8192 / 1345)
    assert 8192 / 1345 == pytest.approx(6.0907, abs=1e-4)
    # naive: 1024 + 1024 = 2048 -> 8192 / 2048 = 4.0
    assert budget.naive_max_concurrency(pool.num_blocks, HALF_HALF, L) == 4.0


def test_max_model_len_auto_32_layers_32_heads_fp16_in_8_gib():
    layout = model_from_config(config(num_kv_heads=32, dtype="float16")).layout
    # page 16 x 32 x (128 + 128) x 2 = 262144 B = 256 KiB; x 32 layers = 8 MiB per block
    assert layout.page_size_bytes == 256 * 2**10
    pool = size_from_kv_cache_bytes(layout, 8 * GiB)
    assert pool.bytes_per_block == 8 * 2**20
    assert pool.num_blocks == 1024  # 8 GiB / 8 MiB
    assert pool.kv_tokens == 16384  # 1024 blocks x 16 tokens
    # full attention needs cdiv(L, 16) <= 1024 blocks -> the longest request is 16384 tokens
    assert budget.max_model_len_that_fits(pool.num_blocks, layout, 8192, 32768) == 16384


def test_gemma_3_27b_on_80_gb():
    layout = load_model("gemma-3-27b").layout
    pool = size_from_gpu_memory(layout, gpu_total_bytes=80 * 10**9, weights_bytes=54 * 10**9)
    # 80e9 x 0.9 = 72e9; - 54e9 weights = 18e9 bytes for the cache;
    # 18e9 // (131072 x 10 = 1310720) = 13732 blocks (13732 x 1310720 = 17,998,807,040)
    assert pool.kv_cache_bytes == 18 * 10**9
    assert pool.num_blocks == 13732
    # vLLM's "GPU KV cache size": 7 groups, so 13732 // 7 = 1961 blocks' worth of tokens
    # in every group -> 1961 x 16 = 31376 tokens (not 13732 x 16 = 219712)
    assert pool.num_groups == 7
    assert pool.kv_tokens == 31376
    assert pool.source == SOURCE_GPU and pool.gpu_memory_utilization == 0.9
    assert pool.shortfall_bytes == 0 and pool.fits


def test_gpu_memory_subtracts_everything_it_reports():
    pool = size_from_gpu_memory(
        FULL,
        gpu_total_bytes=40 * GiB,
        weights_bytes=16 * GiB,
        gpu_memory_utilization=0.5,
        activation_reserve_bytes=1 * GiB,
        non_torch_overhead_bytes=1 * GiB,
        weights_estimated=True,
    )
    # 40 GiB x 0.5 = 20 GiB - 16 - 1 - 1 = 2 GiB -> 1024 blocks of 2 MiB
    assert pool.kv_cache_bytes == 2 * GiB
    assert pool.num_blocks == 1024
    d = pool.as_dict()
    assert d["weights_bytes"] == 16 * GiB and d["weights_estimated"] is True
    assert d["activation_reserve_bytes"] == GiB and d["non_torch_overhead_bytes"] == GiB
    assert d["pool_bytes"] == 2 * GiB and d["kv_tokens"] == 1024 * 16


def test_weights_that_do_not_fit_are_a_result_not_an_exception():
    pool = size_from_gpu_memory(FULL, gpu_total_bytes=10 * GiB, weights_bytes=10 * GiB)
    # usable int(10 GiB x 0.9) = 9663676416; 10 GiB - that = 1073741824 short
    assert pool.num_blocks == 0 and not pool.fits
    assert pool.kv_cache_bytes == 0
    assert pool.shortfall_bytes == 10 * GiB - int(10 * GiB * 0.9)


def test_less_than_one_block_gives_zero_blocks():
    pool = size_from_kv_cache_bytes(FULL, 2 * 2**20 - 1)
    assert pool.num_blocks == 0 and not pool.fits


def test_num_gpu_blocks_override():
    pool = size_from_num_blocks(HALF_HALF, 300)
    assert pool.num_blocks == 300 and pool.source == SOURCE_BLOCKS
    assert pool.kv_cache_bytes == 300 * 2**20
    assert pool.kv_tokens == 2400  # 2 groups: 300 // 2 x 16
    assert pool.as_dict()["kv_tokens"] == 2400 and pool.as_dict()["num_groups"] == 2


def test_size_pool_dispatches_to_exactly_one_source():
    assert size_pool(FULL, num_gpu_blocks=10).source == SOURCE_BLOCKS
    assert size_pool(FULL, kv_cache_memory_bytes=GiB).source == SOURCE_KV_BYTES
    assert size_pool(FULL, gpu_total_bytes=GiB, weights_bytes=0).source == SOURCE_GPU
    with pytest.raises(ValueError, match="got kv_cache_memory_bytes, num_gpu_blocks"):
        size_pool(FULL, kv_cache_memory_bytes=GiB, num_gpu_blocks=3)
    with pytest.raises(ValueError, match="got none"):
        size_pool(FULL)
    with pytest.raises(ValueError, match="weights_bytes"):
        size_pool(FULL, gpu_total_bytes=GiB)
    with pytest.raises(ValueError, match="weights_bytes only applies with gpu_total_bytes"):
        size_pool(FULL, num_gpu_blocks=10, weights_bytes=GiB)


def test_kv_tokens_is_vllms_gpu_kv_cache_size():
    # vLLM: num_tokens = num_blocks // len(kv_cache_groups) x block_size
    assert kv_tokens(1000, FULL) == 16000  # one group
    assert kv_tokens(1001, HALF_HALF) == 500 * 16  # two groups, the odd block left over
    jamba = load_model("jamba-v0.1").layout  # 7 mamba groups + 1 attention group, block 80
    assert kv_tokens(13732, jamba) == 13732 // 8 * 80 == 137280


FLAG = lambda name: "--" + name.replace("_", "-")  # noqa: E731


@pytest.mark.parametrize(
    ("given", "setting", "message"),
    [
        (["kv_cache_memory_bytes", "num_gpu_blocks"], "num_gpu_blocks",
         "give one memory source, not kv_cache_memory_bytes and num_gpu_blocks"),
        (["num_gpu_blocks", "gpu_memory_bytes"], "gpu_memory_bytes",
         "give one memory source, not num_gpu_blocks and gpu_memory_bytes"),
        (["num_gpu_blocks", "weights_bytes"], "weights_bytes",
         "weights_bytes only applies with gpu_memory_bytes or the local GPU"),
        (["kv_cache_memory_bytes", "activation_reserve_bytes"], "activation_reserve_bytes",
         "activation_reserve_bytes only applies with gpu_memory_bytes or the local GPU"),
        (["kv_cache_memory_bytes", "gpu_memory_utilization"], "gpu_memory_utilization",
         "gpu_memory_utilization only applies"),
    ],
)  # fmt: skip
def test_memory_source_conflicts_name_the_setting(given, setting, message):
    conflict = memory_source_conflict(given)
    assert conflict is not None
    assert conflict.setting == setting and conflict.message.startswith(message)
    # the same rule, spelled as flags for `kvbudget estimate`
    flagged = memory_source_conflict(given, spell=FLAG)
    assert flagged is not None and FLAG(setting) in flagged.message


@pytest.mark.parametrize(
    "given",
    [
        [],
        ["num_gpu_blocks"],
        ["kv_cache_memory_bytes"],
        ["gpu_memory_bytes", "weights_bytes", "gpu_memory_utilization", "activation_reserve_bytes"],
        ["weights_bytes", "activation_reserve_bytes"],  # the local GPU's memory
    ],
)
def test_memory_sources_that_go_together(given):
    assert memory_source_conflict(given) is None


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: size_from_kv_cache_bytes(FULL, 0), "kv_cache_memory_bytes"),
        (lambda: size_from_kv_cache_bytes(FULL, -5), "kv_cache_memory_bytes"),
        (lambda: size_from_kv_cache_bytes(FULL, 1.5), "kv_cache_memory_bytes"),
        (lambda: size_from_num_blocks(FULL, 0), "num_gpu_blocks"),
        (lambda: size_from_num_blocks(FULL, True), "num_gpu_blocks"),
        (lambda: size_from_gpu_memory(FULL, gpu_total_bytes=0, weights_bytes=0), "gpu_total_bytes"),
        (lambda: size_from_gpu_memory(FULL, gpu_total_bytes=GiB, weights_bytes=-1), "weights_bytes"),
        (
            lambda: size_from_gpu_memory(
                FULL, gpu_total_bytes=GiB, weights_bytes=0, gpu_memory_utilization=0
            ),
            "gpu_memory_utilization",
        ),
        (
            lambda: size_from_gpu_memory(
                FULL, gpu_total_bytes=GiB, weights_bytes=0, gpu_memory_utilization=1.5
            ),
            "gpu_memory_utilization",
        ),
        (
            lambda: size_from_gpu_memory(
                FULL, gpu_total_bytes=GiB, weights_bytes=0, activation_reserve_bytes=-1
            ),
            "activation_reserve_bytes",
        ),
        (
            lambda: size_from_gpu_memory(
                FULL, gpu_total_bytes=GiB, weights_bytes=0, non_torch_overhead_bytes=-1
            ),
            "non_torch_overhead_bytes",
        ),
    ],
)
def test_bad_inputs_name_the_input(call, name):
    with pytest.raises(ValueError, match=name):
        call()


@given(
    total=st.integers(1, 2**40),
    weights=st.integers(0, 2**40),
    util=st.floats(0.05, 1.0),
)
def test_pool_never_exceeds_the_memory_left(total, weights, util):
    pool = size_from_gpu_memory(
        HALF_HALF, gpu_total_bytes=total, weights_bytes=weights, gpu_memory_utilization=util
    )
    left = int(total * util) - weights
    assert pool.pool_bytes <= max(0, left)
    assert pool.pool_bytes + pool.bytes_per_block > max(0, left)  # no whole block wasted
    assert pool.shortfall_bytes == max(0, -left)
