"""`kvbudget estimate`'s figures: the report `--json` prints and the tables show.

Block counts are vLLM's (the null block included); the daemon's usable blocks, one fewer,
sit beside them (docs/architecture/cli.md says why both).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvbudget.client.errors import CLIError

if TYPE_CHECKING:  # imported lazily at run time, so `kvbudget --help` stays light
    from kvbudget.daemon.config.hf_config import ModelInfo
    from kvbudget.daemon.config.parallel import Parallel
    from kvbudget.daemon.config.sizing import PoolSizing
    from kvbudget.daemon.core.spec import KVCacheLayout


@dataclass(frozen=True)
class Lengths:
    max_model_len: int
    max_model_len_source: str  # "model", "given" or "auto"
    tokens_per_request: int


@dataclass(frozen=True)
class TraceLengths:
    path: str
    num_requests: int
    p50: int
    mean: int
    p99: int
    capped: int  # requests longer than max_model_len, counted at max_model_len


def trace_lengths(path: str, max_model_len: int) -> TraceLengths:
    """A trace's request lengths (prompt + output, capped at max_model_len): p50, mean, p99."""
    try:
        from kvbudget.traces.loaders import load_trace
    except ImportError:
        raise CLIError("--trace needs kvbudget.traces.loaders, which is not installed") from None
    try:
        requests = load_trace(path).requests
    except (OSError, ValueError) as exc:  # the loader's TraceError names file and line
        raise CLIError(str(exc)) from None
    raw = [int(r.prompt_tokens) + int(r.output_tokens) for r in requests]
    lengths = sorted(min(n, max_model_len) for n in raw if n > 0)
    if not lengths:
        raise CLIError(f"trace {path} has no requests with tokens")

    def percentile(p: float) -> int:  # nearest rank
        return lengths[max(0, math.ceil(p / 100 * len(lengths)) - 1)]

    return TraceLengths(
        path=path,
        num_requests=len(lengths),
        p50=percentile(50),
        mean=math.ceil(sum(lengths) / len(lengths)),
        p99=percentile(99),
        capped=sum(1 for n in raw if n > max_model_len),
    )


def least_blocks(layout: KVCacheLayout, F: int) -> int:
    """The fewest blocks (vLLM's count, the null block included) on which the daemon admits
    anything: one request of one token, plus the null block."""
    from kvbudget.daemon.core import budget

    return budget.request_worst_case(layout, 1, F).total + 1


def daemon_usable_blocks(num_blocks: int) -> int:
    """Blocks `kvbudget daemon` hands out on a pool of `num_blocks` (vLLM's count): block 0
    is the null block (the daemon's server takes `num_blocks - 1` for its controller)."""
    return max(0, num_blocks - 1)


