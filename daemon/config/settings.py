"""The daemon's configuration: a TOML file (`/etc/kvbudget/kvbudget.toml`) plus command-line
overrides, validated once at start into a frozen `DaemonConfig`.

Every mistake is a `ConfigError` whose message names the key (`pool.gpu_memory_utilization`
for a file key, the setting's name for a command-line override), so an operator sees what
to fix in one line. `deploy/kvbudget.toml` documents every key.

The file has sections; each key maps to one `DaemonConfig` field:

    [model]      name, kv_dtype, block_size, max_model_len, max_num_batched_tokens
    [pool]       device, memory_mode, gpu_memory_utilization, kv_cache_memory_bytes,
                 num_gpu_blocks, gpu_memory_bytes, weights_bytes, activation_reserve_bytes,
                 gpu_probe_interval_s
    [admission]  policy, enable_prefix_caching, watermark, lookahead_tokens, max_queue_len,
                 backfill_depth, max_head_wait_s, reject_over_quota
    [tenants.NAME]  max_share, weight
    [server]     listen, tokens_file, tls_cert_file, tls_key_file, tls_client_ca_file,
                 allow_insecure_tcp, lease_ttl_s, watch_max_hz, drain_timeout_s, log_level
    [log]        db_path, retention_days, retention_max_rows, retention_max_bytes
    [metrics]    address
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvbudget.daemon.core.admission import POLICIES, AdmissionConfig
from kvbudget.daemon.core.records import MAX_TENANT_CHARS, OTHER_TENANTS, RESERVED_TENANT
from kvbudget.daemon.config.sizing import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    GPU_ONLY_SETTINGS,
    SOURCE_BLOCKS,
    SOURCE_GPU,
    SOURCE_KV_BYTES,
    memory_source_conflict,
)
from kvbudget.daemon.core.spec import KV_DTYPE_NAMES, KV_DTYPES

DEFAULT_CONFIG_PATH = "/etc/kvbudget/kvbudget.toml"
DEFAULT_DB_PATH = "/var/lib/kvbudget/decisions.db"  # systemd StateDirectory=kvbudget
DEFAULT_LISTEN = "unix:///run/kvbudget/kvbudget.sock"  # systemd RuntimeDirectory=kvbudget
LOG_LEVELS = ("debug", "info", "warning", "error")  # of the daemon's own messages (stderr: the journal)
MEMORY_MODES = ("owned", "accounting")
# The decision log's size cap unless set: the disk is shared with the OS and the engines'
# own files, and 30 days of decisions on a busy host would fill it (a row is ~650 bytes
# with its indexes when an ADMIT carries the block table of a 1,200-token prompt, so ~16
# million rows in 10 GiB: about 18 hours at 250 decisions/s, 6 days at 30/s). Like
# journald's SystemMaxUse: whichever of age and size comes first.
DEFAULT_RETENTION_MAX_BYTES = 10 * 2**30
MIN_RETENTION_MAX_BYTES = 2**20  # below this the schema and indexes alone would not fit
MIN_LEASE_TTL_S = 1.0  # the wire says TTLs in whole seconds (OpenSessionResponse.lease_ttl_s)
FILE_KEY = "config"  # ConfigError.key for a file that cannot be read or parsed
# Block ids and counts, and the plan's token counts, travel as uint32 (protos/): a larger
# value passed every check and then failed start-up with a traceback ("Value out of range").
MAX_WIRE_COUNT = 2**32 - 1
# A unix socket's path fits in sockaddr_un.sun_path (108 bytes with its NUL). gRPC counts
# what follows "unix:" in the address, so `unix:///p` spends two of them on the slashes
# (its own error, "Path name should not have more than 107 characters", came only at the
# bind, after the pool and the log were set up).
MAX_UNIX_ADDRESS_PATH_BYTES = 107
# The pool's size comes from one memory source (daemon/config/sizing.py): the settings of each.
# The GPU's are those its arithmetic uses (sizing.size_from_gpu_memory); without
# gpu_memory_bytes it reads the local GPU's total.
_MEMORY_SOURCES: dict[str, tuple[str, ...]] = {
    SOURCE_BLOCKS: ("num_gpu_blocks",),
    SOURCE_KV_BYTES: ("kv_cache_memory_bytes",),
    SOURCE_GPU: ("gpu_memory_bytes", *GPU_ONLY_SETTINGS),
}
_MEMORY_SOURCE_OF = {name: source for source, names in _MEMORY_SOURCES.items() for name in names}


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
    # [admission]
    policy: str = "optimistic"
    enable_prefix_caching: bool = True
    watermark: float = 0.01
    lookahead_tokens: int = 0
    max_queue_len: int = 0
    backfill_depth: int = 16
    max_head_wait_s: float = 30.0
    reject_over_quota: bool = False
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
    # [log]
    db_path: str = DEFAULT_DB_PATH
    retention_days: float = 30.0  # 0: keep forever
    retention_max_rows: int = 0  # 0: no row cap
    retention_max_bytes: int = DEFAULT_RETENTION_MAX_BYTES  # 0: no size cap
    # [metrics]
    metrics_address: str = ""  # "" = off, e.g. "127.0.0.1:9400"

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
            enable_prefix_caching=self.enable_prefix_caching,
            lookahead_tokens=self.lookahead_tokens,
            watermark=self.watermark,
            max_queue_len=self.max_queue_len,
            backfill_depth=self.backfill_depth,
            max_head_wait_s=self.max_head_wait_s,
            reject_over_quota=self.reject_over_quota,
        )


# --------------------------------------------------------------------- the file's keys
class Size:
    """A `_Key` kind: a byte count, written as an integer or as a size (`"8GiB"`, `"80GB"`,
    `"80e9"`: the forms `kvbudget estimate` takes, kvbudget.units.parse_size); the field
    holds a plain int."""


@dataclass(frozen=True)
class _Key:
    section: str
    name: str  # key in the section
    field: str  # DaemonConfig field
    kind: type  # str, int, float, bool, tuple (a list of strings), or Size (bytes)
    optional: bool = False  # absent means None


_KEYS: tuple[_Key, ...] = (
    _Key("model", "name", "model", str),
    _Key("model", "kv_dtype", "kv_dtype", str),
    _Key("model", "block_size", "block_size", int, optional=True),
    _Key("model", "max_model_len", "max_model_len", int, optional=True),
    _Key("model", "max_num_batched_tokens", "max_num_batched_tokens", int),
    _Key("pool", "device", "device", str),
    _Key("pool", "memory_mode", "memory_mode", str),
    _Key("pool", "gpu_memory_utilization", "gpu_memory_utilization", float),
    _Key("pool", "kv_cache_memory_bytes", "kv_cache_memory_bytes", Size, optional=True),
    _Key("pool", "num_gpu_blocks", "num_gpu_blocks", int, optional=True),
    _Key("pool", "gpu_memory_bytes", "gpu_memory_bytes", Size, optional=True),
    _Key("pool", "weights_bytes", "weights_bytes", Size, optional=True),
    _Key("pool", "activation_reserve_bytes", "activation_reserve_bytes", Size, optional=True),
    _Key("pool", "gpu_probe_interval_s", "gpu_probe_interval_s", float),
    _Key("admission", "policy", "policy", str),
    _Key("admission", "enable_prefix_caching", "enable_prefix_caching", bool),
    _Key("admission", "watermark", "watermark", float),
    _Key("admission", "lookahead_tokens", "lookahead_tokens", int),
    _Key("admission", "max_queue_len", "max_queue_len", int),
    _Key("admission", "backfill_depth", "backfill_depth", int),
    _Key("admission", "max_head_wait_s", "max_head_wait_s", float),
    _Key("admission", "reject_over_quota", "reject_over_quota", bool),
    _Key("server", "listen", "listen", tuple),
    _Key("server", "tokens_file", "tokens_file", str),
    _Key("server", "tls_cert_file", "tls_cert_file", str),
    _Key("server", "tls_key_file", "tls_key_file", str),
    _Key("server", "tls_client_ca_file", "tls_client_ca_file", str),
    _Key("server", "allow_insecure_tcp", "allow_insecure_tcp", bool),
    _Key("server", "lease_ttl_s", "lease_ttl_s", float),
    _Key("server", "watch_max_hz", "watch_max_hz", float),
    _Key("server", "drain_timeout_s", "drain_timeout_s", float),
    _Key("server", "log_level", "log_level", str),
    _Key("log", "db_path", "db_path", str),
    _Key("log", "retention_days", "retention_days", float),
    _Key("log", "retention_max_rows", "retention_max_rows", int),
    _Key("log", "retention_max_bytes", "retention_max_bytes", Size),
    _Key("metrics", "address", "metrics_address", str),
)
_KEY_BY_FIELD = {k.field: k for k in _KEYS}
SIZE_FIELDS = frozenset(k.field for k in _KEYS if k.kind is Size)  # (their flags take sizes too)
_SECTIONS = tuple(dict.fromkeys(k.section for k in _KEYS)) + ("tenants",)
_TENANT_KEYS = ("max_share", "weight")
_TYPE_WORDS = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
               tuple: "a list of strings"}


def _coerce_size(value: object, key: str, source: str) -> int:
    """A byte count: an integer, a whole float (TOML reads `8e9` as one), or a size string."""
    from kvbudget.units import SIZE_EXAMPLES, parse_size

    if isinstance(value, str):
        try:
            return parse_size(value)
        except ValueError as exc:
            raise ConfigError(key, f"{exc}, got {value!r}", source=source) from None
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    raise ConfigError(key, f"must be a whole number of bytes or a size like {SIZE_EXAMPLES}, got {value!r}",
                      source=source)


def _coerce(value: object, kind: type, key: str, source: str) -> object:
    """Check a TOML / override value's type; ints are accepted where numbers are."""
    if kind is Size:
        return _coerce_size(value, key, source)
    ok = (
        isinstance(value, bool) if kind is bool
        else isinstance(value, int) and not isinstance(value, bool) if kind is int
        else isinstance(value, (int, float)) and not isinstance(value, bool) if kind is float
        else isinstance(value, str) if kind is str
        else isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
    )
    if kind is tuple and isinstance(value, str):  # one address given as a string
        return (value,)
    if not ok:
        raise ConfigError(key, f"must be {_TYPE_WORDS[kind]}, got {value!r}", source=source)
    if kind is float:
        number = float(value)  # type: ignore[arg-type]
        # No key takes NaN or infinity (TOML and float() both read them): NaN passes every
        # `<= 0` check, and a lease of NaN seconds failed each session at open.
        if not math.isfinite(number):
            raise ConfigError(key, f"must be a finite number, got {value!r}", source=source)
        return number
    if kind is tuple:
        return tuple(value)  # type: ignore[arg-type]
    return value


