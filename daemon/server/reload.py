"""`systemctl reload kvbudget` (SIGHUP): the config read again and compared with the one
running, into a `ReloadPlan`: what changes live, what waits for a restart (the keys that
shaped what start-up built), the tokens and TLS files to serve. A file that no longer loads
changes nothing. `reload_apply.py` applies a plan."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from kvbudget.daemon.config.settings import ConfigError, DaemonConfig, TenantQuota
from kvbudget.daemon.config.tokens_file import Roles, load_roles, tokens_file_warnings
from kvbudget.daemon.config.tls_files import (
    CertificatePair, ClientAuthority, TlsError, key_file_warnings, read_client_ca, read_pair,
)

# AdmissionController.retune's keyword arguments, the config's field names
RETUNE_KEYS = ("watermark", "lookahead_tokens", "max_queue_len", "backfill_depth", "max_head_wait_s",
               "reject_over_quota")
LIVE_KEYS = (
    "policy", *RETUNE_KEYS, "tenants", "retention_days", "retention_max_rows", "retention_max_bytes",
    "lease_ttl_s", "drain_timeout_s", "log_level", "tokens_file", "tls_cert_file", "tls_key_file",
    "tls_client_ca_file",
)


@dataclass(frozen=True)
class ReloadPlan:
    """What a reload would do: the running config after it, the changes in words, the
    keys that changed but wait for a restart, the tokens to serve with, the TLS
    certificate to serve and the client CAs to verify against (None: as now)."""

    config: DaemonConfig
    changes: tuple[str, ...]
    at_restart: tuple[str, ...]
    roles: Roles | None  # the tokens file's tokens and certificate names
    certificate: CertificatePair | None = None
    client_ca: ClientAuthority | None = None
    warnings: tuple[str, ...] = ()  # taken, but worth the journal's warning (tokens_file_warnings)


def plan_reload(
    running: DaemonConfig, loaded: DaemonConfig, served: CertificatePair | None = None,
    served_client_ca: ClientAuthority | None = None, resolved: Mapping[str, object] | None = None,
) -> ReloadPlan:
    """Compares the config the daemon runs with the one just loaded; `served` is the TLS
    certificate its listeners present, `served_client_ca` the CAs they verify clients
    against, `resolved` what the running daemon made of keys left to the model
    (`block_size`, `max_model_len`: see `model_resolved`). Raises ConfigError / OSError (a
    tokens file that cannot be read): then nothing is to change."""
    planning = _Planning(running, loaded)
    for f in dataclasses.fields(DaemonConfig):
        if f.name == "tls_key_file":
            continue  # (with tls_cert_file)
        if f.name == "tls_cert_file":
            planning.certificate_file(served)
        elif f.name == "tls_client_ca_file":
            planning.client_ca_file(served_client_ca)
        elif f.name == "tokens_file":
            planning.tokens_file()
        else:
            planning.key(f.name, resolved)
    return planning.plan()


@dataclass
class _Planning:
    """A plan as `plan_reload` builds it, key by key."""

    running: DaemonConfig
    loaded: DaemonConfig
    live: dict[str, object] = dataclasses.field(default_factory=dict)
    changes: list[str] = dataclasses.field(default_factory=list)
    at_restart: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)
    roles: Roles | None = None
    certificate: CertificatePair | None = None
    client_ca: ClientAuthority | None = None

    def plan(self) -> ReloadPlan:
        return ReloadPlan(dataclasses.replace(self.running, **self.live), tuple(self.changes),  # type: ignore[arg-type]
                          tuple(self.at_restart), self.roles, self.certificate, self.client_ca, tuple(self.warnings))

    def certificate_file(self, served: CertificatePair | None) -> None:
        running, loaded = self.running, self.loaded
        if running.tls_enabled != loaded.tls_enabled:  # TCP listeners with TLS or without
            self.at_restart.extend(k for k in ("tls_cert_file", "tls_key_file")
                                   if getattr(running, k) != getattr(loaded, k))
        elif loaded.tls_enabled:
            self.certificate = _certificate_to_serve(loaded, served)
            self.warnings.extend(key_file_warnings(loaded.tls_key_file))
            if self.certificate is not None:
                self.changes.append(f"tls certificate {self.certificate.describe()}")
            self.live.update(tls_cert_file=loaded.tls_cert_file, tls_key_file=loaded.tls_key_file)

    def client_ca_file(self, served: ClientAuthority | None) -> None:
        before, after = self.running.tls_client_ca_file, self.loaded.tls_client_ca_file
        if bool(before) != bool(after) or self.running.tls_enabled != self.loaded.tls_enabled:
            if before != after:  # what each listener demands of a handshake
                self.at_restart.append("tls_client_ca_file")
        elif after:
            self.client_ca = _client_ca_to_serve(after, served)
            if self.client_ca is not None:
                self.changes.append(f"tls client CA {self.client_ca.describe()}")
            self.live["tls_client_ca_file"] = after

    def tokens_file(self) -> None:
        before, after = self.running.tokens_file, self.loaded.tokens_file
        if bool(before) != bool(after):
            self.at_restart.append("tokens_file")  # with tokens or without: TCP trusts callers or not
        elif after:
            roles = self.roles = load_roles(after)  # the file's contents may have changed, not its name
            self.warnings.extend(tokens_file_warnings(after, roles))
            names = f", certificate names: {len(roles.certificate_names)}" if roles.certificate_names else ""
            self.changes.append(f"tokens from {after}: {len(roles.tokens)}{names}")
            self.live["tokens_file"] = after

    def key(self, name: str, resolved: Mapping[str, object] | None) -> None:
        before, after = getattr(self.running, name), getattr(self.loaded, name)
        if resolved and name in resolved and self.running.model == self.loaded.model:
            # Unset means "the model's": with the same model, unset and the size the model
            # gave are the same setting (no "takes a restart" for writing down the default).
            before = resolved[name] if before is None else before
            after = resolved[name] if after is None else after
        if before == after:
            return
        if name not in LIVE_KEYS:
            self.at_restart.append(name)
            return
        self.live[name] = after
        if name == "tenants":
            self.changes.extend(_tenant_changes(before, after))
        else:
            self.changes.append(f"{name} {_shown(before)} -> {_shown(after)}")


def _certificate_to_serve(loaded: DaemonConfig, served: CertificatePair | None) -> CertificatePair | None:
    """The pair the files hold now if it is not the one served (a renewal in place changes
    the files' contents, not their names); ConfigError if it cannot be served."""
    try:
        pair = read_pair(loaded.tls_cert_file, loaded.tls_key_file)
    except TlsError as exc:
        raise ConfigError(f"server.{exc.field}", str(exc)) from None
    if served is not None and (pair.cert_pem, pair.key_pem) == (served.cert_pem, served.key_pem):
        return None
    return pair


def _client_ca_to_serve(ca_file: str, served: ClientAuthority | None) -> ClientAuthority | None:
    """The CAs the file holds now if they are not the ones served; ConfigError if unusable."""
    try:
        client_ca = read_client_ca(ca_file)
    except TlsError as exc:
        raise ConfigError(f"server.{exc.field}", str(exc)) from None
    if served is not None and client_ca.pem == served.pem:
        return None
    return client_ca


def tenant_updates(running: DaemonConfig, target: DaemonConfig) -> list[tuple[str, float | None, float]]:
    """(tenant, max_share or None, weight) to set so the quotas become `target`'s: a tenant
    the file no longer names loses its quota."""
    updates = [(name, q.max_share, q.weight) for name, q in target.tenants.items()
               if running.tenants.get(name) != q]
    updates += [(name, None, 1.0) for name in running.tenants if name not in target.tenants]
    return updates


def _tenant_changes(before: dict[str, TenantQuota], after: dict[str, TenantQuota]) -> list[str]:
    changes = []
    for name in sorted({*before, *after}):
        old, new = before.get(name), after.get(name)
        if old == new:
            continue
        changes.append(f"tenant {name} {_quota(old)} -> {_quota(new)}")
    return changes


def _quota(quota: TenantQuota | None) -> str:
    if quota is None:
        return "(none)"
    share = "none" if quota.max_share is None else f"{quota.max_share:g}"
    return f"max_share {share} weight {quota.weight:g}"


def _shown(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def model_resolved(block_size: int, max_model_len: int) -> dict[str, object]:
    """`plan_reload`'s `resolved`: the block size and maximum length a daemon serves with,
    for the keys that leave them to the model when unset."""
    return {"block_size": block_size, "max_model_len": max_model_len}

