"""The config read: the TOML file's sections and keys, and the command-line flags over
them, coerced to each field's type, then checked (checks.py) into a frozen DaemonConfig."""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvbudget.daemon.config.checks import MEMORY_SOURCE_OF, ConfigErrors, check_config, tenant_problem
from kvbudget.daemon.config.settings import (
    FILE_KEY, KEY_BY_FIELD, KEYS, SECTIONS, TENANT_KEYS, ConfigError, DaemonConfig, Failure, Size, TenantQuota,
)

_TYPE_WORDS = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
               tuple: "a list of strings"}


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
    except RecursionError:  # (tomllib recurses per nested array or inline table)
        raise ConfigError(FILE_KEY, f"{what} {path} is not valid TOML for kvbudget: nested too deeply") from None
    except ValueError:  # (an integer of more digits than int() takes: 4,300 by default)
        raise ConfigError(FILE_KEY, f"{what} {path} is not valid TOML for kvbudget: a number in it has too many "
                                    "digits") from None


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
    problems: list[ConfigError] = []  # the file's, all of them: then the checks' too
    if path is not None:
        source = str(path)
        if not source:  # (Path("") is ".": "config file . is a directory")
            raise ConfigError(FILE_KEY, "the config file's path is empty")
        problems = _read_file(Path(path), source, values, origin)
    flags = {name: value for name, value in (overrides or {}).items() if value is not None}
    _drop_memory_sources_the_flags_replace(values, origin, flags)
    for name, value in flags.items():
        if name == "tenants":
            values["tenants"] = _tenants_with_flags(values.get("tenants", {}), value)  # type: ignore[arg-type]
        elif name not in KEY_BY_FIELD:
            raise ConfigError(name, "unknown setting")
        else:
            values[name] = _coerce(value, KEY_BY_FIELD[name].kind, name, "")
        origin[name] = (name, "")
    fail = Failure(origin, source)
    config = DaemonConfig(**values)  # type: ignore[arg-type]
    try:
        check_config(config, fail, check_paths=check_paths)
    except ConfigError as exc:
        if not problems:
            raise
        said = {p.key for p in problems}  # (a key the file got wrong was checked at its default)
        problems += [p for p in getattr(exc, "problems", (exc,)) if p.key not in said]
    if problems:
        raise ConfigErrors(problems) if len(problems) > 1 else problems[0]
    return config


def _read_file(
    path: Path, source: str, values: dict[str, object], origin: dict[str, tuple[str, str]]
) -> list[ConfigError]:
    """The file's keys into `values` (by field), each with the key it was written as; the
    keys it could not take, every one, returned (a file that is not TOML raises)."""
    problems: list[ConfigError] = []
    for section, body in read_toml_file(path).items():
        if section not in SECTIONS and not isinstance(body, Mapping):
            problems.append(ConfigError(section, _outside_any_section(section), source=source))
        elif section not in SECTIONS:
            problems.append(ConfigError(
                section, f"unknown section [{section}] (expected: {', '.join(SECTIONS)})", source=source,
            ))
        elif section == "tenants":
            try:
                values["tenants"] = _parse_tenants(body, source, "tenants")
                origin["tenants"] = ("tenants", source)
            except ConfigError as exc:
                problems.append(exc)
        elif not isinstance(body, Mapping):
            problems.append(ConfigError(section, f"must be a [{section}] section, not a value", source=source))
        else:
            problems += _read_section(section, body, source, values, origin)
    return problems


def _read_section(section: str, body: Mapping, source: str, values: dict[str, object],
                  origin: dict[str, tuple[str, str]]) -> list[ConfigError]:
    problems: list[ConfigError] = []
    allowed = {k.name: k for k in KEYS if k.section == section}
    for name, value in body.items():
        key = f"{section}.{name}"
        if name not in allowed:
            problems.append(ConfigError(
                key, f"unknown key {name!r} in [{section}] (expected: {', '.join(allowed)})", source=source,
            ))
            continue
        spec = allowed[name]
        try:
            values[spec.field] = _coerce(value, spec.kind, key, source)
            origin[spec.field] = (key, source)
        except ConfigError as exc:
            problems.append(exc)
    return problems


def _outside_any_section(name: str) -> str:
    """What to say of a value written above every [section] header (TOML puts a key there
    at the top level, which this file has no use for): where it belongs, when some
    section has it (or it is a setting's flag name: `metrics_address` is [metrics] address)."""
    for spec in KEYS:
        if name == spec.name:
            return f"a key outside any section; it belongs under [{spec.section}]"
    for spec in KEYS:
        if name == spec.field:
            return f"a key outside any section; it belongs under [{spec.section}], as {spec.name}"
    if name in TENANT_KEYS:
        return "a key outside any section; it belongs under [tenants.NAME]"
    return f"a key outside any section, and no section has it (sections: {', '.join(SECTIONS)})"


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
    chosen = {MEMORY_SOURCE_OF[name] for name in flags if name in MEMORY_SOURCE_OF}
    if not chosen:
        return
    for name in [name for name in values if name in MEMORY_SOURCE_OF]:
        if chosen != {MEMORY_SOURCE_OF[name]}:
            del values[name]
            origin.pop(name, None)


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
        for unknown in set(body) - set(TENANT_KEYS):
            raise ConfigError(
                f"{key}.{unknown}",
                f"unknown key {unknown!r} in [{key}] (expected: {', '.join(TENANT_KEYS)})",
                source=source,
            )
        max_share = body.get("max_share")
        if max_share is not None:
            max_share = _coerce(max_share, float, f"{key}.max_share", source)
        weight = _coerce(body.get("weight", 1.0), float, f"{key}.weight", source)
        quota = TenantQuota(max_share=max_share, weight=weight)  # type: ignore[arg-type]
        # Checked here, where the source is known: the file's tenants and the flags' are merged.
        problem = tenant_problem(name, quota)
        if problem is not None:
            raise ConfigError(problem[0], problem[1], source=source)
        tenants[name] = quota
    return tenants


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