def _parse_tenants(raw: object, source: str, key_prefix: str) -> dict[str, TenantQuota]:
    if not isinstance(raw, Mapping):
        raise ConfigError(key_prefix, "must be a table of [tenants.NAME] sections", source=source)
    tenants: dict[str, TenantQuota] = {}
    for name, body in raw.items():
        key = f"{key_prefix}.{name}"
        if isinstance(body, TenantQuota):
            tenants[name] = body
            continue
        if not isinstance(body, Mapping):
            raise ConfigError(key, "must be a table with max_share and/or weight", source=source)
        for unknown in set(body) - set(_TENANT_KEYS):
            raise ConfigError(
                f"{key}.{unknown}",
                f"unknown key {unknown!r} in [{key}] (expected: {', '.join(_TENANT_KEYS)})",
                source=source,
            )
        max_share = body.get("max_share")
        if max_share is not None:
            max_share = _coerce(max_share, float, f"{key}.max_share", source)
        weight = _coerce(body.get("weight", 1.0), float, f"{key}.weight", source)
        quota = TenantQuota(max_share=max_share, weight=weight)  # type: ignore[arg-type]
        # Checked here, where the source is known: the file's tenants and the flags' are merged.
        problem = _tenant_problem(name, quota)
        if problem is not None:
            raise ConfigError(problem[0], problem[1], source=source)
        tenants[name] = quota
    return tenants


