"""From the daemon's config to a sized pool: which model, how many blocks, and why. Without
a GPU and without an explicit size, a one-line error that says which setting to pass."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from kvbudget.daemon.config import hf_config, sizing
from kvbudget.daemon.config.gpu import smallest_total
from kvbudget.daemon.config.parallel import SETTINGS, Parallel, rank_layout, rank_weights
from kvbudget.daemon.config.settings import DaemonConfig

log = logging.getLogger("kvbudget.daemon")


class PoolSetupError(Exception):
    pass


@dataclass(frozen=True)
class PoolSetup:
    model: hf_config.ModelInfo
    sizing: sizing.PoolSizing
    max_model_len: int

    @property
    def num_blocks(self) -> int:
        return self.sizing.num_blocks


def setup_pool(config: DaemonConfig, gpu: object | None) -> PoolSetup:
    """`gpu` is a gpu.GPUProbe (or None when not probed)."""
    try:
        model = hf_config.load_model(
            config.model,
            kv_dtype=None if config.kv_dtype == "auto" else config.kv_dtype,
            block_size=config.block_size,
            token_cap=config.token_cap,  # capped layers: admission's blocks, as estimate's
            tensor_parallel_size=config.tensor_parallel_size,  # one rank's pages (parallel)
        )
    except ValueError as exc:  # (a token_cap or layout message names its key already)
        named = str(exc).startswith(("token_cap ", *SETTINGS))
        raise PoolSetupError(str(exc) if named else f"model: {exc}") from None
    if model.block_size_note:
        # None given: why an MLA model's is 64 (news); one given: that a default MLA engine
        # would not use it, so the plan would not match that engine (a warning).
        (log.info if config.block_size is None else log.warning)("%s", model.block_size_note)
    try:  # as `kvbudget estimate --max-model-len` does: not past max_position_embeddings
        max_model_len = hf_config.resolve_max_model_len(model, config.max_model_len)
    except ValueError as exc:
        raise PoolSetupError(str(exc)) from None
    model, parallel = _rank_model(model, config)
    layout = model.layout
    try:
        if config.num_gpu_blocks is not None:
            sized = sizing.size_from_num_blocks(layout, config.num_gpu_blocks)
        elif config.kv_cache_memory_bytes is not None:
            sized = sizing.size_from_kv_cache_bytes(layout, config.kv_cache_memory_bytes)
        else:
            total, note = config.gpu_memory_bytes, "no GPU"
            if total is None and gpu is not None:
                total, note = smallest_total(gpu)  # every GPU of the engine: vLLM's minimum over workers
            if total is None:
                raise PoolSetupError(
                    f"{note}; size the pool with num_gpu_blocks, kv_cache_memory_bytes "
                    "or gpu_memory_bytes"
                )
            weights = config.weights_bytes
            sized = sizing.size_from_gpu_memory(
                layout,
                gpu_total_bytes=total,
                # given: one GPU's (vLLM's "Model loading took" of one worker); else split evenly
                weights_bytes=weights if weights is not None else rank_weights(model.weights.weight_bytes, parallel),
                gpu_memory_utilization=config.gpu_memory_utilization,
                activation_reserve_bytes=config.activation_reserve_bytes or 0,
                weights_estimated=weights is None,
                gpu_name=str(getattr(gpu, "name", "") or ""),
            )
    except ValueError as exc:
        raise PoolSetupError(str(exc)) from None
    if sized.num_blocks < 2:
        short = f" (short by {sized.shortfall_bytes} bytes)" if sized.shortfall_bytes else ""
        lower = ("give kv_cache_memory_bytes more" if sized.source == "kv_cache_memory_bytes" else
                 "lower weights_bytes / activation_reserve_bytes or give kv_cache_memory_bytes")
        raise PoolSetupError(
            f"the pool gets {sized.num_blocks} blocks{short}; it needs at least 2 (one is the null block): {lower}"
        )
    return PoolSetup(model, sized, max_model_len)


def _rank_model(model: hf_config.ModelInfo, config: DaemonConfig) -> tuple[hf_config.ModelInfo, Parallel]:
    """The model (already one tensor-parallel rank's) as one GPU of a pipeline parallel
    engine holds it: the blocks the pool is sized by; a request's blocks do not change."""
    parallel = Parallel(config.tensor_parallel_size, config.pipeline_parallel_size)
    try:
        layout = rank_layout(model.layout, parallel)
    except ValueError as exc:  # (names the setting: the layout does not fit the model)
        raise PoolSetupError(str(exc)) from None
    return dataclasses.replace(model, layout=layout), parallel


def unservable(setup: PoolSetup, max_num_batched_tokens: int) -> str:
    """The warning for a pool where no request of max_model_len fits ("" when one fits).

    Such a pool starts and serves short requests, and rejects every long one `never_fits`:
    gemma-3-27b on 7 blocks passed --check-config ("6 usable") and a replay lost half its
    requests before anything said why. Said at start, in --check-config and by doctor.
    """
    from kvbudget.daemon.core.budget import request_worst_case

    need = request_worst_case(setup.model.layout, setup.max_model_len, max_num_batched_tokens).total
    usable = setup.num_blocks - 1  # (the null block is never handed out)
    if need <= usable:
        return ""
    return (
        f"no request of max_model_len fits this pool: {setup.max_model_len} tokens need {need} blocks, "
        f"the pool has {usable} usable; such requests are rejected (never_fits): give the pool more "
        "memory or lower max_model_len"
    )
