"""`kvbudget replay --offline`: the admission core in this process, on the model and pool
the flags give (as a daemon started with the same flags would size it)."""

from __future__ import annotations

import argparse
from dataclasses import replace

from kvbudget.cli.replay_flags import admission_settings, engine_config, int_flag
from kvbudget.cli.replay_variants import Variant
from kvbudget.client.errors import CLIError

DEFAULT_MODEL = "llama-3.1-8b"
DEFAULT_KV_BYTES = 16 * 2**30  # offline pool when no size is given: 16 GiB of KV cache


def run(args: argparse.Namespace, trace, variants: list[Variant]):
    from kvbudget.daemon.core.admission import AdmissionError
    from kvbudget.traces.replay import run_offline

    setup = replace(offline_setup(args, trace), spread_s=trace.arrival_quantum_s)
    if args.config and args.policy is None and args.compare is None:
        variants = [Variant(setup.policy, setup.policy)]  # the file's, as the daemon would start with
    runs = [(v, variant_setup(setup, v)) for v in variants]  # every run's settings checked first
    if getattr(args, "hosts_routes", None):
        from kvbudget.cli import replay_hosts

        (variant, one), = runs
        return replay_hosts.run(trace, one, variant.policy, *args.hosts_routes)
    results = []
    for variant, one in runs:
        try:
            result = run_offline(trace.requests, one, variant.policy, trace_name=trace.name)
        except AdmissionError as exc:  # (an op the core refused: names the field)
            raise CLIError(f"--{exc.field.replace('_', '-')}: {exc}") from None
        if variant.named:
            result.summary["variant"] = variant.label
        result.summary["notes"] = list(setup.layout.notes)  # as `kvbudget estimate` reports them
        results.append(result)
    return results


def variant_setup(setup, variant: Variant):
    """The common setup with a run's own settings over it, checked as the daemon checks
    its config (a bad value is one line naming the flag, or the --compare run, it came from)."""
    from kvbudget.daemon.core.admission import AdmissionError
    from kvbudget.traces.replay import admission_config

    engine = setup.engine
    if variant.grow_ahead_blocks is not None:
        if engine.engine_model == "vllm":
            raise CLIError(f"--compare {variant.label!r}: grow_ahead_blocks: the vllm engine model grows "
                           "to the end of each block, as kvbudget.vllm does; drop it")
        engine = replace(engine, grow_ahead_blocks=variant.grow_ahead_blocks)
    one = replace(setup, admission=tuple({**dict(setup.admission), **dict(variant.settings)}.items()), engine=engine)
    try:
        admission_config(one, variant.policy).validate()
    except AdmissionError as exc:
        if exc.field in dict(variant.settings):
            flag = f"--compare {variant.label!r}"  # (the error names the key)
        elif exc.field in dict(setup.admission):
            flag = f"--set admission.{exc.field}"
        else:
            flag = f"--{exc.field.replace('_', '-')}"
        raise CLIError(f"{flag}: {exc}") from None
    return one


def offline_setup(args: argparse.Namespace, trace):
    from kvbudget.cli.cmd_estimate import load_rank_model, parallel_flags, parse_count, parse_size
    from kvbudget.daemon.config import sizing
    from kvbudget.daemon.config.hf_config import resolve_max_model_len
    from kvbudget.traces.replay import ReplaySetup

    block_size = int_flag(args.block_size, "--block-size")  # None: the model's (16; 64 for MLA)
    token_cap = int_flag(args.token_cap, "--token-cap")
    # One GPU's layout (as estimate's): only the bytes per block change (and a hybrid's
    # block size), so only a pool given in bytes comes out different.
    model = load_rank_model(
        args.model or DEFAULT_MODEL, parallel_flags(args), model_prefix="--model: ",
        block_size=block_size, token_cap=token_cap,
    )  # fmt: skip
    layout = model.layout
    if args.num_gpu_blocks and args.kv_cache_memory_bytes:
        raise CLIError("--num-gpu-blocks and --kv-cache-memory-bytes exclude each other")
    if args.num_gpu_blocks:
        pool = sizing.size_from_num_blocks(layout, parse_count(args.num_gpu_blocks, "--num-gpu-blocks"))
    else:
        kv_bytes = (
            parse_size(args.kv_cache_memory_bytes, "--kv-cache-memory-bytes")
            if args.kv_cache_memory_bytes
            else DEFAULT_KV_BYTES
        )
        pool = sizing.size_from_kv_cache_bytes(layout, kv_bytes)
    # Sizing counts blocks as vLLM's num_gpu_blocks does, the null block included; like
    # the daemon (server/lifecycle.py), hand the admission core the usable ones, so the what-if's
    # pool, and the num_blocks it reports, are a daemon's with the same flag.
    if pool.num_blocks < 2:
        raise CLIError(
            f"the pool gets {pool.num_blocks} blocks of {layout.bytes_per_block} bytes; it needs at least 2"
            " (one is the null block): raise --num-gpu-blocks / --kv-cache-memory-bytes"
        )
    try:  # as estimate and the daemon do: not past the model's max_position_embeddings
        max_model_len = resolve_max_model_len(model, int_flag(args.max_model_len, "--max-model-len"), name="--max-model-len")
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    engine = engine_config(
        args, trace, max_model_len=max_model_len,
        max_num_batched_tokens=int_flag(args.max_num_batched_tokens, "--max-num-batched-tokens") or 8192,
    )  # fmt: skip
    return ReplaySetup(
        layout=layout,
        num_blocks=pool.num_blocks - 1,
        engine=engine,
        model=model.name,
        engines=int_flag(args.engines, "--engines") or 1,
        seed=int_flag(args.seed, "--seed", minimum=0) or 0,
        **_admission(args),
    )


# The daemon config's [admission] keys that are AdmissionConfig fields of the same name.
FILE_ADMISSION = ("admit_on", "watermark", "lookahead_tokens", "max_queue_len", "backfill_depth",
                  "max_head_wait_s", "reject_over_quota", "predictive_admission", "peak_quantile",
                  "optimistic_peak")  # fmt: skip


def _admission(args: argparse.Namespace) -> dict[str, object]:
    """ReplaySetup's admission settings: the daemon's defaults, then --config FILE's
    [admission] and [tenants], then --set and --no-prefix-caching."""
    settings: dict[str, object] = {}
    out: dict[str, object] = {"enable_prefix_caching": not args.no_prefix_caching}
    if args.config:
        from kvbudget.daemon.config.loading import load_config
        from kvbudget.daemon.config.settings import ConfigError

        try:  # (the file's model need not be given, nor be the one replayed: --model is)
            config = load_config(args.config, {"model": args.model or DEFAULT_MODEL})
        except (ConfigError, OSError) as exc:
            raise CLIError(f"--config: {exc}") from None
        settings = {name: getattr(config, name) for name in FILE_ADMISSION}
        out["policy"] = config.policy
        out["enable_prefix_caching"] = config.enable_prefix_caching and not args.no_prefix_caching
        out["tenants"] = tuple((name, q.max_share, q.weight) for name, q in sorted(config.tenants.items()))
    settings.update(admission_settings(args.set))
    out["admission"] = tuple(settings.items())
    return out