def _tenant_problem(name: str, quota: TenantQuota) -> tuple[str, str] | None:
    """(key, message) of a tenant's bad value, or None."""
    key = f"tenants.{name}"
    if not name:
        return "tenants", "a tenant name must not be empty"
    unsendable = _unsendable_tenant_name(name)
    if unsendable is not None:
        return unsendable
    if name == OTHER_TENANTS:
        return key, RESERVED_TENANT
    if quota.max_share is not None and not 0.0 < quota.max_share <= 1.0:
        return f"{key}.max_share", f"must be in (0, 1], got {quota.max_share}"
    if quota.weight <= 0:
        return f"{key}.weight", f"must be positive, got {quota.weight}"
    return None


def _unsendable_tenant_name(name: str) -> tuple[str, str] | None:
    """(key, message) when no engine could send this tenant: gRPC refuses a tenant name that
    is not printable or longer than MAX_TENANT_CHARS, so a quota for it would never apply."""
    if name.isprintable() and len(name) <= MAX_TENANT_CHARS:
        return None
    if not name.isprintable():
        # Written as TOML quotes it, so that the one line stays one line (a newline, a tab).
        key, why = f"tenants.{json.dumps(name)}", "this one has a character that is not printable"
    else:
        key, why = f"tenants.{name}", f"this one has {len(name)}"
    return key, (f"no engine can send this tenant: a tenant name is printable and at most "
                 f"{MAX_TENANT_CHARS} characters ({why})")


