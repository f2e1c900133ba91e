"""A reload plan (reload.py) applied to the running daemon: the core's policy, margins and
quotas, the log's retention, the tokens and the TLS certificate, then said in the journal."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from kvbudget.daemon.config.settings import DaemonConfig
from kvbudget.daemon.core.admission import AdmissionError
from kvbudget.daemon.server.admin_changes import RELOAD, by_whom, quota_change, tenant_quota
from kvbudget.daemon.server.reload import RETUNE_KEYS, ReloadPlan, tenant_updates
from kvbudget.daemon.server.startup import warn_if_the_log_outgrows_its_disk
from kvbudget.daemon.server.tls import warn_if_expired

if TYPE_CHECKING:
    from kvbudget.daemon.server.auth import Authorizer
    from kvbudget.daemon.server.service import CoreService
    from kvbudget.daemon.server.tls import ServedCertificate

log = logging.getLogger("kvbudget.daemon")


async def apply_reload(
    core: CoreService, plan: ReloadPlan, running: DaemonConfig, auth: Authorizer | None,
    certificate: ServedCertificate | None,
) -> tuple[DaemonConfig, tuple[str, ...]]:
    """What a reload changes live; returns the config now running and the changes made."""
    target = plan.config
    if target.policy != running.policy:
        try:
            async with core.steps.gate.between_steps():  # (not between a big step's slices)
                await core.record(by_whom(core.set_policy(target.policy), RELOAD))
        except Exception as exc:  # applied; its POLICY decision waits to be written
            log.error("reload: policy %s: decision log: %s", target.policy, exc)
    if any(getattr(target, key) != getattr(running, key) for key in RETUNE_KEYS):
        async with core.steps.gate.between_steps():  # (a big step's slices keep its margins)
            core.controller.retune(**{key: getattr(target, key) for key in RETUNE_KEYS})
    target, changes = await _set_quotas(core, plan, running, target)
    core.log.retention_s = target.retention_s  # (read by the writer at each pass)
    core.log.max_rows = target.retention_rows
    core.log.max_bytes = target.retention_bytes
    core.sessions.default_ttl_s = target.lease_ttl_s  # new sessions; open ones keep theirs
    if plan.roles is not None and auth is not None:
        auth.replace_tokens(plan.roles.tokens, plan.roles.certificate_names, plan.roles.engines)
    if certificate is not None and (plan.certificate or plan.client_ca) is not None:
        certificate.replace(plan.certificate, plan.client_ca)  # new connections get them
    warn_if_expired(plan.certificate, plan.client_ca)
    if core.metrics is not None:
        core.metrics.set_certificate_expiry(plan.certificate.not_after_unix_s if plan.certificate else 0.0)
        core.metrics.set_client_ca_expiry(plan.client_ca.not_after_unix_s if plan.client_ca else 0.0)
    if target.log_level != running.log_level:
        # The process's messages, as `kvbudget daemon` set them up (the root
        # logger); set first, so that the summary below obeys the new level.
        logging.getLogger().setLevel(target.log_level.upper())
    return target, changes


async def _set_quotas(
    core: CoreService, plan: ReloadPlan, running: DaemonConfig, target: DaemonConfig,
) -> tuple[DaemonConfig, tuple[str, ...]]:
    """The tenants' new quotas set, each change an `admin` row in the decision log; one the
    core refuses keeps its old quota, and then the running config says so (the next reload
    compares with it) and the changes do not claim it."""
    kept_quotas: list[str] = []
    rows = []
    async with core.steps.gate.between_steps():  # (the rows take seqs between steps')
        for tenant, max_share, weight in tenant_updates(running, target):
            before = tenant_quota(core, tenant)
            try:
                core.controller.set_tenant_quota(tenant, max_share, weight)
            except AdmissionError as exc:  # (the rest of the reload stands)
                log.error("reload: tenants.%s.%s; that tenant keeps its quota", tenant, exc)
                kept_quotas.append(tenant)
            rows += quota_change(core, tenant, before, RELOAD)
        try:
            await core.record(rows)
        except Exception as exc:  # applied; the rows wait to be written
            log.error("reload: quotas: decision log: %s", exc)
    if not kept_quotas:
        return target, plan.changes
    tenants = dict(target.tenants)
    for tenant in kept_quotas:
        if tenant in running.tenants:
            tenants[tenant] = running.tenants[tenant]
        else:
            tenants.pop(tenant, None)
    changes = tuple(c for c in plan.changes if not any(c.startswith(f"tenant {t} ") for t in kept_quotas))
    return dataclasses.replace(target, tenants=tenants), changes


def report_reload(
    plan: ReloadPlan, changes: tuple[str, ...], running: DaemonConfig, target: DaemonConfig, core: CoreService,
) -> None:
    """The journal's lines for a reload applied: `running` before it, `target` after."""
    # (With only restart keys changed, "nothing changed" read against the warning below.)
    for warning in plan.warnings:
        log.warning("%s", warning)
    log.info("reloaded: %s", "; ".join(changes) or ("nothing applied live" if plan.at_restart else "nothing changed"))
    if plan.at_restart:
        log.warning("reload: %s changed; that takes a restart (systemctl restart kvbudget)",
                    ", ".join(plan.at_restart))
    if target.retention_max_bytes != running.retention_max_bytes:
        warn_if_the_log_outgrows_its_disk(core.log.figures(), target.db_path)
