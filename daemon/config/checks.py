"""The config's value checks, run once on the merged file and flags (`loading.load_config`):
each raises the ConfigError that names the value as the user gave it (`settings.Failure`).
Every check runs, and all their errors come out together (ConfigErrors): a config with
three mistakes takes one run to hear of all three, not three."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from kvbudget.daemon.config.listen import check_server, parse_host_port
from kvbudget.daemon.config.parallel import parallel_problem
from kvbudget.daemon.config.settings import (
    MEMORY_MODES, ConfigError, DaemonConfig, Failure, TenantQuota, file_key, flag_name,
)
from kvbudget.daemon.config.sizing import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    GPU_ONLY_SETTINGS,
    SOURCE_BLOCKS,
    SOURCE_GPU,
    SOURCE_KV_BYTES,
    memory_source_conflict,
)
from kvbudget.daemon.core.admission import POLICIES
from kvbudget.daemon.core.admission_config import ADMIT_ON, PREDICTIVE_ADMISSION
from kvbudget.daemon.core.records import MAX_TENANT_CHARS, OTHER_TENANTS, RESERVED_TENANT
from kvbudget.daemon.core.spec import KV_DTYPE_NAMES, KV_DTYPES

MIN_RETENTION_MAX_BYTES = 2**20  # below this the schema and indexes alone would not fit
# Block ids and counts, and the plan's token counts, travel as uint32 (protos/): a larger
# value passed every check and then failed start-up with a traceback ("Value out of range").
MAX_WIRE_COUNT = 2**32 - 1
# The pool's size comes from one memory source (daemon/config/sizing.py): the settings of each.
# The GPU's are those its arithmetic uses (sizing.size_from_gpu_memory); without
# gpu_memory_bytes it reads the local GPU's total.
MEMORY_SOURCES: dict[str, tuple[str, ...]] = {
    SOURCE_BLOCKS: ("num_gpu_blocks",),
    SOURCE_KV_BYTES: ("kv_cache_memory_bytes",),
    SOURCE_GPU: ("gpu_memory_bytes", *GPU_ONLY_SETTINGS),
}
MEMORY_SOURCE_OF = {name: source for source, names in MEMORY_SOURCES.items() for name in names}
_DEVICE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")


class ConfigErrors(ConfigError):
    """Several mistakes at once: `problems`, in the checks' order. As a ConfigError it is
    the first of them; its text is all of them, `; `-separated (one journal line)."""

    def __init__(self, problems: list[ConfigError]) -> None:
        first = problems[0]
        super().__init__(first.key, first.message, source=first.source)
        self.problems = tuple(problems)
        self.args = ("; ".join(str(p) for p in problems),)


def check_config(config: DaemonConfig, fail: Failure, *, check_paths: bool = False) -> None:
    """Every check, in order (`check_paths`: --check-config's looks at the host too); raises
    the one ConfigError found, or ConfigErrors for several."""
    problems: list[ConfigError] = []
    for check in (*_CHECKS, _check_paths) if check_paths else _CHECKS:
        try:
            check(config, fail)
        except ConfigErrors as exc:
            problems += exc.problems
        except ConfigError as exc:
            problems.append(exc)
    said: set[str] = set()  # one problem per key, the first check's (a later one may repeat it)
    problems = [p for p in problems if not (p.key in said or said.add(p.key))]
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise ConfigErrors(problems)


def _each(*checks: Callable[[DaemonConfig, Failure], None]) -> Callable[[DaemonConfig, Failure], None]:
    """The checks as one, each run whatever the others found."""

    def check(c: DaemonConfig, fail: Failure) -> None:
        problems: list[ConfigError] = []
        for one in checks:
            try:
                one(c, fail)
            except ConfigError as exc:
                problems.append(exc)
        if problems:
            raise ConfigErrors(problems)

    return check


def _check_model(c: DaemonConfig, fail: Failure) -> None:
    if not c.model:
        raise fail("model", "required: a preset name or a path to a model's config.json")
    from kvbudget.daemon.config.hf_config import read_config

    try:
        read_config(c.model)  # a known preset, or a readable config.json (or folder with one)
    except ValueError as exc:
        raise fail("model", str(exc)) from None


def _check_kv_dtype(c: DaemonConfig, fail: Failure) -> None:
    if c.kv_dtype != "auto" and c.kv_dtype.lower() not in KV_DTYPES:
        raise fail("kv_dtype", f"unknown dtype {c.kv_dtype!r} (expected auto, {KV_DTYPE_NAMES})")


def _positive(*names: str) -> Callable[[DaemonConfig, Failure], None]:
    def positive(name: str) -> Callable[[DaemonConfig, Failure], None]:
        def check(c: DaemonConfig, fail: Failure) -> None:
            value = getattr(c, name)
            if value is not None and value <= 0:
                raise fail(name, f"must be positive, got {value}")

        return check

    return _each(*(positive(name) for name in names))


def _non_negative(*names: str) -> Callable[[DaemonConfig, Failure], None]:
    def non_negative(name: str) -> Callable[[DaemonConfig, Failure], None]:
        def check(c: DaemonConfig, fail: Failure) -> None:
            value = getattr(c, name)
            if value is not None and value < 0:
                raise fail(name, f"must be zero or more, got {value}")

        return check

    return _each(*(non_negative(name) for name in names))


def _check_pool_values(c: DaemonConfig, fail: Failure) -> None:
    if c.block_size is not None and c.block_size > 65536:
        raise fail("block_size", f"must be at most 65536 tokens, got {c.block_size}")


def _check_device(c: DaemonConfig, fail: Failure) -> None:
    if not _DEVICE.match(c.device):
        raise fail("device", f"must be auto, cpu, cuda or cuda:N, got {c.device!r}")


def _check_memory_mode(c: DaemonConfig, fail: Failure) -> None:
    if c.memory_mode not in MEMORY_MODES:
        raise fail("memory_mode", f"must be one of {', '.join(MEMORY_MODES)}, got {c.memory_mode!r}")


def _check_utilization(c: DaemonConfig, fail: Failure) -> None:
    if not 0.0 < c.gpu_memory_utilization <= 1.0:
        raise fail("gpu_memory_utilization", f"must be in (0, 1], got {c.gpu_memory_utilization}")


def _check_blocks(c: DaemonConfig, fail: Failure) -> None:
    if c.num_gpu_blocks is not None and c.num_gpu_blocks < 2:
        raise fail("num_gpu_blocks", f"must be at least 2 (one is the null block), got {c.num_gpu_blocks}")
    if c.num_gpu_blocks is not None and c.num_gpu_blocks - 1 > MAX_WIRE_COUNT:  # (the null block is not sent)
        raise fail("num_gpu_blocks", f"must be at most {MAX_WIRE_COUNT + 1}, got {c.num_gpu_blocks}")


def _check_batched(c: DaemonConfig, fail: Failure) -> None:
    if c.max_num_batched_tokens > MAX_WIRE_COUNT:
        raise fail("max_num_batched_tokens", f"must be at most {MAX_WIRE_COUNT}, got {c.max_num_batched_tokens}")
    if c.token_cap is not None and c.token_cap > MAX_WIRE_COUNT:  # (the plan's groups carry it)
        raise fail("token_cap", f"must be at most {MAX_WIRE_COUNT}, got {c.token_cap}")
    problem = parallel_problem(c)  # (the layout against the model: pool_setup)
    if problem is not None:
        raise fail(*problem)


def _check_memory_source(c: DaemonConfig, fail: Failure) -> None:
    """The rule `kvbudget estimate` applies to its flags (sizing's): one memory source, and
    the GPU-only settings only with GPU memory, never silently ignored. The settings are
    named as given, all flags or all keys of the file (a flag's source replaced the file's:
    `_drop_memory_sources_the_flags_replace`), so the message says where both came from.
    (A utilization at its default cannot be told from one written down: the shipped file
    writes 0.9.)"""
    given = [name for name in MEMORY_SOURCE_OF
             if name != "gpu_memory_utilization" and getattr(c, name) is not None]
    if c.gpu_memory_utilization != DEFAULT_GPU_MEMORY_UTILIZATION:
        given.append("gpu_memory_utilization")
    by_flag = any(fail.given_by_flag(name) for name in given)
    conflict = memory_source_conflict(given, flag_name if by_flag else file_key)
    if conflict is not None:
        raise fail(conflict.setting, conflict.message)


def _check_policy(c: DaemonConfig, fail: Failure) -> None:
    if c.policy not in POLICIES:
        raise fail("policy", f"unknown policy {c.policy!r} (expected one of {', '.join(POLICIES)})")


def _check_admit_on(c: DaemonConfig, fail: Failure) -> None:
    if c.admit_on not in ADMIT_ON:
        raise fail("admit_on", f"unknown setting {c.admit_on!r} (expected one of {', '.join(ADMIT_ON)})")


def _check_watermark(c: DaemonConfig, fail: Failure) -> None:
    if not 0.0 <= c.watermark < 1.0:
        raise fail("watermark", f"must be in [0, 1), got {c.watermark}")


def _check_peak(c: DaemonConfig, fail: Failure) -> None:
    if c.predictive_admission not in PREDICTIVE_ADMISSION:
        expected = ", ".join(PREDICTIVE_ADMISSION)
        raise fail("predictive_admission", f"unknown setting {c.predictive_admission!r} (expected one of {expected})")
    if not 0.0 < c.peak_quantile <= 1.0:
        raise fail("peak_quantile", f"must be in (0, 1], got {c.peak_quantile}")


def _check_tenants(c: DaemonConfig, fail: Failure) -> None:
    problems = []
    for name, quota in c.tenants.items():  # (TenantQuota values given as such skip _parse_tenants)
        problem = tenant_problem(name, quota)
        if problem is not None:
            problems.append(ConfigError(problem[0], problem[1], source=fail("tenants", "").source))
    if problems:
        raise ConfigErrors(problems) if len(problems) > 1 else problems[0]


def _check_metrics(c: DaemonConfig, fail: Failure) -> None:
    if c.metrics_address and parse_host_port(c.metrics_address) is None:
        raise fail("metrics_address", f"bad address {c.metrics_address!r} (expected HOST:PORT, or \"\" for off)")


def _check_db_path(c: DaemonConfig, fail: Failure) -> None:
    if not c.db_path:
        raise fail("db_path", "must not be empty")


def _check_retention(c: DaemonConfig, fail: Failure) -> None:
    if 0 < c.retention_max_bytes < MIN_RETENTION_MAX_BYTES:
        raise fail("retention_max_bytes", f"at least {MIN_RETENTION_MAX_BYTES} (1 MiB), or 0 for no size cap, "
                   f"got {c.retention_max_bytes}")


def _check_paths(c: DaemonConfig, fail: Failure) -> None:
    """--check-config's looks at the host (load_config's `check_paths`: daemon/config/host.py)."""
    from kvbudget.daemon.config.host import db_path_problem, unix_socket_paths, unix_socket_problem

    problems = []
    if c.db_path:  # (an empty one was said already)
        problem = db_path_problem(c.db_path)
        if problem is not None:
            problems.append(fail("db_path", problem))
    for path in unix_socket_paths(c.listen):
        problem = unix_socket_problem(path, c.db_path)
        if problem is not None:
            problems.append(fail("listen", problem))
    if problems:
        raise ConfigErrors(problems) if len(problems) > 1 else problems[0]


def tenant_problem(name: str, quota: TenantQuota) -> tuple[str, str] | None:
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


def _check_ops_per_step(c: DaemonConfig, fail: Failure) -> None:
    from kvbudget.daemon.core.validation import MAX_OPS_PER_STEP

    if c.max_ops_per_step > MAX_OPS_PER_STEP:  # (the core refuses more, whatever the setting)
        raise fail("max_ops_per_step", f"at most {MAX_OPS_PER_STEP:,}, got {c.max_ops_per_step:,}")


_CHECKS: tuple[Callable[[DaemonConfig, Failure], None], ...] = (
    _check_model,
    _check_kv_dtype,
    _positive("block_size", "max_model_len", "max_num_batched_tokens", "token_cap",
              "kv_cache_memory_bytes", "num_gpu_blocks", "gpu_probe_interval_s",
              "lease_ttl_s", "watch_max_hz", "max_ops_per_step"),
    _non_negative("gpu_memory_bytes", "weights_bytes", "activation_reserve_bytes",
                  "lookahead_tokens", "max_queue_len", "backfill_depth", "max_head_wait_s", "drain_timeout_s",
                  "retention_days", "retention_max_rows", "retention_max_bytes"),
    _check_pool_values,
    _check_device,
    _check_memory_mode,
    _check_utilization,
    _check_memory_source,
    _check_blocks,
    _check_batched,
    _check_policy,
    _check_admit_on,
    _check_watermark,
    _check_peak,
    _check_tenants,
    check_server,
    _check_ops_per_step,
    _check_db_path,
    _check_retention,
    _check_metrics,
)