def _tenants_with_flags(
    from_file: Mapping[str, TenantQuota], flags: Mapping[str, object]
) -> dict[str, TenantQuota]:
    """The file's tenants with the flags' over them, tenant by tenant and value by value:
    `--tenant batch=0.2` sets batch's share and keeps its weight from the file, and the
    file's other tenants stay (they were all dropped, silently, also at every reload)."""
    merged = dict(from_file)
    for name, quota in _parse_tenants(flags, "", "tenants").items():
        given = flags[name]
        if isinstance(given, Mapping) and name in merged:
            quota = dataclasses.replace(merged[name], **{k: getattr(quota, k) for k in given})
        merged[name] = quota
    return merged


def read_toml_file(path: Path, what: str = "config file") -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(FILE_KEY, f"no {what} at {path}") from None
    except PermissionError:
        raise ConfigError(FILE_KEY, f"cannot read {what} {path}: permission denied") from None
    except IsADirectoryError:
        raise ConfigError(FILE_KEY, f"{what} {path} is a directory") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(FILE_KEY, f"{what} {path} is not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:  # (TOML is UTF-8; tomllib lets the codec's error through)
        raise ConfigError(FILE_KEY, f"{what} {path} is not valid TOML: not UTF-8 at byte {exc.start}") from None


def load_config(
    path: str | os.PathLike[str] | None, overrides: Mapping[str, object] | None = None,
    *, check_paths: bool = False,
) -> DaemonConfig:
    """Read the TOML file (if any), apply overrides (field names; None values are ignored,
    so argparse defaults can be passed as is), validate, return the frozen config.

    `check_paths` (--check-config) also looks at the host as this user sees it, for what a
    start would refuse there: a decision log at db_path that could not be created and
    written, or a file there that is not a KVBudget log (`db_path_problem`); a listen
    socket path taken by something else (`unix_socket_problem`). Only then: a start is run
    by the daemon's user and finds out by doing it, and anything else (tests, doctor, a
    reload, whose own daemon serves on the sockets) need not ask. Nothing is created,
    changed or locked."""
    values: dict[str, object] = {}
    origin: dict[str, tuple[str, str]] = {}  # field -> (key as the user wrote it, source)
    source = ""
    if path is not None:
        source = str(path)
        if not source:  # (Path("") is ".": "config file . is a directory")
            raise ConfigError(FILE_KEY, "the config file's path is empty")
        _read_file(Path(path), source, values, origin)
    flags = {name: value for name, value in (overrides or {}).items() if value is not None}
    _drop_memory_sources_the_flags_replace(values, origin, flags)
    for name, value in flags.items():
        if name == "tenants":
            values["tenants"] = _tenants_with_flags(values.get("tenants", {}), value)  # type: ignore[arg-type]
        elif name not in _KEY_BY_FIELD:
            raise ConfigError(name, "unknown setting")
        else:
            values[name] = _coerce(value, _KEY_BY_FIELD[name].kind, name, "")
        origin[name] = (name, "")
    fail = _Failure(origin, source)
    config = DaemonConfig(**values)  # type: ignore[arg-type]
    for check in _CHECKS:
        check(config, fail)
    if check_paths:
        _check_paths(config, fail)
    return config


def _read_file(path: Path, source: str, values: dict[str, object], origin: dict[str, tuple[str, str]]) -> None:
    """The file's keys into `values` (by field), each with the key it was written as."""
    for section, body in read_toml_file(path).items():
        if section not in _SECTIONS and not isinstance(body, Mapping):
            raise ConfigError(section, _outside_any_section(section), source=source)
        if section not in _SECTIONS:
            raise ConfigError(
                section, f"unknown section [{section}] (expected: {', '.join(_SECTIONS)})", source=source,
            )
        if section == "tenants":
            values["tenants"] = _parse_tenants(body, source, "tenants")
            origin["tenants"] = ("tenants", source)
            continue
        if not isinstance(body, Mapping):
            raise ConfigError(section, f"must be a [{section}] section, not a value", source=source)
        allowed = {k.name: k for k in _KEYS if k.section == section}
        for name, value in body.items():
            key = f"{section}.{name}"
            if name not in allowed:
                raise ConfigError(
                    key, f"unknown key {name!r} in [{section}] (expected: {', '.join(allowed)})", source=source,
                )
            spec = allowed[name]
            values[spec.field] = _coerce(value, spec.kind, key, source)
            origin[spec.field] = (key, source)


def _outside_any_section(name: str) -> str:
    """What to say of a value written above every [section] header (TOML puts a key there
    at the top level, which this file has no use for): where it belongs, when some
    section has it (or it is a setting's flag name: `metrics_address` is [metrics] address)."""
    for spec in _KEYS:
        if name == spec.name:
            return f"a key outside any section; it belongs under [{spec.section}]"
    for spec in _KEYS:
        if name == spec.field:
            return f"a key outside any section; it belongs under [{spec.section}], as {spec.name}"
    if name in _TENANT_KEYS:
        return "a key outside any section; it belongs under [tenants.NAME]"
    return f"a key outside any section, and no section has it (sections: {', '.join(_SECTIONS)})"


def _drop_memory_sources_the_flags_replace(
    values: dict[str, object], origin: dict[str, tuple[str, str]], flags: Mapping[str, object]
) -> None:
    """A memory source given by flag replaces the file's: `--kv-cache-memory-bytes 1GiB`
    over a file's num_gpu_blocks sizes the pool from the bytes, as a flag wins over its own
    key (and as vLLM's --num-gpu-blocks-override replaces its memory-based sizing); the
    file's settings of the other sources are dropped, so they are neither used nor called a
    conflict. Settings of the source the flags give stay (`--weights-bytes` over a file's
    gpu_memory_bytes), and flags that give two sources drop the file's whole memory source:
    the conflict is then theirs alone, named in their words."""
    chosen = {_MEMORY_SOURCE_OF[name] for name in flags if name in _MEMORY_SOURCE_OF}
    if not chosen:
        return
    for name in [name for name in values if name in _MEMORY_SOURCE_OF]:
        if chosen != {_MEMORY_SOURCE_OF[name]}:
            del values[name]
            origin.pop(name, None)


# --------------------------------------------------------------------- value checks
@dataclass(frozen=True)
class _Failure:
    """A check's ConfigError, naming the value as the user gave it: the file's key (and the
    file), or the flag's setting."""

    origin: Mapping[str, tuple[str, str]]  # field -> (key as written, source: the file or "")
    source: str  # the config file, "" without one

    def __call__(self, field_name: str, message: str) -> ConfigError:
        if field_name in self.origin:
            key, where = self.origin[field_name]
        else:  # a default that another key made invalid
            spec = _KEY_BY_FIELD.get(field_name)
            key, where = (f"{spec.section}.{spec.name}" if spec else field_name), self.source
        return ConfigError(key, message, source=where)

    def given_by_flag(self, field_name: str) -> bool:
        return field_name in self.origin and not self.origin[field_name][1]


_Fail = _Failure
_HOST_PORT = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]*):(?P<port>\d{1,5})$")
_DEVICE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")


