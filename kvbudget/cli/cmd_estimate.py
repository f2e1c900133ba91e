"""`kvbudget estimate`: pool size and max concurrency for a model, layer-aware vs naive.

Layer-aware concurrency charges each KV-cache group its own worst case (a sliding window
holds about W - 1 + F tokens, a chunked layer C + F, Mamba one state); naive concurrency
charges every layer the full request length, as a system without layer awareness does.
All block arithmetic comes from `kvbudget.daemon.core.budget`.

Block counts are vLLM's (num_gpu_blocks, "GPU KV cache size", "Maximum concurrency"), so
its printed figures can be checked here; but block 0 is the null block, never handed out
(vLLM v1's BlockPool, and the daemon's pool), so `kvbudget daemon` on the same pool hands
out one block fewer. Both are shown: the daemon's usable blocks and concurrency, and
vLLM's figure beside them, labelled.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvbudget import units
from kvbudget.client.errors import CLIError
from kvbudget.units import format_bytes

if TYPE_CHECKING:  # imported lazily at run time, so `kvbudget --help` stays light
    from kvbudget.daemon.config.hf_config import ModelInfo
    from kvbudget.daemon.config.sizing import PoolSizing
    from kvbudget.daemon.core.spec import KVCacheLayout

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
    parser.add_argument("--model", metavar="PRESET|PATH", help="preset name or config.json path")
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
        "--weights-bytes", metavar="SIZE", help="model weights (default: estimated from config)"
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
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")


# ----------------------------------------------------------------------- estimate


@dataclass(frozen=True)
class Lengths:
    max_model_len: int
    max_model_len_source: str  # "model", "given" or "auto"
    tokens_per_request: int


def run(args: argparse.Namespace) -> int:
    from kvbudget.daemon.config.hf_config import load_model
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
    try:
        model = load_model(
            args.model, kv_dtype=kv_dtype, block_size=block_size, token_cap=token_cap
        )
    except ValueError as exc:
        message = str(exc)
        if message.startswith("token_cap "):  # (the model's reader names the setting; here it is a flag)
            message = "--token-cap " + message.removeprefix("token_cap ")
        raise CLIError(message) from None

    sizing = _size_pool(args, model)
    if not sizing.fits:
        raise CLIError(_does_not_fit(sizing))
    least = least_blocks(model.layout, F)
    if daemon_usable_blocks(sizing.num_blocks) == 0:
        # One block is the null block alone: the daemon refuses such a pool, nothing to estimate.
        raise CLIError(_no_usable_block(sizing, least))
    lengths = _lengths(args, model, sizing.num_blocks, F)
    trace = _trace_lengths(args.trace, lengths.max_model_len) if args.trace else None
    report = build_report(model, sizing, lengths, F, trace)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_tables(report, least)
    return 0


def _size_pool(args: argparse.Namespace, model: ModelInfo) -> PoolSizing:
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
        weights = model.weights.weight_bytes
    gpu_name = ""
    if args.gpu_memory_bytes is not None:
        total = parse_size(args.gpu_memory_bytes, "--gpu-memory-bytes")
    else:
        from kvbudget.daemon.config.gpu import probe_gpu

        probe = probe_gpu()
        if not probe.present:
            raise CLIError(
                "no memory source: give --gpu-memory-bytes, --kv-cache-memory-bytes or "
                f"--num-gpu-blocks ({probe.note})"
            )
        total, gpu_name = probe.total_bytes, probe.name
    return sz.size_from_gpu_memory(
        layout,
        gpu_total_bytes=total,
        weights_bytes=weights,
        gpu_memory_utilization=util,
        activation_reserve_bytes=activation,
        weights_estimated=args.weights_bytes is None,
        gpu_name=gpu_name,
    )


def _does_not_fit(sizing: PoolSizing) -> str:
    if sizing.shortfall_bytes:
        return (
            f"no memory left for the KV cache: weights {_fmt_bytes(sizing.weights_bytes)} + "
            f"activations {_fmt_bytes(sizing.activation_reserve_bytes)} exceed "
            f"{sizing.gpu_memory_utilization:g} x {_fmt_bytes(sizing.gpu_total_bytes)} by "
            f"{_fmt_bytes(sizing.shortfall_bytes)}"
        )
    return (
        f"{_fmt_bytes(sizing.kv_cache_bytes)} for the KV cache is less than one block "
        f"({_fmt_bytes(sizing.bytes_per_block)})"
    )


def least_blocks(layout: KVCacheLayout, F: int) -> int:
    """The fewest blocks (vLLM's count, the null block included) on which the daemon admits
    anything: one request of one token, plus the null block."""
    from kvbudget.daemon.core import budget

    return budget.request_worst_case(layout, 1, F).total + 1


def _blocks(n: int) -> str:
    return f"{n:,} block" + ("" if n == 1 else "s")


def _one_token_request(least: int) -> str:
    """`a one-token request needs 7 blocks, plus the null block`."""
    return f"a one-token request needs {_blocks(least - 1)}, plus the null block"


def _no_usable_block(sizing: PoolSizing, least: int) -> str:
    """The one line for a pool of one block: it is the null block, so the daemon (which
    refuses such a pool) would have nothing to hand out, and every figure would be 0."""
    null = "block 0 is the null block, which no request gets"
    if sizing.source == "num_gpu_blocks":
        return (
            f"--num-gpu-blocks {sizing.num_blocks} leaves no usable block ({null}): "
            f"give at least {least:,} ({_one_token_request(least)})"
        )
    least_bytes = f"{_fmt_bytes(least * sizing.bytes_per_block)}, {_blocks(least)} ({_one_token_request(least)})"
    if sizing.source == "kv_cache_memory_bytes":
        knob = f"give --kv-cache-memory-bytes at least {least_bytes}"
    else:
        knob = (
            f"leave the KV cache at least {least_bytes}: a larger --gpu-memory-bytes or "
            "--gpu-memory-utilization, or smaller --weights-bytes or --activation-reserve-bytes"
        )
    return (
        f"{_fmt_bytes(sizing.kv_cache_bytes)} for the KV cache makes {_blocks(sizing.num_blocks)} of "
        f"{_fmt_bytes(sizing.bytes_per_block)}, which leaves no usable block ({null}): {knob}"
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
                f"{_blocks(num_blocks)}, and one needs {least - 1:,} plus the null block; give it at least {least:,}"
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


@dataclass(frozen=True)
class TraceLengths:
    path: str
    num_requests: int
    p50: int
    mean: int
    p99: int
    capped: int  # requests longer than max_model_len, counted at max_model_len


def _trace_lengths(path: str, max_model_len: int) -> TraceLengths:
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


def daemon_usable_blocks(num_blocks: int) -> int:
    """Blocks `kvbudget daemon` hands out on a pool of `num_blocks` (vLLM's count): block 0
    is the null block (the daemon's server takes `num_blocks - 1` for its controller)."""
    return max(0, num_blocks - 1)


def build_report(
    model: ModelInfo, sizing: PoolSizing, lengths: Lengths, F: int, trace: TraceLengths | None
) -> dict[str, Any]:
    """Everything `--json` prints; the tables show the same numbers."""
    from kvbudget.daemon.core import budget

    layout = model.layout
    tokens = lengths.tokens_per_request
    worst = budget.request_worst_case(layout, tokens, F)
    naive = budget.request_naive(layout, tokens)
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

    usable = daemon_usable_blocks(sizing.num_blocks)

    def concurrency(n: int) -> dict[str, Any]:
        return {
            "tokens": n,
            "blocks_per_request": budget.request_worst_case(layout, n, F).total,
            "naive_blocks_per_request": budget.request_naive(layout, n).total,
            "max_concurrency": budget.max_concurrency(sizing.num_blocks, layout, n, F),
            "naive_max_concurrency": budget.naive_max_concurrency(sizing.num_blocks, layout, n),
            "daemon_max_concurrency": budget.max_concurrency(usable, layout, n, F),
            "daemon_naive_max_concurrency": budget.naive_max_concurrency(usable, layout, n),
        }

    fits_len = budget.max_model_len_that_fits(usable, layout, F, model.max_model_len)  # (as auto: the daemon's)
    vllm_concurrency = budget.max_concurrency(sizing.num_blocks, layout, tokens, F)
    sizing_dict = sizing.as_dict()
    sizing_dict["weights_note"] = model.weights.note if sizing.weights_estimated else None
    report: dict[str, Any] = {
        "model": model.name,
        "architecture": model.architecture,
        "num_layers": layout.num_layers,
        "dtype": model.dtype,
        "kv_dtype": model.kv_dtype,
        "num_parameters": model.weights.num_parameters,
        "estimated_weight_bytes": model.weights.weight_bytes,
        "block_size": layout.block_size,
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
        "groups": groups,
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
        "trace": None,
        "notes": list(layout.notes),
    }
    if trace is not None:
        report["trace"] = {
            "path": trace.path,
            "num_requests": trace.num_requests,
            "requests_capped_at_max_model_len": trace.capped,
            "p50": concurrency(trace.p50),
            "mean": concurrency(trace.mean),
            "p99": concurrency(trace.p99),
        }
    return report


# ----------------------------------------------------------------------- output


def _fmt_bytes(n: int | None) -> str:
    return "-" if n is None else format_bytes(n)


def _fmt_gb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e9:,.2f} GB"


def _fmt_x(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:,.2f}"


def _pool_tokens_line(report: dict[str, Any]) -> str:
    """`13,732 blocks = 31,376 tokens in every group (vLLM's GPU KV cache size)`.

    Every token takes a slot in each KV-cache group, so a hybrid model's pool holds
    num_blocks // groups x block_size tokens, the figure vLLM prints, not num_blocks x
    block_size (which overstates it by the number of groups).
    """
    where = " in every group" if report["num_groups"] > 1 else ""
    return (
        f"{report['num_blocks']:,} blocks = {report['kv_tokens']:,} tokens{where} "
        "(vLLM's GPU KV cache size)"
    )


def _usable_line(report: dict[str, Any]) -> str:
    """`13,731 usable by kvbudget daemon (block 0 is the null block)`: what the daemon
    started on this pool hands out, one fewer than the count vLLM prints."""
    return f"{report['daemon_usable_blocks']:,} usable by kvbudget daemon (block 0 is the null block)"


def _print_tables(report: dict[str, Any], least: int) -> None:
    """The human report; `least`: the fewest blocks on which one request fits (least_blocks)."""
    from rich.markup import escape
    from rich.table import Table

    from kvbudget.cli.console import cli_console

    # The labels are markup; what comes from the user's files (the model's path and
    # architecture, the GPU's name, notes quoting config fields) is escaped: "[b]" in a
    # path is text.
    console = cli_console(markup=True, wide_when_piped=False)
    s = report["sizing"]
    console.print(
        f"[bold]model[/]   {escape(report['model'])} ({escape(report['architecture'])}), "
        f"{report['num_layers']} layers, KV cache {report['kv_dtype']}"
    )
    console.print(
        f"[bold]block[/]   {report['block_size']} tokens: page "
        f"{_fmt_bytes(report['page_size_bytes'])} x {report['group_size']} layers = {_fmt_bytes(report['bytes_per_block'])}"
    )
    if s["source"] == "gpu_memory":
        gpu = f" ({escape(s['gpu_name'])})" if s["gpu_name"] else ""
        console.print(
            f"[bold]pool[/]    GPU{gpu} {_fmt_gb(s['gpu_total_bytes'])} x "
            f"{s['gpu_memory_utilization']:g} - weights {_fmt_gb(s['weights_bytes'])}"
            + (" (estimated)" if s["weights_estimated"] else "")
        )
        console.print(
            f"        - activations {_fmt_gb(s['activation_reserve_bytes'])} "
            f"= {_fmt_gb(s['kv_cache_bytes'])} for the KV cache"
        )
    elif s["source"] == "kv_cache_memory_bytes":
        console.print(f"[bold]pool[/]    kv_cache_memory_bytes {_fmt_gb(s['kv_cache_bytes'])}")
    else:
        console.print("[bold]pool[/]    num_gpu_blocks override")
    console.print(f"        {_pool_tokens_line(report)}", soft_wrap=True)
    console.print(f"        {_usable_line(report)}", soft_wrap=True)
    console.print(
        f"[bold]lengths[/] max_model_len {report['max_model_len']:,} "
        f"({report['max_model_len_source']}), max_num_batched_tokens "
        f"{report['max_num_batched_tokens']:,}"
    )

    groups = Table(title="KV-cache groups: blocks one request holds at worst")
    for name in ("group", "layer type", "layers", "window/chunk", "layer-aware", "naive"):
        groups.add_column(name, justify="left" if name == "layer type" else "right")
    for g in report["groups"]:
        extent = g.get("sliding_window") or g.get("attention_chunk_size") or g.get("token_cap")
        groups.add_row(
            str(g["index"]),
            g["layer_type"],
            str(g["num_layers"]),
            f"{extent:,}" if extent else "-",
            f"{g['blocks_per_request']:,}",
            f"{g['naive_blocks_per_request']:,}",
        )
    groups.add_section()
    groups.add_row(
        "total",
        "",
        str(report["num_layers"]),
        "",
        f"{report['blocks_per_request']:,}",
        f"{report['naive_blocks_per_request']:,}",
    )
    console.print(groups)

    table = Table(title="Max concurrency (requests at once)")
    for name in ("tokens per request", "layer-aware", "naive", "gain", "vLLM's figure"):
        table.add_column(name, justify="right")
    rows = [(f"{report['tokens_per_request']:,}", report)]
    if report["trace"]:
        for key in ("p50", "mean", "p99"):
            point = report["trace"][key]
            rows.append((f"trace {key} {point['tokens']:,}", point))
    for label, point in rows:
        aware, naive = point["daemon_max_concurrency"], point["daemon_naive_max_concurrency"]
        gain = aware / naive if naive and not math.isinf(aware) else float("nan")
        table.add_row(label, _fmt_x(aware), _fmt_x(naive), f"x{gain:.2f}", _fmt_x(point["max_concurrency"]))
    console.print(table)
    console.print(
        f"layer-aware, naive: on the daemon's {report['daemon_usable_blocks']:,} usable blocks; "
        f"vLLM's: on {report['num_blocks']:,}",
        soft_wrap=True,
    )
    if report["max_model_len_that_fits"] == 0:
        # (not "the longest that does is 0": no length does)
        console.print(
            f"[yellow]no request fits the pool: it has {_blocks(report['num_blocks'])}, and a one-token "
            f"request needs {least - 1:,} plus the null block; give it at least {least:,}[/]",
            soft_wrap=True,
        )
    elif report["max_model_len_that_fits"] < report["max_model_len"]:
        console.print(
            f"[yellow]one request of {report['max_model_len']:,} tokens does not fit the pool; "
            f"the longest that does is {report['max_model_len_that_fits']:,} "
            "(--max-model-len auto)[/]"
        )
    for note in report["notes"]:
        console.print(f"note: {escape(note)}")
