"""docs/engine-integration.md's "Decisions an engine must handle" lists every (kind, reason)
the admission core decides for a request: an engine author codes against that table, and
`deny not_running` and `reject tenant_quota` were missing from it (seen in live replays)."""

from __future__ import annotations

from kvbudget.daemon.server.metrics import DECISION_PAIRS
from kvbudget.daemon.core.records import DecisionKind

from doc_tables import ENGINE_INTEGRATION, doc_section, names, table_rows


def test_the_engine_guide_lists_every_decision_an_engine_can_get() -> None:
    rows = table_rows(doc_section("Decisions an engine must handle", ENGINE_INTEGRATION), ("kind", "reason"))
    documented = {(kind, reason) for cells in rows for kind in names(cells[0]) for reason in names(cells[1])}
    # (a policy switch is the daemon's, no request's: the operator's guide has it)
    decided = {(kind.value, reason.value) for kind, reason in DECISION_PAIRS if kind is not DecisionKind.POLICY}
    assert decided - documented == set()
    assert documented - decided == set()