def parse_host_port(address: str) -> tuple[str, int] | None:
    """("127.0.0.1", 9400) from "127.0.0.1:9400" (IPv6 in brackets), or None if malformed."""
    match = _HOST_PORT.match(address)
    if not match or int(match["port"]) > 65535:
        return None
    return match["host"].strip("[]"), int(match["port"])


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listen_kind(address: str) -> str | None:
    """"unix" (unix: / unix-abstract:), "tcp" (host:port), or None if malformed."""
    if address.startswith("unix-abstract:"):
        return "unix" if len(address) > len("unix-abstract:") else None
    if address.startswith("unix:"):
        path = address.removeprefix("unix://") if address.startswith("unix://") else address[5:]
        return "unix" if path.strip("/") else None
    return "tcp" if parse_host_port(address) else None


def _check_model(c: DaemonConfig, fail: _Fail) -> None:
    if not c.model:
        raise fail("model", "required: a preset name or a path to a model's config.json")
    from kvbudget.daemon.config.hf_config import read_config

    try:
        read_config(c.model)  # a known preset, or a readable config.json (or folder with one)
    except ValueError as exc:
        raise fail("model", str(exc)) from None
    if c.kv_dtype != "auto" and c.kv_dtype.lower() not in KV_DTYPES:
        raise fail("kv_dtype", f"unknown dtype {c.kv_dtype!r} (expected auto, {KV_DTYPE_NAMES})")