def build_report(
    model: ModelInfo, sizing: PoolSizing, lengths: Lengths, F: int, trace: TraceLengths | None,
    parallel: Parallel | None = None,
) -> dict[str, Any]:
    """Everything `--json` prints; the tables show the same numbers. With `parallel`, the
    model's layout is one GPU's (parallel.rank_layout) and `parallel` says per what."""
    from kvbudget.daemon.config.parallel import Parallel, parallel_report
    from kvbudget.daemon.core import budget

    layout = model.layout
    tokens = lengths.tokens_per_request
    worst = budget.request_worst_case(layout, tokens, F)
    naive = budget.request_naive(layout, tokens)
    usable = daemon_usable_blocks(sizing.num_blocks)
    fits_len = budget.max_model_len_that_fits(usable, layout, F, model.max_model_len)  # (as auto: the daemon's)
    vllm_concurrency = budget.max_concurrency(sizing.num_blocks, layout, tokens, F)
    sizing_dict = sizing.as_dict()
    sizing_dict["weights_note"] = model.weights.note if sizing.weights_estimated else None
    if sizing.weights_estimated and parallel is not None and parallel.gpus_per_engine > 1:
        sizing_dict["weights_note"] += f"; split evenly over the engine's {parallel.gpus_per_engine} GPUs"
    return {
        **_model_fields(model),
        # vLLM's count (num_gpu_blocks), the null block included; the daemon hands out one fewer
        "num_blocks": sizing.num_blocks,
        "daemon_usable_blocks": usable,
        "page_size_bytes": layout.page_size_bytes,
        "group_size": layout.group_size,
        "bytes_per_block": layout.bytes_per_block,
        "num_groups": layout.num_groups,
        # vLLM's "GPU KV cache size": num_blocks // num_groups x block_size
        "kv_tokens": sizing.kv_tokens,
        "max_model_len": lengths.max_model_len,
        "max_model_len_source": lengths.max_model_len_source,
        "model_max_len": model.max_model_len,
        "max_model_len_that_fits": fits_len,
        "max_num_batched_tokens": F,
        "tokens_per_request": tokens,
        "groups": _group_entries(layout, worst, naive),
        "blocks_per_request": worst.total,
        "naive_blocks_per_request": naive.total,
        # "max_concurrency" is vLLM's figure, on num_blocks (kept as it was; "vllm_max_concurrency"
        # says whose it is); "daemon_max_concurrency" is on the daemon's usable blocks.
        "max_concurrency": vllm_concurrency,
        "naive_max_concurrency": budget.naive_max_concurrency(sizing.num_blocks, layout, tokens),
        "vllm_max_concurrency": vllm_concurrency,
        "daemon_max_concurrency": budget.max_concurrency(usable, layout, tokens, F),
        "daemon_naive_max_concurrency": budget.naive_max_concurrency(usable, layout, tokens),
        "sizing": sizing_dict,
        "trace": None if trace is None else _trace_entry(trace, layout, sizing.num_blocks, F),
        "parallel": parallel_report(
            parallel or Parallel(), layout, sizing.num_blocks, sizing.kv_cache_bytes, vllm_concurrency
        ),
        "notes": list(layout.notes),
    }


def _model_fields(model: ModelInfo) -> dict[str, Any]:
    layout = model.layout
    return {
        "model": model.name,
        "architecture": model.architecture,
        "num_layers": layout.num_layers,
        "dtype": model.dtype,
        "kv_dtype": model.kv_dtype,
        "num_parameters": model.weights.num_parameters,
        "estimated_weight_bytes": model.weights.weight_bytes,
        "block_size": layout.block_size,
    }


def _group_entries(layout: KVCacheLayout, worst: Any, naive: Any) -> list[dict[str, Any]]:
    """One entry per KV-cache group: its layers, its extent, what one request holds in it."""
    groups = []
    for i, group in enumerate(layout.groups):
        entry: dict[str, Any] = {
            "index": i,
            "layer_type": group.kind.value,
            "num_layers": len(group.layer_ids),
            "layer_ids": list(group.layer_ids),
        }
        for attr in ("sliding_window", "attention_chunk_size", "token_cap"):
            if hasattr(group.spec, attr):
                entry[attr] = getattr(group.spec, attr)
        entry["blocks_per_request"] = worst.per_group[i]
        entry["naive_blocks_per_request"] = naive.per_group[i]
        groups.append(entry)
    return groups


def _trace_entry(trace: TraceLengths, layout: KVCacheLayout, num_blocks: int, F: int) -> dict[str, Any]:
    return {
        "path": trace.path,
        "num_requests": trace.num_requests,
        "requests_capped_at_max_model_len": trace.capped,
        "p50": _concurrency(trace.p50, layout, num_blocks, F),
        "mean": _concurrency(trace.mean, layout, num_blocks, F),
        "p99": _concurrency(trace.p99, layout, num_blocks, F),
    }


def _concurrency(n: int, layout: KVCacheLayout, num_blocks: int, F: int) -> dict[str, Any]:
    """Requests of `n` tokens at once: vLLM's figures on `num_blocks`, the daemon's on one fewer."""
    from kvbudget.daemon.core import budget

    usable = daemon_usable_blocks(num_blocks)
    return {
        "tokens": n,
        "blocks_per_request": budget.request_worst_case(layout, n, F).total,
        "naive_blocks_per_request": budget.request_naive(layout, n).total,
        "max_concurrency": budget.max_concurrency(num_blocks, layout, n, F),
        "naive_max_concurrency": budget.naive_max_concurrency(num_blocks, layout, n),
        "daemon_max_concurrency": budget.max_concurrency(usable, layout, n, F),
        "daemon_naive_max_concurrency": budget.naive_max_concurrency(usable, layout, n),
    }
