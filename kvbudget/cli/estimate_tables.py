"""`kvbudget estimate`'s human output: the report (estimate_report) as lines and two tables."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from kvbudget.units import format_bytes

if TYPE_CHECKING:
    from rich.console import Console


def fmt_bytes(n: int | None) -> str:
    return "-" if n is None else format_bytes(n)


def blocks_text(n: int) -> str:
    """`1 block`, `1,024 blocks`."""
    return f"{n:,} block" + ("" if n == 1 else "s")


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


def print_tables(report: dict[str, Any], least: int) -> None:
    """The human report; `least`: the fewest blocks on which one request fits (least_blocks)."""
    from kvbudget.cli.console import cli_console

    # The labels are markup; what comes from the user's files (the model's path and
    # architecture, the GPU's name, notes quoting config fields) is escaped: "[b]" in a
    # path is text.
    console = cli_console(markup=True, wide_when_piped=False)
    _print_header(console, report)
    if report["parallel"]["gpus"] > 1:
        console.print(_parallel_table(report["parallel"]), soft_wrap=True)
    console.print(_groups_table(report))
    console.print(_concurrency_table(report))
    console.print(
        f"layer-aware, naive: on the daemon's {report['daemon_usable_blocks']:,} usable blocks; "
        f"vLLM's: on {report['num_blocks']:,}",
        soft_wrap=True,
    )
    _print_warnings(console, report, least)


def _print_header(console: Console, report: dict[str, Any]) -> None:
    """Model, block, pool and lengths: where the figures in the tables come from."""
    from rich.markup import escape

    console.print(
        f"[bold]model[/]   {escape(report['model'])} ({escape(report['architecture'])}), "
        f"{report['num_layers']} layers, KV cache {report['kv_dtype']}"
    )
    console.print(
        f"[bold]block[/]   {report['block_size']} tokens: page "
        f"{fmt_bytes(report['page_size_bytes'])} x {report['group_size']} layers = {fmt_bytes(report['bytes_per_block'])}"
    )
    _print_pool_source(console, report["sizing"])
    console.print(f"        {_pool_tokens_line(report)}", soft_wrap=True)
    console.print(f"        {_usable_line(report)}", soft_wrap=True)
    console.print(
        f"[bold]lengths[/] max_model_len {report['max_model_len']:,} "
        f"({report['max_model_len_source']}), max_num_batched_tokens "
        f"{report['max_num_batched_tokens']:,}"
    )


def _print_pool_source(console: Console, s: dict[str, Any]) -> None:
    from rich.markup import escape

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


def _parallel_table(p: dict[str, Any]) -> Any:
    """Per GPU, per engine, all engines: vLLM makes num_gpu_blocks the same on every worker
    of an engine, and data-parallel replicas are separate engines with separate pools."""
    from rich.table import Table

    title = (
        f"tensor {p['tensor_parallel_size']} x pipeline {p['pipeline_parallel_size']} = "
        f"{p['gpus_per_engine']} GPUs per engine, data parallel {p['data_parallel_size']}: "
        f"{p['engines']} engine{'s, each with' if p['engines'] > 1 else ' with'} its own pool"
    )
    table = Table(title=title)
    for name in ("", "per GPU", "per engine", f"all engines (dp {p['engines']})"):
        table.add_column(name, justify="left" if not name else "right")
    blocks = f"{p['num_blocks_per_engine']:,}"
    table.add_row("blocks", blocks, blocks, f"{p['num_blocks_all_engines']:,}")
    table.add_row(
        "bytes per block", f"{p['bytes_per_block_per_gpu']:,} B",
        f"{p['bytes_per_block_per_engine']:,} B", "",
    )  # fmt: skip
    table.add_row(
        "KV cache", _fmt_gb(p["kv_cache_bytes_per_gpu"]), _fmt_gb(p["kv_cache_bytes_per_engine"]),
        _fmt_gb(p["kv_cache_bytes_per_engine"] * p["engines"]),
    )  # fmt: skip
    table.add_row(
        "requests at once", "", _fmt_x(p["max_concurrency_per_engine"]),
        _fmt_x(p["max_concurrency_all_engines"]),
    )  # fmt: skip
    heads = ", ".join(str(h) for h in p["kv_heads_per_rank"]) or "- (latent, replicated)"
    stages = "; ".join(f"{a}-{b}" for a, b in p["stage_layers"])
    table.caption = (
        f"one pool per engine: every GPU of it has the same block count (vLLM takes the "
        f"minimum over its workers), each block spread over all of them; engines do not share "
        f"blocks. KV heads per rank: {heads}; layers per pipeline stage: {stages}"
    )
    return table


def _groups_table(report: dict[str, Any]) -> Any:
    from rich.table import Table

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
    return groups


def _concurrency_table(report: dict[str, Any]) -> Any:
    from rich.table import Table

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
    return table


def _print_warnings(console: Console, report: dict[str, Any], least: int) -> None:
    """A pool too small for max_model_len (or for anything), then the layout's notes."""
    from rich.markup import escape

    if report["max_model_len_that_fits"] == 0:
        # (not "the longest that does is 0": no length does)
        console.print(
            f"[yellow]no request fits the pool: it has {blocks_text(report['num_blocks'])}, and a one-token "
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