def _positive(*names: str) -> Callable[[DaemonConfig, _Fail], None]:
    def check(c: DaemonConfig, fail: _Fail) -> None:
        for name in names:
            value = getattr(c, name)
            if value is not None and value <= 0:
                raise fail(name, f"must be positive, got {value}")

    return check


def _non_negative(*names: str) -> Callable[[DaemonConfig, _Fail], None]:
    def check(c: DaemonConfig, fail: _Fail) -> None:
        for name in names:
            value = getattr(c, name)
            if value is not None and value < 0:
                raise fail(name, f"must be zero or more, got {value}")

    return check


def _check_pool(c: DaemonConfig, fail: _Fail) -> None:
    if c.block_size is not None and c.block_size > 65536:
        raise fail("block_size", f"must be at most 65536 tokens, got {c.block_size}")
    if not _DEVICE.match(c.device):
        raise fail("device", f"must be auto, cpu, cuda or cuda:N, got {c.device!r}")
    if c.memory_mode not in MEMORY_MODES:
        raise fail("memory_mode", f"must be one of {', '.join(MEMORY_MODES)}, got {c.memory_mode!r}")
    if not 0.0 < c.gpu_memory_utilization <= 1.0:
        raise fail("gpu_memory_utilization", f"must be in (0, 1], got {c.gpu_memory_utilization}")
    _check_memory_source(c, fail)
    if c.num_gpu_blocks is not None and c.num_gpu_blocks < 2:
        raise fail("num_gpu_blocks", f"must be at least 2 (one is the null block), got {c.num_gpu_blocks}")
    if c.num_gpu_blocks is not None and c.num_gpu_blocks - 1 > MAX_WIRE_COUNT:  # (the null block is not sent)
        raise fail("num_gpu_blocks", f"must be at most {MAX_WIRE_COUNT + 1}, got {c.num_gpu_blocks}")
    if c.max_num_batched_tokens > MAX_WIRE_COUNT:
        raise fail("max_num_batched_tokens", f"must be at most {MAX_WIRE_COUNT}, got {c.max_num_batched_tokens}")


