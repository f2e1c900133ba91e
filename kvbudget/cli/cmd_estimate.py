"""`kvbudget estimate`: pool size and max concurrency for a model, layer-aware vs naive.

The flags, the pool they size and the lengths asked about; the figures are
estimate_report's, their tables estimate_tables'. All block arithmetic comes from
`kvbudget.daemon.core.budget`.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from kvbudget import units
from kvbudget.cli.estimate_report import (
    Lengths,
    build_report,
    daemon_usable_blocks,
    least_blocks,
    trace_lengths,
)
from kvbudget.cli.estimate_tables import blocks_text, fmt_bytes, print_tables
from kvbudget.client.errors import CLIError

if TYPE_CHECKING:  # imported lazily at run time, so `kvbudget --help` stays light
    from kvbudget.daemon.config.hf_config import ModelInfo
    from kvbudget.daemon.config.parallel import Parallel
    from kvbudget.daemon.config.sizing import PoolSizing

DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192  # vLLM's default for its V1 engine
# (--help only: the names accepted are spec.KV_DTYPES, the daemon's kv_dtype's too.)
KV_DTYPE_HELP = "auto (the model's dtype, the default), bf16, fp16, fp8, int4, int2 (also vLLM's fp8_e4m3, fp8_e5m2)"

def parse_size(text: str, flag: str, *, allow_zero: bool = False) -> int:
    """Bytes from `80e9`, `80GB` (10^9), `8GiB` (2^30), `8G` (2^30), `8g` (10^9): the forms
    of kvbudget.units.parse_size (the daemon's SIZE settings take them too)."""
    try:
        value = units.parse_size(text)
    except units.NegativeSize:
        value = -1
    except ValueError as exc:
        raise CLIError(f"{flag} {text!r}: {exc}") from None
    if value < 0 or (value == 0 and not allow_zero):
        raise CLIError(f"{flag} must be {'>= 0' if allow_zero else 'positive'}, got {text!r}")
    return value


def parse_count(text: str, flag: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise CLIError(f"{flag} {text!r}: expected a positive integer") from None
    if value <= 0:
        raise CLIError(f"{flag} must be positive, got {text!r}")
    return value


def parse_fraction(text: str, flag: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise CLIError(f"{flag} {text!r}: expected a number in (0, 1]") from None
    if not 0 < value <= 1:
        raise CLIError(f"{flag} must be in (0, 1], got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Values are parsed in `run`, so every mistake is one line naming the flag.
    from kvbudget.daemon.config.hf_config import preset_names

    parser.add_argument("--model", metavar="PRESET|PATH",
                        help=f"a preset name or a model's config.json (or its folder); presets: {', '.join(preset_names())}")
    memory = parser.add_argument_group(
        "memory source (one of; default: the local GPU via NVML)",
        "sizes accept 80e9, 80GB (10^9), 8GiB (2^30); single letters: 8G = 8 GiB, 8g = 8 GB",
    )
    memory.add_argument("--kv-cache-memory-bytes", metavar="SIZE", help="bytes for the KV pool")
    memory.add_argument("--num-gpu-blocks", metavar="N", help="pool size in blocks")
    memory.add_argument("--gpu-memory-bytes", metavar="SIZE", help="GPU total memory")
    memory.add_argument(
        "--gpu-memory-utilization", metavar="F", help="fraction of GPU memory to use (0.9)"
    )
    memory.add_argument(
        "--weights-bytes", metavar="SIZE", help="model weights on one GPU (default: estimated from config, split over tp x pp)"
    )
    memory.add_argument(
        "--activation-reserve-bytes", metavar="SIZE", help="activation peak to keep free (0)"
    )
    parser.add_argument(
        "--block-size", metavar="N", help="tokens per block (16; 64 for MLA models)"
    )
    parser.add_argument("--kv-dtype", metavar="DTYPE", help=KV_DTYPE_HELP)
    parser.add_argument(
        "--max-model-len",
        metavar="N|auto",
        help="longest request (default: the model's max; auto: the longest that fits the pool)",
    )
    parser.add_argument(
        "--max-num-batched-tokens",
        metavar="F",
        default=str(DEFAULT_MAX_NUM_BATCHED_TOKENS),
        help=f"tokens in flight per step ({DEFAULT_MAX_NUM_BATCHED_TOKENS})",
    )
    parser.add_argument(
        "--tokens-per-request", metavar="N", help="request length (default: max_model_len)"
    )
    parser.add_argument("--trace", metavar="FILE", help="concurrency at a trace's p50/mean/p99")
    parser.add_argument(
        "--token-cap", metavar="N", help="engine caps every attention layer at N tokens"
    )
    parallel = parser.add_argument_group(
        "parallel layout (vLLM's names; memory sizes above are per GPU)",
        "data-parallel replicas are separate engines, each with its own pool",
    )
    for flag, what in (
        ("--tensor-parallel-size", "GPUs the KV heads are split over (1)"),
        ("--pipeline-parallel-size", "stages the layers are split over (1)"),
        ("--data-parallel-size", "replicas, each an engine with its own pool (1)"),
    ):
        parallel.add_argument(flag, metavar="N", help=what)
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")


def run(args: argparse.Namespace) -> int:
    from kvbudget.daemon.core.spec import KV_DTYPE_NAMES, KV_DTYPES

    if not args.model:
        raise CLIError("--model is required (a preset name or a config.json path)")
    # None: not given, the model's default (16; 64 for MLA: hf_config.default_block_size)
    block_size = parse_count(args.block_size, "--block-size") if args.block_size is not None else None
    token_cap = parse_count(args.token_cap, "--token-cap") if args.token_cap else None
    # "auto" (the daemon's kv_dtype default, vLLM's --kv-cache-dtype default): the model's dtype
    kv_dtype = None if args.kv_dtype in (None, "auto") else args.kv_dtype  # (as daemon.config)
    if kv_dtype is not None and kv_dtype.lower() not in KV_DTYPES:
        raise CLIError(f"--kv-dtype {args.kv_dtype!r}: expected auto or one of {KV_DTYPE_NAMES}")
    F = parse_count(args.max_num_batched_tokens, "--max-num-batched-tokens")
    parallel = parallel_flags(args)
    model = load_rank_model(args.model, parallel, kv_dtype=kv_dtype, block_size=block_size, token_cap=token_cap)
    sizing = _size_pool(args, model, parallel)
    if not sizing.fits:
        raise CLIError(_does_not_fit(sizing))
    least = least_blocks(model.layout, F)
    if daemon_usable_blocks(sizing.num_blocks) == 0:
        # One block is the null block alone: the daemon refuses such a pool, nothing to estimate.
        raise CLIError(_no_usable_block(sizing, least))
    lengths = _lengths(args, model, sizing.num_blocks, F)
    trace = trace_lengths(args.trace, lengths.max_model_len) if args.trace else None
    report = build_report(model, sizing, lengths, F, trace, parallel)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_tables(report, least)
    return 0


def parallel_flags(args: argparse.Namespace) -> Parallel:
    from kvbudget.daemon.config.parallel import Parallel

    def size(flag: str) -> int:  # (replay has no --data-parallel-size: one engine's pool)
        text = getattr(args, flag.removeprefix("--").replace("-", "_"), None)
        return 1 if text is None else parse_count(text, flag)

    return Parallel(
        size("--tensor-parallel-size"), size("--pipeline-parallel-size"), size("--data-parallel-size")
    )


def load_rank_model(source: str, parallel: Parallel, *, model_prefix: str = "", **options: object) -> ModelInfo:
    """The model as one GPU of the engine holds it: one tensor-parallel rank's pages
    (`load_model`), the fullest pipeline stage's blocks (`parallel.rank_layout`). A message
    that names a setting (token_cap, tensor_parallel_size...) names its flag here; any
    other starts with `model_prefix`."""
    import dataclasses

    from kvbudget.daemon.config.hf_config import load_model
    from kvbudget.daemon.config.parallel import SETTINGS, rank_layout

    try:
        model = load_model(source, tensor_parallel_size=parallel.tensor, **options)  # type: ignore[arg-type]
        return dataclasses.replace(model, layout=rank_layout(model.layout, parallel))
    except ValueError as exc:
        message = str(exc)
        if not message.startswith(("token_cap ", *SETTINGS)):
            raise CLIError(model_prefix + message) from None
        for name in ("token_cap", *SETTINGS):
            message = message.replace(name, "--" + name.replace("_", "-"))
        raise CLIError(message) from None


def _size_pool(args: argparse.Namespace, model: ModelInfo, parallel: Parallel) -> PoolSizing:
    from kvbudget.daemon.config import sizing as sz

    layout = model.layout
    # The daemon's config keys and these flags share names (`num_gpu_blocks`,
    # `--num-gpu-blocks`), and one rule: sizing's.
    settings = (
        "kv_cache_memory_bytes", "num_gpu_blocks", "gpu_memory_bytes", "weights_bytes",
        "gpu_memory_utilization", "activation_reserve_bytes",
    )  # fmt: skip
    given = [name for name in settings if getattr(args, name) is not None]
    conflict = sz.memory_source_conflict(given, spell=lambda name: "--" + name.replace("_", "-"))
    if conflict is not None:
        raise CLIError(conflict.message)

    if args.num_gpu_blocks is not None:
        return sz.size_from_num_blocks(layout, parse_count(args.num_gpu_blocks, "--num-gpu-blocks"))
    if args.kv_cache_memory_bytes is not None:
        kv_bytes = parse_size(args.kv_cache_memory_bytes, "--kv-cache-memory-bytes")
        return sz.size_from_kv_cache_bytes(layout, kv_bytes)

    util = (
        parse_fraction(args.gpu_memory_utilization, "--gpu-memory-utilization")
        if args.gpu_memory_utilization is not None
        else sz.DEFAULT_GPU_MEMORY_UTILIZATION
    )
    activation = (
        parse_size(args.activation_reserve_bytes, "--activation-reserve-bytes", allow_zero=True)
        if args.activation_reserve_bytes is not None
        else 0
    )
    if args.weights_bytes is not None:
        weights = parse_size(args.weights_bytes, "--weights-bytes", allow_zero=True)
    else:
        from kvbudget.daemon.config.parallel import rank_weights

        weights = rank_weights(model.weights.weight_bytes, parallel)  # per GPU, as the memory
    total, gpu_name = _gpu_memory(args, parallel.gpus_per_engine)
    return sz.size_from_gpu_memory(
        layout,
        gpu_total_bytes=total,
        weights_bytes=weights,
        gpu_memory_utilization=util,
        activation_reserve_bytes=activation,
        weights_estimated=args.weights_bytes is None,
        gpu_name=gpu_name,
    )


def _gpu_memory(args: argparse.Namespace, gpus: int) -> tuple[int, str]:
    """The GPU's total memory and name: --gpu-memory-bytes (no name), else the local GPUs'
    of one engine (the first `gpus` visible ones), the smallest, as the daemon sizes it."""
    if args.gpu_memory_bytes is not None:
        return parse_size(args.gpu_memory_bytes, "--gpu-memory-bytes"), ""
    from kvbudget.daemon.config.gpu import probe_gpu, smallest_total

    probe = probe_gpu(count=gpus)
    total, why = smallest_total(probe)
    if total is None:
        raise CLIError(
            "no memory source: give --gpu-memory-bytes, --kv-cache-memory-bytes or "
            f"--num-gpu-blocks ({why})"
        )
    return total, probe.name


def _does_not_fit(sizing: PoolSizing) -> str:
    if sizing.shortfall_bytes:
        return (
            f"no memory left for the KV cache: weights {fmt_bytes(sizing.weights_bytes)} + "
            f"activations {fmt_bytes(sizing.activation_reserve_bytes)} exceed "
            f"{sizing.gpu_memory_utilization:g} x {fmt_bytes(sizing.gpu_total_bytes)} by "
            f"{fmt_bytes(sizing.shortfall_bytes)}"
        )
    return (
        f"{fmt_bytes(sizing.kv_cache_bytes)} for the KV cache is less than one block "
        f"({fmt_bytes(sizing.bytes_per_block)})"
    )


def _one_token_request(least: int) -> str:
    """`a one-token request needs 7 blocks, plus the null block`."""
    return f"a one-token request needs {blocks_text(least - 1)}, plus the null block"


def _no_usable_block(sizing: PoolSizing, least: int) -> str:
    """The one line for a pool of one block: it is the null block, so the daemon (which
    refuses such a pool) would have nothing to hand out, and every figure would be 0."""
    null = "block 0 is the null block, which no request gets"
    if sizing.source == "num_gpu_blocks":
        return (
            f"--num-gpu-blocks {sizing.num_blocks} leaves no usable block ({null}): "
            f"give at least {least:,} ({_one_token_request(least)})"
        )
    least_bytes = f"{fmt_bytes(least * sizing.bytes_per_block)}, {blocks_text(least)} ({_one_token_request(least)})"
    if sizing.source == "kv_cache_memory_bytes":
        knob = f"give --kv-cache-memory-bytes at least {least_bytes}"
    else:
        knob = (
            f"leave the KV cache at least {least_bytes}: a larger --gpu-memory-bytes or "
            "--gpu-memory-utilization, or smaller --weights-bytes or --activation-reserve-bytes"
        )
    return (
        f"{fmt_bytes(sizing.kv_cache_bytes)} for the KV cache makes {blocks_text(sizing.num_blocks)} of "
        f"{fmt_bytes(sizing.bytes_per_block)}, which leaves no usable block ({null}): {knob}"
    )


def _lengths(args: argparse.Namespace, model: ModelInfo, num_blocks: int, F: int) -> Lengths:
    from kvbudget.daemon.core.budget import max_model_len_that_fits
    from kvbudget.daemon.config.hf_config import resolve_max_model_len

    text = args.max_model_len
    if text is None:
        max_len, source = model.max_model_len, "model"
    elif text.strip().lower() == "auto":
        # On the blocks the daemon has usable: one request at vLLM's N-block figure would
        # need the null block too, and the daemon rejects it as never fitting.
        max_len = max_model_len_that_fits(daemon_usable_blocks(num_blocks), model.layout, F, model.max_model_len)
        source = "auto"
        if max_len == 0:
            least = least_blocks(model.layout, F)
            raise CLIError(
                f"--max-model-len auto: not even a one-token request fits the pool: it has "
                f"{blocks_text(num_blocks)}, and one needs {least - 1:,} plus the null block; give it at least {least:,}"
            )
    else:
        requested, source = parse_count(text, "--max-model-len"), "given"
        try:  # the daemon's start asks the same question (hf_config)
            max_len = resolve_max_model_len(model, requested, name="--max-model-len")
        except ValueError as exc:
            raise CLIError(str(exc)) from None
    tokens = max_len
    if args.tokens_per_request is not None:
        tokens = parse_count(args.tokens_per_request, "--tokens-per-request")
        if tokens > max_len:
            raise CLIError(f"--tokens-per-request {tokens} exceeds max_model_len {max_len}")
    return Lengths(max_len, source, tokens)
