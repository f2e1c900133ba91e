"""Operator changes as rows of the decision log (kind `admin`): who, what, before -> after.

A quota set over AdminService or by a config reload lasts until the next restart or
reload (a drain, until the restart); its row is where `kvbudget log --kind admin` finds why the daemon runs otherwise
than its config file says. The detail reads "by WHO: BEFORE -> AFTER" (docs/log-schema.md).
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from kvbudget.daemon.core.records import Decision, DecisionKind, Reason
from kvbudget.daemon.server.auth import TRUSTED, Caller, is_local_peer

if TYPE_CHECKING:
    from kvbudget.daemon.server.service import CoreService

RELOAD = "config reload"  # who changed it, for a reload's rows


def who(caller: Caller, peer: str) -> str:
    """The caller as a row names it: "unix socket", or the credential (never a token: its
    digest) and peer; then the role."""
    if caller.credential == TRUSTED:
        source = "unix socket" if is_local_peer(peer) else f"trusted peer {peer or 'unknown'}"
    else:
        source = f"{caller.credential} at {peer or 'unknown peer'}"
    return f"{source} ({caller.role.value})"


def tenant_quota(core: CoreService, tenant: str) -> str:
    """The tenant's quota in force, as a row's before or after says it."""
    account = core.controller.ledger.tenants.get(tenant)
    if account is None or not account.max_share:
        return f"no quota weight {account.weight if account is not None else 1.0:g}"
    return f"max_share {account.max_share:g} weight {account.weight:g}"


def quota_change(core: CoreService, tenant: str, before: str, by: str) -> list[Decision]:
    """The ADMIN row of a quota change from `before` ([] when the quota is as it was)."""
    after = tenant_quota(core, tenant)
    if after == before:
        return []
    return [core.controller.note_change(Reason.QUOTA, tenant, f"by {by}: {before} -> {after}", time.time())]


def by_whom(decisions: list[Decision], by: str) -> list[Decision]:
    """A policy switch's decisions, its POLICY row's detail ("A -> B") saying who switched."""
    return [dataclasses.replace(d, detail=f"by {by}: {d.detail}") if d.kind is DecisionKind.POLICY else d
            for d in decisions]


def drain_change(core: CoreService, by: str) -> Decision:
    """The ADMIN row of a drain (reason `draining`), made before the drain's rejections."""
    return core.controller.note_change(Reason.DRAINING, "", f"by {by}: admitting -> draining", time.time())