def _check_memory_source(c: DaemonConfig, fail: _Fail) -> None:
    """The rule `kvbudget estimate` applies to its flags (sizing's): one memory source, and
    the GPU-only settings only with GPU memory, never silently ignored. The settings are
    named as given, all flags or all keys of the file (a flag's source replaced the file's:
    `_drop_memory_sources_the_flags_replace`), so the message says where both came from.
    (A utilization at its default cannot be told from one written down: the shipped file
    writes 0.9.)"""
    given = [name for name in _MEMORY_SOURCE_OF
             if name != "gpu_memory_utilization" and getattr(c, name) is not None]
    if c.gpu_memory_utilization != DEFAULT_GPU_MEMORY_UTILIZATION:
        given.append("gpu_memory_utilization")
    by_flag = any(fail.given_by_flag(name) for name in given)
    conflict = memory_source_conflict(given, flag_name if by_flag else file_key)
    if conflict is not None:
        raise fail(conflict.setting, conflict.message)


def _check_admission(c: DaemonConfig, fail: _Fail) -> None:
    if c.policy not in POLICIES:
        raise fail("policy", f"unknown policy {c.policy!r} (expected one of {', '.join(POLICIES)})")
    if not 0.0 <= c.watermark < 1.0:
        raise fail("watermark", f"must be in [0, 1), got {c.watermark}")
    for name, quota in c.tenants.items():  # (TenantQuota values given as such skip _parse_tenants)
        problem = _tenant_problem(name, quota)
        if problem is not None:
            raise ConfigError(problem[0], problem[1], source=fail("tenants", "").source)


def _check_server(c: DaemonConfig, fail: _Fail) -> None:
    if c.lease_ttl_s < MIN_LEASE_TTL_S:  # (after _positive: a bad type or sign is said there)
        # Engines hear the TTL in whole seconds and heartbeat at a third of it: under a
        # second, the lease would lapse between heartbeats.
        raise fail("lease_ttl_s", f"at least {MIN_LEASE_TTL_S:g} s (engines are told it in whole seconds), "
                   f"got {c.lease_ttl_s:g}")
    if c.log_level not in LOG_LEVELS:
        raise fail("log_level", f"must be one of {', '.join(LOG_LEVELS)}, got {c.log_level!r}")
    if not c.listen:
        raise fail("listen", "needs at least one address (e.g. unix:///run/kvbudget/kvbudget.sock)")
    if len(set(c.listen)) != len(c.listen):
        raise fail("listen", "lists the same address twice")
    for address in c.listen:
        if address.startswith("unix-abstract:"):
            # Its callers are trusted as a socket file's are (gRPC names both peers "unix:"),
            # but it has no file mode to keep anyone out: any process on the host could
            # connect, from any user or any container sharing the network namespace.
            raise fail("listen", f"{address!r}: an abstract unix socket has no file permissions, so anyone on "
                       "the host could connect as admin; use a unix:///PATH socket")
        kind = listen_kind(address)
        if kind is None:
            raise fail("listen", f"bad address {address!r} (expected unix:///PATH or HOST:PORT)")
        too_long = unix_address_too_long(address) if kind == "unix" else None
        if too_long is not None:
            raise fail("listen", too_long)
        if kind == "tcp" and not (c.tokens_file or c.tls_cert_file or c.allow_insecure_tcp):
            raise fail("listen", f"TCP address {address!r} needs tokens_file or TLS "
                       "(or allow_insecure_tcp = true on a trusted loopback)")
        if kind == "tcp" and c.allow_insecure_tcp and not (c.tokens_file or c.tls_cert_file):
            host = parse_host_port(address)[0]  # type: ignore[index]
            if not _is_loopback(host):
                raise fail("allow_insecure_tcp", f"only allowed on a loopback address, not {address!r}: "
                           "set tokens_file or TLS to listen there")
    if bool(c.tls_cert_file) != bool(c.tls_key_file):
        missing = "tls_key_file" if c.tls_cert_file else "tls_cert_file"
        present = "tls_cert_file" if c.tls_cert_file else "tls_key_file"
        raise fail(missing, f"{present} is set but {missing} is not: TLS needs both")
    if c.tls_cert_file:
        from kvbudget.daemon.server.tls import TlsError, read_pair  # (grpc: only for a TLS config)

        try:
            read_pair(c.tls_cert_file, c.tls_key_file)  # (read again to serve: daemon/server/tls.py)
        except TlsError as exc:
            raise fail(exc.field, str(exc)) from None
    if c.tls_client_ca_file:
        if not c.tls_cert_file:
            raise fail("tls_client_ca_file", "needs tls_cert_file and tls_key_file: client certificates "
                       "are asked for in the TLS handshake")
        from kvbudget.daemon.server.tls import TlsError, read_client_ca

        try:
            read_client_ca(c.tls_client_ca_file)
        except TlsError as exc:
            raise fail(exc.field, str(exc)) from None
    if c.tokens_file:
        from kvbudget.daemon.server.tokens_file import load_roles  # (it reads TOML through this module)

        try:
            roles = load_roles(c.tokens_file)
        except ConfigError as exc:
            raise fail("tokens_file", str(exc)) from None
        if roles.certificate_names and not c.tls_client_ca_file:
            raise fail("tokens_file", f"{c.tokens_file}: [certificates] names client certificates, but "
                       "tls_client_ca_file is not set: no client presents one")


