"""`kvbudget daemon`'s config flags, grouped as the config file's sections are: every key
has a flag of the same name (`--num-gpu-blocks` for `[pool] num_gpu_blocks`), whose help
says what it is for, its key, its default and, for a closed set, its choices."""

from __future__ import annotations

import argparse
import dataclasses

SPECIAL = {"tenants", "listen"}  # fields whose flag takes another shape than one value
SECTION_TITLES = {
    "model": "[model] the model the pool is for",
    "pool": "[pool] the pool's size and memory (one memory source: num_gpu_blocks, "
            "kv_cache_memory_bytes, or the GPU's memory)",
    "parallel": "[parallel] the engine's layout over GPUs (vLLM's names; sizes are per GPU)",
    "admission": "[admission] who gets blocks, and when",
    "tenants": "[tenants.NAME] quotas and fair-share weights",
    "server": "[server] listening, credentials, sessions",
    "log": "[log] the decision log",
    "metrics": "[metrics] the Prometheus endpoint",
}
HELP = {
    "model": "a preset name or a model's config.json (or its folder)",
    "kv_dtype": "what a K or V element is stored as: auto (the model's dtype), bf16, fp16, fp8, int4, int2",
    "block_size": "tokens per block",
    "max_model_len": "the longest request in tokens; unset: the model's",
    "max_num_batched_tokens": "the engine's tokens per step",
    "token_cap": "the engine caps every attention layer's cache at this many tokens",
    "tensor_parallel_size": "GPUs a layer's heads are split over",
    "pipeline_parallel_size": "GPUs the layers are split over, in stages",
    "data_parallel_size": "replicas; each has its own pool and daemon (1 only)",
    "device": "auto, cpu, cuda or cuda:N",
    "memory_mode": "owned: the daemon allocates the pool; accounting: it only counts blocks",
    "gpu_memory_utilization": "the share of the GPU's memory the engine may use",
    "kv_cache_memory_bytes": "bytes for the pool",
    "num_gpu_blocks": "the pool's blocks, the null block included",
    "gpu_memory_bytes": "the GPU's memory; unset: what NVML reads",
    "weights_bytes": "the model's weights; unset: estimated from its config",
    "activation_reserve_bytes": "the activation peak to keep free",
    "gpu_probe_interval_s": "seconds between GPU memory readings",
    "policy": "how admission reserves blocks",
    "admit_on": "optimistic admits once this fits",
    "enable_prefix_caching": "reuse cached prompt blocks",
    "watermark": "share of the pool optimistic keeps free",
    "lookahead_tokens": "tokens a running request may need before its next step",
    "max_queue_len": "waiting requests at most; 0: no bound",
    "backfill_depth": "requests a smaller one may pass in the queue",
    "max_head_wait_s": "after this, nothing passes the queue's head",
    "predictive_admission": "predictive admits while the predicted peak fits (peak), or reserves (reserve)",
    "peak_quantile": "the output-length quantile the peak predicts with",
    "optimistic_peak": "optimistic too admits only while the predicted peak fits",
    "reject_over_quota": "reject, not queue, a request over its tenant's quota",
    "tokens_file": "bearer tokens and their roles (TOML)",
    "tls_cert_file": "the server's certificate (PEM)",
    "tls_key_file": "its private key (PEM)",
    "tls_client_ca_file": "mutual TLS: the CAs clients' certificates are signed by",
    "allow_insecure_tcp": "TCP without tokens or TLS: loopback benches only",
    "lease_ttl_s": "seconds an engine's session lasts without a call",
    "watch_max_hz": "Watch updates per second at most",
    "drain_timeout_s": "seconds a stop waits for running requests",
    "log_level": "the daemon's own messages",
    "max_ops_per_step": "ops in one Step at most",
    "db_path": "the decision log's SQLite file",
    "retention_days": "days of decisions kept; 0: forever",
    "retention_max_rows": "rows kept at most; 0: no cap",
    "retention_max_bytes": "the log's size at most; 0: no cap",
    "metrics_address": "where /metrics is served; \"\": off",
}


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per DaemonConfig field, in a group per config section."""
    from kvbudget.daemon.config.hf_config import preset_names
    from kvbudget.daemon.config.settings import (
        LOG_LEVELS, MEMORY_MODES, SIZE_FIELDS, DaemonConfig, file_key, flag_name,
    )
    from kvbudget.daemon.core.admission_config import ADMIT_ON, POLICIES, PREDICTIVE_ADMISSION

    choices = {"policy": POLICIES, "admit_on": ADMIT_ON, "predictive_admission": PREDICTIVE_ADMISSION,
               "memory_mode": MEMORY_MODES, "log_level": LOG_LEVELS}
    groups = {section: parser.add_argument_group(title) for section, title in SECTION_TITLES.items()}
    groups["server"].add_argument(
        "--listen", action="append", metavar="ADDRESS",
        help="unix:///PATH or HOST:PORT, repeat for several (server.listen; default "
             "unix:///run/kvbudget/kvbudget.sock)",
    )
    groups["tenants"].add_argument(
        "--tenant", action="append", metavar="NAME=SHARE[:WEIGHT]",
        help="a tenant's share of the pool (0-1) and fair-share weight; overrides that tenant of "
             "the file, the others stay (tenants.NAME)",
    )
    for f in dataclasses.fields(DaemonConfig):
        if f.name in SPECIAL:
            continue
        key = file_key(f.name)
        group = groups[key.partition(".")[0]]
        kind = _flag_type(str(f.type))
        default = f", default {f.default}" if f.default not in (None, "") else ""
        if f.name == "block_size":  # (None: the model decides, hf_config.default_block_size)
            default = ", default 16; 64 for MLA models"
        help_text = f"{HELP[f.name]} ({key}{default})"
        flag = flag_name(f.name)  # (config errors spell flags this way too)
        if kind is bool:
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None,
                               help=help_text)
        elif f.name in SIZE_FIELDS:
            group.add_argument(flag, dest=f.name, type=_size, default=None, metavar="SIZE",
                               help=f"{help_text}; bytes, or a size such as 8GiB, 80GB or 80e9")
        elif f.name == "model":
            group.add_argument(flag, dest=f.name, default=None, metavar="PRESET|PATH",
                               help=f"{help_text}; presets: {', '.join(preset_names())}")
        else:
            group.add_argument(flag, dest=f.name, type=kind or str, default=None, help=help_text,
                               choices=choices.get(f.name), metavar=_metavar(f.name, kind))


def _metavar(name: str, kind) -> str | None:
    if name.endswith("_file") or name == "db_path":
        return "FILE"
    if name in ("kv_dtype", "device"):
        return name.rpartition("_")[2].upper()
    if name == "metrics_address":
        return "HOST:PORT"
    return {int: "N", float: "X"}.get(kind) if name not in ("policy", "admit_on", "memory_mode", "log_level") else None


def _flag_type(annotation: str):
    base = annotation.replace(" | None", "")
    return {"str": str, "int": int, "float": float, "bool": bool}.get(base)


def _size(text: str) -> int:
    """A SIZE flag's value: `8GiB`, `80GB`, `80e9` or whole bytes, as `kvbudget estimate` takes."""
    from kvbudget.units import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:  # (argparse: "argument --FLAG: ...", one line)
        raise argparse.ArgumentTypeError(f"{exc}, got {text!r}") from None
