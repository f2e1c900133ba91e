"""The daemon's configuration: a TOML file plus command-line overrides, validated once at
start (`loading.load_config`) into a frozen `DaemonConfig`. Every mistake is a `ConfigError`
naming the key as the user gave it (`pool.gpu_memory_utilization` in the file, the
setting's name for a flag). `deploy/kvbudget.toml` documents every key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from kvbudget.daemon.core.admission import AdmissionConfig

DEFAULT_DB_PATH = "/var/lib/kvbudget/decisions.db"  # systemd StateDirectory=kvbudget
DEFAULT_MAX_OPS_PER_STEP = 10_000  # ~0.2 s of the event loop at most; the core's own cap is 100,000
DEFAULT_LISTEN = "unix:///run/kvbudget/kvbudget.sock"  # systemd RuntimeDirectory=kvbudget
LOG_LEVELS = ("debug", "info", "warning", "error")  # of the daemon's own messages (stderr: the journal)
MEMORY_MODES = ("owned", "accounting")
# The decision log's size cap unless set: the disk is shared with the OS and the engines'
# own files, and 30 days of decisions on a busy host would fill it (a row is ~650 bytes
# with its indexes when an ADMIT carries the block table of a 1,200-token prompt, so ~16
# million rows in 10 GiB: about 18 hours at 250 decisions/s, 6 days at 30/s). Like
# journald's SystemMaxUse: whichever of age and size comes first.
DEFAULT_RETENTION_MAX_BYTES = 10 * 2**30
FILE_KEY = "config"  # ConfigError.key for a file that cannot be read or parsed


class ConfigError(Exception):
    """A bad configuration value; `key` names it (e.g. "pool.gpu_memory_utilization")."""

    def __init__(self, key: str, message: str, *, source: str = "") -> None:
        self.key = key
        self.message = message
        self.source = source
        # Problems with the whole file (key FILE_KEY) read "no config file at PATH".
        shown_key = "" if key == FILE_KEY else key
        super().__init__(": ".join(part for part in (source, shown_key, message) if part))


@dataclass(frozen=True)
class TenantQuota:
    max_share: float | None = None  # share of the pool the tenant may hold; None: no cap
    weight: float = 1.0  # fair-share weight when tenants compete


@dataclass(frozen=True)
class DaemonConfig:
    # [model]
    model: str = ""  # preset name, HF config.json path, or a directory holding one
    kv_dtype: str = "auto"  # "auto": the model's dtype
    block_size: int | None = None  # None: 16, or 64 for an MLA model (hf_config.default_block_size)
    max_model_len: int | None = None  # None: the model's
    max_num_batched_tokens: int = 8192
    token_cap: int | None = None  # the engine compresses every attention layer to this many tokens
    # [pool]
    device: str = "auto"  # "auto" | "cpu" | "cuda" | "cuda:N"
    memory_mode: str = "owned"  # "owned": the daemon allocates the pool; "accounting": engines do
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_bytes: int | None = None  # explicit pool bytes (excludes num_gpu_blocks)
    num_gpu_blocks: int | None = None  # explicit block count (excludes kv_cache_memory_bytes)
    gpu_memory_bytes: int | None = None  # override the device's total memory
    weights_bytes: int | None = None  # None: from the model's parameter count
    activation_reserve_bytes: int | None = None  # None: sizing's estimate
    gpu_probe_interval_s: float = 5.0
    # [parallel] the engine's layout, vLLM's names (daemon/config/parallel.py)
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1  # more than 1: refused, one daemon per replica
    # [admission]
    policy: str = "optimistic"
    admit_on: str = "whole_prompt"  # optimistic: "whole_prompt" (vLLM's default) or "first_chunk"
    enable_prefix_caching: bool = True
    watermark: float = 0.015
    lookahead_tokens: int = 0
    max_queue_len: int = 0
    backfill_depth: int = 16
    max_head_wait_s: float = 0.0  # 0: aging follows the workload alone (core/aging.py)
    reject_over_quota: bool = False
    predictive_admission: str = "peak"  # predictive: "peak" (future-peak admission) or "reserve"
    peak_quantile: float = 0.5  # future-peak admission: quantile of what a request has left
    optimistic_peak: bool = False  # optimistic admits only while the predicted peak fits too
    # [tenants.NAME]
    tenants: Mapping[str, TenantQuota] = field(default_factory=dict)
    # [server]
    listen: tuple[str, ...] = (DEFAULT_LISTEN,)
    tokens_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_client_ca_file: str = ""  # mutual TLS: clients present a certificate signed by a CA in it
    allow_insecure_tcp: bool = False  # TCP without token or TLS: only for loopback benches
    lease_ttl_s: float = 10.0
    watch_max_hz: float = 30.0
    drain_timeout_s: float = 10.0
    log_level: str = "info"  # one of LOG_LEVELS
    # One step's ops (a 100,000-op step held the event loop 2 s: other engines' leases lapsed)
    max_ops_per_step: int = DEFAULT_MAX_OPS_PER_STEP
    # [log]
    db_path: str = DEFAULT_DB_PATH
    retention_days: float = 30.0  # 0: keep forever
    retention_max_rows: int = 0  # 0: no row cap
    retention_max_bytes: int = DEFAULT_RETENTION_MAX_BYTES  # 0: no size cap
    # [metrics]
    metrics_address: str = ""  # "" = off, e.g. "127.0.0.1:9401"

    @property
    def retention_s(self) -> float | None:
        return self.retention_days * 86400.0 if self.retention_days else None

    @property
    def retention_rows(self) -> int | None:
        return self.retention_max_rows or None

    @property
    def retention_bytes(self) -> int | None:
        return self.retention_max_bytes or None

    @property
    def tls_enabled(self) -> bool:
        return bool(self.tls_cert_file)

    def admission_config(self, max_model_len: int) -> AdmissionConfig:
        """The core's config, once the model's max_model_len is known."""
        return AdmissionConfig(
            max_model_len=self.max_model_len or max_model_len,
            max_num_batched_tokens=self.max_num_batched_tokens,
            policy=self.policy,
            admit_on=self.admit_on,
            enable_prefix_caching=self.enable_prefix_caching,
            lookahead_tokens=self.lookahead_tokens,
            watermark=self.watermark,
            max_queue_len=self.max_queue_len,
            backfill_depth=self.backfill_depth,
            max_head_wait_s=self.max_head_wait_s,
            reject_over_quota=self.reject_over_quota,
            predictive_admission=self.predictive_admission,
            peak_quantile=self.peak_quantile,
            optimistic_peak=self.optimistic_peak,
        )


class Size:
    """A `Key` kind: a byte count, written as an integer or as a size (`"8GiB"`, `"80GB"`,
    `"80e9"`: the forms `kvbudget estimate` takes, kvbudget.units.parse_size); the field
    holds a plain int."""


@dataclass(frozen=True)
class Key:
    section: str
    name: str  # key in the section
    field: str  # DaemonConfig field
    kind: type  # str, int, float, bool, tuple (a list of strings), or Size (bytes)
    optional: bool = False  # absent means None


KEYS: tuple[Key, ...] = (
    Key("model", "name", "model", str),
    Key("model", "kv_dtype", "kv_dtype", str),
    Key("model", "block_size", "block_size", int, optional=True),
    Key("model", "max_model_len", "max_model_len", int, optional=True),
    Key("model", "max_num_batched_tokens", "max_num_batched_tokens", int),
    Key("model", "token_cap", "token_cap", int, optional=True),
    Key("pool", "device", "device", str),
    Key("pool", "memory_mode", "memory_mode", str),
    Key("pool", "gpu_memory_utilization", "gpu_memory_utilization", float),
    Key("pool", "kv_cache_memory_bytes", "kv_cache_memory_bytes", Size, optional=True),
    Key("pool", "num_gpu_blocks", "num_gpu_blocks", int, optional=True),
    Key("pool", "gpu_memory_bytes", "gpu_memory_bytes", Size, optional=True),
    Key("pool", "weights_bytes", "weights_bytes", Size, optional=True),
    Key("pool", "activation_reserve_bytes", "activation_reserve_bytes", Size, optional=True),
    Key("pool", "gpu_probe_interval_s", "gpu_probe_interval_s", float),
    Key("parallel", "tensor_parallel_size", "tensor_parallel_size", int),
    Key("parallel", "pipeline_parallel_size", "pipeline_parallel_size", int),
    Key("parallel", "data_parallel_size", "data_parallel_size", int),
    Key("admission", "policy", "policy", str),
    Key("admission", "admit_on", "admit_on", str),
    Key("admission", "enable_prefix_caching", "enable_prefix_caching", bool),
    Key("admission", "watermark", "watermark", float),
    Key("admission", "lookahead_tokens", "lookahead_tokens", int),
    Key("admission", "max_queue_len", "max_queue_len", int),
    Key("admission", "backfill_depth", "backfill_depth", int),
    Key("admission", "max_head_wait_s", "max_head_wait_s", float),
    Key("admission", "reject_over_quota", "reject_over_quota", bool),
    Key("admission", "predictive_admission", "predictive_admission", str),
    Key("admission", "peak_quantile", "peak_quantile", float),
    Key("admission", "optimistic_peak", "optimistic_peak", bool),
    Key("server", "listen", "listen", tuple),
    Key("server", "tokens_file", "tokens_file", str),
    Key("server", "tls_cert_file", "tls_cert_file", str),
    Key("server", "tls_key_file", "tls_key_file", str),
    Key("server", "tls_client_ca_file", "tls_client_ca_file", str),
    Key("server", "allow_insecure_tcp", "allow_insecure_tcp", bool),
    Key("server", "lease_ttl_s", "lease_ttl_s", float),
    Key("server", "watch_max_hz", "watch_max_hz", float),
    Key("server", "drain_timeout_s", "drain_timeout_s", float),
    Key("server", "log_level", "log_level", str),
    Key("server", "max_ops_per_step", "max_ops_per_step", int),
    Key("log", "db_path", "db_path", str),
    Key("log", "retention_days", "retention_days", float),
    Key("log", "retention_max_rows", "retention_max_rows", int),
    Key("log", "retention_max_bytes", "retention_max_bytes", Size),
    Key("metrics", "address", "metrics_address", str),
)
KEY_BY_FIELD = {k.field: k for k in KEYS}
SIZE_FIELDS = frozenset(k.field for k in KEYS if k.kind is Size)  # (their flags take sizes too)
SECTIONS = tuple(dict.fromkeys(k.section for k in KEYS)) + ("tenants",)
TENANT_KEYS = ("max_share", "weight")


@dataclass(frozen=True)
class Failure:
    """A check's ConfigError, naming the value as the user gave it: the file's key (and the
    file), or the flag's setting."""

    origin: Mapping[str, tuple[str, str]]  # field -> (key as written, source: the file or "")
    source: str  # the config file, "" without one

    def __call__(self, field_name: str, message: str) -> ConfigError:
        if field_name in self.origin:
            key, where = self.origin[field_name]
        else:  # a default that another key made invalid
            spec = KEY_BY_FIELD.get(field_name)
            key, where = (f"{spec.section}.{spec.name}" if spec else field_name), self.source
        return ConfigError(key, message, source=where)

    def given_by_flag(self, field_name: str) -> bool:
        return field_name in self.origin and not self.origin[field_name][1]


def file_key(field_name: str) -> str:
    """The file's key ("pool.num_gpu_blocks") of a DaemonConfig field, for flags' help."""
    spec = KEY_BY_FIELD[field_name]
    return f"{spec.section}.{spec.name}"


def flag_name(field_name: str) -> str:
    """The `kvbudget daemon` flag ("--num-gpu-blocks") of a DaemonConfig field."""
    return "--" + field_name.replace("_", "-")


assert {k.field for k in KEYS} | {"tenants"} == {f.name for f in dataclasses.fields(DaemonConfig)}