def unix_address_too_long(address: str) -> str | None:
    """Why gRPC could not bind the unix socket `address` for the length of its path, or
    None. Checked with the rest of the config, so that a start says it at once, before
    the pool and the log are set up."""
    size = len(os.fsencode(address.removeprefix("unix:")))
    if size <= MAX_UNIX_ADDRESS_PATH_BYTES:
        return None
    return (f"{address}: the socket path is too long: gRPC takes at most {MAX_UNIX_ADDRESS_PATH_BYTES} "
            f"bytes after \"unix:\", this address has {size}; use a shorter path")


def _check_metrics(c: DaemonConfig, fail: _Fail) -> None:
    if c.metrics_address and parse_host_port(c.metrics_address) is None:
        raise fail("metrics_address", f"bad address {c.metrics_address!r} (expected HOST:PORT, or \"\" for off)")


def _check_log(c: DaemonConfig, fail: _Fail) -> None:
    if not c.db_path:
        raise fail("db_path", "must not be empty")
    if 0 < c.retention_max_bytes < MIN_RETENTION_MAX_BYTES:
        raise fail("retention_max_bytes", f"at least {MIN_RETENTION_MAX_BYTES} (1 MiB), or 0 for no size cap, "
                   f"got {c.retention_max_bytes}")


def _check_paths(c: DaemonConfig, fail: _Fail) -> None:
    """--check-config's looks at the host (load_config's `check_paths`: daemon/config/host.py)."""
    from kvbudget.daemon.config.host import db_path_problem, unix_socket_paths, unix_socket_problem

    problem = db_path_problem(c.db_path)
    if problem is not None:
        raise fail("db_path", problem)
    for path in unix_socket_paths(c.listen):
        problem = unix_socket_problem(path, c.db_path)
        if problem is not None:
            raise fail("listen", problem)


_CHECKS: tuple[Callable[[DaemonConfig, _Fail], None], ...] = (
    _check_model,
    _positive("block_size", "max_model_len", "max_num_batched_tokens", "kv_cache_memory_bytes",
              "num_gpu_blocks", "gpu_probe_interval_s", "max_head_wait_s", "lease_ttl_s",
              "watch_max_hz"),
    _non_negative("gpu_memory_bytes", "weights_bytes", "activation_reserve_bytes",
                  "lookahead_tokens", "max_queue_len", "backfill_depth", "drain_timeout_s",
                  "retention_days", "retention_max_rows", "retention_max_bytes"),
    _check_pool,
    _check_admission,
    _check_server,
    _check_log,
    _check_metrics,
)


def file_key(field_name: str) -> str:
    """The file's key ("pool.num_gpu_blocks") of a DaemonConfig field, for flags' help."""
    spec = _KEY_BY_FIELD[field_name]
    return f"{spec.section}.{spec.name}"


def flag_name(field_name: str) -> str:
    """The `kvbudget daemon` flag ("--num-gpu-blocks") of a DaemonConfig field."""
    return "--" + field_name.replace("_", "-")


def config_keys() -> tuple[str, ...]:
    """Every file key as "section.name" (tenants excluded), for docs and tests."""
    return tuple(f"{k.section}.{k.name}" for k in _KEYS)


assert {k.field for k in _KEYS} | {"tenants"} == {f.name for f in dataclasses.fields(DaemonConfig)}
