"""The engines & tenants panel: engine sessions with their lease, tenants against their quota.

A pure function of one `DashboardState`, as every panel (`panels`).
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import RenderableType
from rich.text import Text

from kvbudget.client.tenants import tenants_folded
from kvbudget.tui.drawing import CountName, Fitted, NameTable, Row, Section, n, usage_style
from kvbudget.tui.panels import WAITING
from kvbudget.tui.state import DashboardState


def _lease(remaining_s: float) -> tuple[str, str]:
    if remaining_s <= 0:
        return "lapsed", "bold red"
    return f"live {remaining_s:.0f}s", "green"


def engines_panel(state: DashboardState, compact: bool = False) -> RenderableType:
    """Engine sessions with their lease and blocks held; tenants against their quota.

    Names are cut in the middle (engine ids of one replay share a long prefix). Engine rows
    that do not fit the panel leave a "+N more engines" line; tenant rows leave one "+N
    more" row with their sums, and so does the daemon's "(other)" entry: the tenant rows
    on screen always add up to every tenant's.
    """
    s = state.snapshot
    if s is None:
        return WAITING
    if compact:
        return _engines_compact(s)
    parts: list[NameTable | Text] = []
    if s.engines:
        rows = []
        for engine in s.engines:
            lease, style = _lease(engine.lease_remaining_s)
            rows.append(
                (
                    engine.engine_id,
                    Text(lease, style=style),
                    n(engine.blocks_held),
                    n(engine.running),
                    n(engine.waiting),
                )
            )
        parts.append(
            NameTable(
                ("engine", "lease", "held", "run", "wait"), tuple(rows), frozenset({1}),
                middle=True, sections=(Section(len(rows), "engines"),),
            )
        )
    else:
        parts.append(Text("no engine sessions", style="dim"))
    if s.tenants:
        tenants = TenantList(s)

        def tenant_row(name: Text | str, tenant: TenantFigures, quota: str, use: Text | str) -> Row:
            return (name, n(tenant.held), quota, use, n(tenant.running), n(tenant.waiting))

        def rest(start: int) -> Row:
            return tenant_row(*tenants.rest(start), "—", "—")

        parts.append(
            NameTable(
                ("tenant", "held", "quota", "use", "run", "wait"),
                tuple(
                    tenant_row(name, figures, *_quota(tenant))
                    for tenant, name, figures in tenants.entries()
                ),
                middle=True,
                sections=(Section(len(s.tenants), "tenants", rest),),
            )
        )
    return Fitted(tuple(parts))


@dataclass(frozen=True)
class TenantFigures:
    """A tenant's figures that add up across tenants."""

    held: int
    running: int
    waiting: int


class TenantList:
    """The snapshot's tenants as the panel shows them: each named one, and for the rest
    (the daemon's "(other)" entry of a cut list, and the rows a panel has no room for) one
    "+N more" row with their sums.

    N counts tenants, not entries: "(other)" stands for the many the daemon left out
    (`kvbudget.client.tenants.tenants_folded`), so N comes from the snapshot's count of them all.
    """

    def __init__(self, s) -> None:
        self.tenants = tuple(s.tenants)
        folded = tenants_folded(s) > 0  # the last entry is "(other)"
        self.total = s.num_tenants if folded else len(self.tenants)
        self.named = len(self.tenants) - 1 if folded else len(self.tenants)

    def entries(self) -> list[tuple[object, Text | str, TenantFigures]]:
        """(entry, name, figures) per entry, the "(other)" one as the "+N more" row it is."""
        out: list[tuple[object, Text | str, TenantFigures]] = []
        for index, tenant in enumerate(self.tenants):
            if index < self.named:
                out.append((tenant, tenant.tenant or "(default)", _figures(tenant)))
            else:
                out.append((tenant, *self.rest(index)))
        return out

    def rest(self, start: int) -> tuple[CountName, TenantFigures]:
        """The "+N more" name and the sums of every tenant from entry `start` on."""
        left = self.tenants[start:]
        figures = TenantFigures(
            held=sum(t.blocks_held for t in left),
            running=sum(t.running for t in left),
            waiting=sum(t.waiting for t in left),
        )
        return CountName(f"+{n(self.total - start)} more", style="dim"), figures


def _figures(tenant) -> TenantFigures:
    return TenantFigures(tenant.blocks_held, tenant.running, tenant.waiting)


def _quota(tenant) -> tuple[str, Text | str]:
    """The quota and the tenant's use of it: (held + reserved) / quota."""
    if not tenant.quota_blocks:
        return "—", "—"
    share = (tenant.blocks_held + tenant.blocks_reserved) / tenant.quota_blocks
    return n(tenant.quota_blocks), Text(f"{share:.0%}", style=usage_style(share))


def _engines_compact(s) -> RenderableType:
    """One line an engine, one a tenant, no headers: the 80x24 variant."""
    rows: list[Row] = []
    for engine in s.engines:
        lease, style = _lease(engine.lease_remaining_s)
        rows.append((engine.engine_id, Text(lease, style=style), n(engine.blocks_held), "held"))
    tenants = TenantList(s)

    def tenant_row(name: Text | str, tenant: TenantFigures, quota: str, use: Text | str) -> Row:
        name = name if isinstance(name, Text) else Text(name, style="italic")
        return (name, f"quota {quota}", n(tenant.held), use)

    def rest(start: int) -> Row:
        return tenant_row(*tenants.rest(start), "—", "—")

    rows += [
        tenant_row(name, figures, *_quota(tenant)) for tenant, name, figures in tenants.entries()
    ]
    if not rows:
        return Text("no engine sessions", style="dim")
    sections = (Section(len(s.engines), "engines"), Section(len(s.tenants), "tenants", rest))
    return NameTable(None, tuple(rows), frozenset({1}), middle=True, sections=sections)
