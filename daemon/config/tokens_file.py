"""The tokens file (`server.tokens_file`): who may call the daemon over TCP, in which role,
by token or (mutual TLS) by client certificate name, and which engine ids each may open.
Every mistake is a `ConfigError` naming the file's own key (`admin[1]`); read at start and
on SIGHUP."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kvbudget.daemon.config.loading import read_toml_file
from kvbudget.daemon.config.settings import ConfigError

ROLES = ("engine", "observer", "admin")
MIN_TOKEN_LENGTH = 8
CERTIFICATES_TABLE = "certificates"  # the tokens file's table of client certificate names


@dataclass(frozen=True)
class Roles:
    """What the tokens file grants: token -> role, and (mutual TLS) the name of a client
    certificate (its subject CN or a subject alternative name) -> role."""

    tokens: dict[str, str]
    certificate_names: dict[str, str] = field(default_factory=dict)
    # ("token", token) or ("certificate", name) -> the engine ids it may open (fnmatch
    # patterns, `pfx-*`); a credential not here may open any (the meaning before the list).
    engines: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)


def load_roles(path: str | os.PathLike[str]) -> Roles:
    """The tokens file: `engine = [...]`, `observer = [...]`, `admin = [...]` tokens, and
    optionally a `[certificates]` table of the same three lists of certificate names. An
    entry is a string, or a table that also says which engine ids it may open:
    `{ token = "...", engines = ["engine-A", "pfx-*"] }` (`name = ` under [certificates]).

    Keys of the error are the file's own keys (`engine`, `admin[1]`,
    `certificates.observer[0]`) so the operator knows which line to fix; a token or name
    listed twice is refused (its role would be ambiguous).
    """
    source = str(path)
    document = dict(read_toml_file(Path(path), "tokens file"))
    names = document.pop(CERTIFICATES_TABLE, {})
    if not isinstance(names, dict):
        raise ConfigError(CERTIFICATES_TABLE, 'must be a table: [certificates] then engine = ["NAME", ...]',
                          source=source)
    engines: dict[tuple[str, str], tuple[str, ...]] = {}
    tokens = _by_role(document, "", "token", _token_problem, source, engines)
    certificate_names = _by_role(names, f"{CERTIFICATES_TABLE}.", "certificate name", _name_problem, source, engines)
    return Roles(tokens, certificate_names, engines)


def tokens_file_warnings(path: str | os.PathLike[str], roles: Roles) -> list[str]:
    """What the daemon takes but says about the tokens file (at start, on reload, and in
    --check-config): one that lists nothing (every TCP caller will be refused: failing
    closed is deliberate, but it is rarely what was meant), or one every user of the host
    may read (the tokens are the keys to the daemon; the guide asks for mode 0640)."""
    warnings = []
    if not roles.tokens and not roles.certificate_names:
        warnings.append(f"tokens_file: {path} lists no token and no certificate name: every TCP caller "
                        "will be refused (UNAUTHENTICATED)")
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = 0
    if mode & 0o004:
        warnings.append(f"tokens_file: {path} is readable by every user (mode {mode & 0o777:04o}): "
                        "make it 0640, owned by root and the daemon's group")
    return warnings


def _token_problem(token: str) -> str | None:
    if len(token) < MIN_TOKEN_LENGTH or token != token.strip() or any(ch.isspace() for ch in token):
        return f"a token must be at least {MIN_TOKEN_LENGTH} characters without spaces"
    return None


def _name_problem(name: str) -> str | None:
    if not name or name != name.strip():
        return "a certificate name must not be empty or start or end with spaces"
    return None


def _by_role(
    table: Mapping[str, object], prefix: str, what: str, problem: Callable[[str], str | None], source: str,
    engines: dict[tuple[str, str], tuple[str, ...]],
) -> dict[str, str]:
    """value -> role from `role = [values]` lines, and into `engines` what the table entries
    allow; ConfigError names the line's key."""
    found: dict[str, str] = {}
    kind, field_name = ("certificate", "name") if prefix else ("token", "token")
    for role, listed in table.items():
        if role not in ROLES:
            raise ConfigError(f"{prefix}{role}", f"unknown role {role!r} (expected: {', '.join(ROLES)})", source=source)
        if not isinstance(listed, list) or not all(isinstance(value, (str, dict)) for value in listed):
            raise ConfigError(f"{prefix}{role}", f"must be a list of {what} strings", source=source)
        for index, entry in enumerate(listed):
            key = f"{prefix}{role}[{index}]"
            value, allowed = _entry(entry, key, field_name, what, source)
            if allowed is not None:
                engines[(kind, value)] = allowed
            why = problem(value)
            if why is not None:
                raise ConfigError(key, why, source=source)
            if value in found:
                raise ConfigError(key, f"{what} already listed for role {found[value]!r}", source=source)
            found[value] = role
    return found


def _entry(entry: object, key: str, field_name: str, what: str, source: str) -> tuple[str, tuple[str, ...] | None]:
    """(value, engine id patterns or None) of one list entry: a string, or a table
    `{ token = "...", engines = [...] }`."""
    if isinstance(entry, str):
        return entry, None
    assert isinstance(entry, dict)
    unknown = sorted(set(entry) - {field_name, "engines"})
    if unknown:
        raise ConfigError(f"{key}.{unknown[0]}", f"unknown key (expected: {field_name}, engines)", source=source)
    value = entry.get(field_name)
    if not isinstance(value, str):
        raise ConfigError(f"{key}.{field_name}", f"required: the {what} string", source=source)
    allowed = entry.get("engines")
    if allowed is None:
        return value, None
    if not isinstance(allowed, list) or not all(isinstance(p, str) and p.strip() == p and p for p in allowed):
        raise ConfigError(f"{key}.engines", 'must be a list of engine ids or patterns ("engine-A", "pfx-*")',
                          source=source)
    return value, tuple(allowed)
