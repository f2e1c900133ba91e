"""The daemon's parallel layout: `[parallel]` in the config file and `--tensor-parallel-size`,
`--pipeline-parallel-size`, `--data-parallel-size` (vLLM's names). A daemon budgets one
engine's pool, the same block count on each of its GPUs, sized per GPU as `kvbudget estimate`
sizes it; what it cannot do yet is refused in one line naming the setting.

By hand, Llama-3.1-70B (80 layers, 8 KV heads of 128, bf16, blocks of 16): one layer's page
is 16 x 2 (K, V) x 8 x 128 x 2 B = 65,536 B on one GPU, 16,384 B on a tensor-parallel-4 rank
(2 heads). A block spans the layers a GPU holds: 80 (tp), or a pipeline stage's.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvbudget.daemon.config.loading import load_config
from kvbudget.daemon.config.pool_setup import PoolSetupError, setup_pool
from kvbudget.daemon.config.settings import ConfigError
from kvbudget.daemon.core.budget import request_worst_case

from kvbudget.client import ObserverClient

from daemon_harness import DaemonProcess
from test_estimate_cli import run_json

MODEL = '[model]\nname = "llama-3.1-70b"\nmax_model_len = 32768\n'


def config(tmp_path: Path, pool: str, parallel: str):
    path = tmp_path / "kvbudget.toml"
    path.write_text(f'{MODEL}[pool]\nmemory_mode = "accounting"\n{pool}\n[parallel]\n{parallel}\n')
    return load_config(path)


def test_the_issues_example_tp4_with_20e9_per_gpu(tmp_path: Path) -> None:
    # 80 x 16,384 B = 1,310,720 B per block on each GPU; 20e9 // 1,310,720 = 15,258 blocks
    setup = setup_pool(config(tmp_path, "kv_cache_memory_bytes = 20e9", "tensor_parallel_size = 4"), gpu=None)
    assert (setup.sizing.bytes_per_block, setup.num_blocks) == (1_310_720, 15_258)
    # the same memory on one GPU holding all 8 heads: 5,242,880 B per block, 3,814 blocks
    single = setup_pool(config(tmp_path, "kv_cache_memory_bytes = 20e9", ""), gpu=None)
    assert (single.sizing.bytes_per_block, single.num_blocks) == (5_242_880, 3_814)


def test_a_pipeline_stage_holds_its_layers(tmp_path: Path) -> None:
    # 80 layers on 3 stages: 27, 27, 26; the fullest stage sizes every worker's pool:
    # 27 x 65,536 = 1,769,472 B per block; 20e9 // 1,769,472 = 11,302 blocks
    setup = setup_pool(config(tmp_path, "kv_cache_memory_bytes = 20e9", "pipeline_parallel_size = 3"), gpu=None)
    assert (setup.sizing.bytes_per_block, setup.num_blocks) == (1_769_472, 11_302)


def test_a_requests_blocks_do_not_depend_on_the_layout(tmp_path: Path) -> None:
    # num_gpu_blocks is the engine's count (the same on every worker), taken as given; a
    # 32,768-token request holds 32,768 / 16 = 2,048 blocks on one GPU or on four.
    parallel = setup_pool(config(tmp_path, "num_gpu_blocks = 15258", "tensor_parallel_size = 4"), gpu=None)
    single = setup_pool(config(tmp_path, "num_gpu_blocks = 15258", ""), gpu=None)
    assert parallel.num_blocks == single.num_blocks == 15_258
    for setup in (parallel, single):
        assert request_worst_case(setup.model.layout, 32_768, 8192).total == 2_048


def test_gpu_memory_per_gpu_with_each_ranks_weights(tmp_path: Path) -> None:
    # 80e9 x 0.9 - 35e9 of weights on this GPU = 37e9; // 1,310,720 = 28,228 blocks
    pool = "gpu_memory_bytes = 80e9\nweights_bytes = 35e9"
    setup = setup_pool(config(tmp_path, pool, "tensor_parallel_size = 4"), gpu=None)
    assert setup.num_blocks == 28_228
    # Estimated weights: the model's 141,107,412,992 B split over 4 GPUs, 35,276,853,248 B
    # each, as `kvbudget estimate` splits them: the same pool.
    setup = setup_pool(config(tmp_path, "gpu_memory_bytes = 80e9", "tensor_parallel_size = 4"), gpu=None)
    out = run_json("--model", "llama-3.1-70b", "--tensor-parallel-size", "4", "--gpu-memory-bytes", "80e9")
    assert out["estimated_weight_bytes"] == 141_107_412_992
    assert setup.sizing.weights_bytes == 35_276_853_248
    assert setup.num_blocks == out["num_blocks"]


REFUSED = [
    # (the [pool] lines, the [parallel] lines, the one line the daemon says)
    ("num_gpu_blocks = 100", "tensor_parallel_size = 4",
     "parallel.tensor_parallel_size: tensor 4 x pipeline 1 = 4 GPUs per engine need memory_mode accounting "
     "(the engine keeps its KV memory, the daemon budgets its blocks): owned, the default, allocates the pool "
     "on one GPU"),
    ("num_gpu_blocks = 100", "data_parallel_size = 2",
     "parallel.data_parallel_size: 2 replicas are 2 engines, each with its own pool: run one daemon per "
     "replica (kvbudget@.service), each with data_parallel_size 1"),
    ("num_gpu_blocks = 100", "tensor_parallel_size = 0", "parallel.tensor_parallel_size: must be at least 1, got 0"),
]


@pytest.mark.parametrize("pool, parallel, message", REFUSED)
def test_what_the_daemon_cannot_budget_is_refused_naming_the_key(tmp_path, pool, parallel, message) -> None:
    path = tmp_path / "kvbudget.toml"
    path.write_text(f"{MODEL}[pool]\n{pool}\n[parallel]\n{parallel}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == f"{path}: {message}"


def test_a_layout_the_model_cannot_take_is_refused_at_sizing(tmp_path: Path) -> None:
    with pytest.raises(PoolSetupError) as caught:
        setup_pool(config(tmp_path, "num_gpu_blocks = 100", "tensor_parallel_size = 3"), gpu=None)
    assert str(caught.value) == (
        "tensor_parallel_size 3 neither divides the model's 8 KV heads nor is a multiple of them "
        "(vLLM refuses such a layout)"
    )


def test_the_flags_one_line_and_exit_2(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "kvbudget", "daemon", "--model", "llama-3.1-70b", "--db-path",
            str(tmp_path / "d.db"), "--listen", f"unix://{tmp_path}/s.sock", "--check-config"]
    refused = subprocess.run([*base, "--tensor-parallel-size", "4"], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.splitlines() == [
        "kvbudget daemon: error: tensor_parallel_size: tensor 4 x pipeline 1 = 4 GPUs per engine need memory_mode "
        "accounting (the engine keeps its KV memory, the daemon budgets its blocks): owned, the default, "
        "allocates the pool on one GPU"
    ]
    ok = subprocess.run([*base, "--tensor-parallel-size", "4", "--memory-mode", "accounting",
                         "--kv-cache-memory-bytes", "20e9"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "15258 blocks of 16 tokens" in ok.stdout


@pytest.mark.slow
async def test_a_running_daemon_plans_one_gpu_of_the_engine(tmp_path: Path) -> None:
    # llama-3.1-8b (32 layers, 8 KV heads of 128) at tensor parallel 4: 2 heads a rank, a
    # page of 16 x 2 x 2 x 128 x 2 B = 16,384 B, a block of 32 pages = 524,288 B (2,097,152
    # on one GPU); the harness's 65 blocks (64 usable, the plan's count) are the engine's,
    # whatever the layout.
    with DaemonProcess(tmp_path, "--tensor-parallel-size", "4") as daemon:
        async with ObserverClient(daemon.target) as observer:
            plan = (await observer.snapshot()).plan
    assert (plan.page_size_bytes, plan.bytes_per_block, plan.num_blocks) == (16_384, 524_288, 64)
