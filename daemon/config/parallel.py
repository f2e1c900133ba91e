"""Tensor, pipeline and data parallel layouts: what one GPU of an engine holds.

vLLM sizes a parallel pool per worker and then takes the smallest: each worker holds the
KV of its own shard, and `num_gpu_blocks` is made the same on every worker (the minimum
over them, `get_kv_cache_configs`). So the layout that sizes the pool is the per-rank one
of the stage with the most bytes per block:

- tensor parallel splits the KV heads across ranks, `max(1, heads // tp)` per rank
  (replicated when there are fewer KV heads than ranks, as `ModelConfig.get_num_kv_heads`);
- MLA's latent cache has one "head" and is replicated on every rank;
- a state layer's (Mamba) conv channels and SSM heads are split evenly across ranks, and a
  hybrid's attention block is sized on the rank's figures (`mamba_state`);
- pipeline parallel gives each stage only its layers (`get_pp_indices`: an even split,
  the remainder to the stages before the last); the KV-cache groups are the model's, each
  stage's block spans its share of each group's layers.

The tensor-parallel part is built with the model (`hf_config.load_model`'s
`tensor_parallel_size`), the pipeline part here. Data-parallel replicas are separate
engines with separate pools: nothing here splits. Blocks per request depend only on the
groups' specs, never on how many layers a GPU holds (only a hybrid's block size may
change with tensor parallel, when the rank's state needs fewer tokens of attention page).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from typing import TYPE_CHECKING

from kvbudget.daemon.core.spec import KVCacheLayout

if TYPE_CHECKING:
    from kvbudget.daemon.config.settings import DaemonConfig


# Each message starts with the setting's config name, so a caller can spell it its way.
SETTINGS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")


@dataclass(frozen=True)
class Parallel:
    tensor: int = 1
    pipeline: int = 1
    data: int = 1

    @property
    def gpus_per_engine(self) -> int:
        return self.tensor * self.pipeline

    @property
    def is_single(self) -> bool:
        return self.gpus_per_engine == 1 and self.data == 1


def parallel_problem(config: DaemonConfig) -> tuple[str, str] | None:
    """(setting, message) for a layout the daemon cannot budget, or None. A daemon budgets
    one engine's pool, the same block count on each of its GPUs: num_gpu_blocks, or a size
    per GPU (kv_cache_memory_bytes, gpu_memory_bytes, or the smallest of the GPUs' memory
    NVML reads: pool_setup). Not yet: memory owned on several GPUs."""
    tp, pp, dp = (getattr(config, name) for name in SETTINGS)
    for name, value in zip(SETTINGS, (tp, pp, dp)):
        if value < 1:
            return name, f"must be at least 1, got {value}"
    if dp > 1:
        return "data_parallel_size", (
            f"{dp} replicas are {dp} engines, each with its own pool: run one daemon per replica "
            "(kvbudget@.service), each with data_parallel_size 1"
        )
    if tp * pp == 1:
        return None
    setting = "tensor_parallel_size" if tp > 1 else "pipeline_parallel_size"
    layout = f"tensor {tp} x pipeline {pp} = {tp * pp} GPUs per engine"
    if config.memory_mode == "owned":
        return setting, (
            f"{layout} need memory_mode accounting (the engine keeps its KV memory, the daemon "
            "budgets its blocks): owned, the default, allocates the pool on one GPU"
        )
    return None


def stage_layers(num_layers: int, pp: int) -> list[range]:
    """vLLM's `get_pp_indices`: each stage's model layers. 10 layers on 4 stages: 2, 3, 3, 2."""
    if pp > num_layers:
        raise ValueError(f"pipeline_parallel_size {pp} exceeds the model's {num_layers} layers")
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    starts = [sum(parts[:i]) for i in range(pp)]
    return [range(s, s + n) for s, n in zip(starts, parts)]


def rank_kv_heads(total: int, tp: int) -> int:
    """KV heads one tensor-parallel rank holds. vLLM's QKV projection needs the heads to
    split evenly or to be replicated whole, so anything else is refused here as there."""
    if total % tp and tp % total:
        raise ValueError(
            f"tensor_parallel_size {tp} neither divides the model's {total} KV heads nor is "
            "a multiple of them (vLLM refuses such a layout)"
        )
    return max(1, total // tp)


def stage_group_sizes(layout: KVCacheLayout, pp: int) -> list[int]:
    """Each stage's tensors per block: the most layers any group has on that stage."""
    stages = stage_layers(layout.num_layers, pp)
    return [
        max(sum(1 for i in g.layer_ids if i in stage) for g in layout.groups) for stage in stages
    ]


def rank_layout(layout: KVCacheLayout, parallel: Parallel) -> KVCacheLayout:
    """The layout one GPU of the engine sizes its pool by. `layout` is already one
    tensor-parallel rank's (`load_model(tensor_parallel_size=...)`: its pages are the rank's
    KV heads and state, as vLLM builds each worker's); what is left is the block of the
    stage with the most layers (the fewest blocks: the one every worker gets)."""
    if parallel.pipeline == 1:
        return layout
    group_size = max(stage_group_sizes(layout, parallel.pipeline))
    note = f"one GPU of pipeline {parallel.pipeline}: blocks of the fullest stage's layers"
    return dataclasses.replace(layout, group_size=group_size, notes=(*layout.notes, note))


def rank_weights(weights_bytes: int, parallel: Parallel) -> int:
    """Weights one GPU holds, split evenly over tp x pp ranks: an estimate (the first and
    last stages also hold the embeddings and the LM head, replicated norms are small)."""
    return -(-weights_bytes // parallel.gpus_per_engine)


def parallel_report(
    parallel: Parallel, layout: KVCacheLayout, num_blocks: int, kv_cache_bytes: int, concurrency: float
) -> dict[str, object]:
    """What is per GPU and what is per engine, for `kvbudget estimate`'s report. `layout`
    is the rank layout; `num_blocks` and `kv_cache_bytes` one GPU's; `concurrency` one
    engine's (the blocks are the same on every worker, so one GPU's count is the engine's)."""
    stages = stage_layers(layout.num_layers, parallel.pipeline)
    return {
        "tensor_parallel_size": parallel.tensor,
        "pipeline_parallel_size": parallel.pipeline,
        "data_parallel_size": parallel.data,
        "gpus_per_engine": parallel.gpus_per_engine,
        "engines": parallel.data,
        "gpus": parallel.gpus_per_engine * parallel.data,
        "stage_layers": [[r.start, r.stop - 1] for r in stages],
        "stage_group_sizes": stage_group_sizes(layout, parallel.pipeline),
        "kv_heads_per_rank": sorted({
            g.spec.num_kv_heads for g in layout.groups if hasattr(g.spec, "num_kv_heads")
        }),
        # per GPU
        "kv_cache_bytes_per_gpu": kv_cache_bytes,
        "bytes_per_block_per_gpu": layout.bytes_per_block,
        # per engine: one pool of num_blocks, each block spread over every GPU of the engine
        "num_blocks_per_engine": num_blocks,
        # a block is a page on each of the tp ranks of every stage, for that stage's layers
        "bytes_per_block_per_engine": (
            layout.page_size_bytes * parallel.tensor * sum(stage_group_sizes(layout, parallel.pipeline))
        ),
        "kv_cache_bytes_per_engine": kv_cache_bytes * parallel.gpus_per_engine,
        "max_concurrency_per_engine": concurrency,
        # data parallel: separate engines, separate pools; a request lives in one of them
        "num_blocks_all_engines": num_blocks * parallel.data,
        "max_concurrency_all_engines": concurrency * parallel.data,
    }
