"""docs/log-schema.md and docs/datasette-metadata.json describe the log a user opens.

The doc's column table lists every column of the `decisions` view, in order, and nothing
else; `kvbudget log --json` and `--csv` print exactly those fields and `--disk-usage --json`
the ones of its table (each run as a user runs it, on a real log); the Datasette metadata
carries the doc's descriptions for the view and both tables behind it.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

from doc_tables import doc_section, names, table_rows
from test_cmd_log import db, kvbudget  # noqa: F401 - (db: the module's log fixture)

DOCS = Path(__file__).resolve().parent.parent / "docs"
SCHEMA_DOC = DOCS / "log-schema.md"
METADATA = DOCS / "datasette-metadata.json"


def documented_columns() -> dict[str, str]:
    """Column -> meaning (with its unit, as the metadata shows it), from the doc's table."""
    rows = table_rows(doc_section("Columns", SCHEMA_DOC), ("column", "type", "unit", "meaning"))
    described = {}
    for column, _type, unit, meaning, *_ in rows:
        (name,) = names(column)
        text = re.sub(r"`([^`]*)`", r"\1", meaning)
        described[name] = f"{text} [{unit}]" if unit else text
    return described


def test_the_doc_lists_every_column_of_the_view_in_order(db: Path) -> None:
    conn = sqlite3.connect(db)
    columns = [row[1] for row in conn.execute("PRAGMA table_info(decisions)")]
    conn.close()
    assert list(documented_columns()) == columns


def test_log_json_and_csv_print_the_documented_fields(db: Path) -> None:
    as_json = kvbudget("--db", str(db), "--json")
    assert as_json.returncode == 0, as_json.stderr
    lines = as_json.stdout.splitlines()
    assert lines and all(list(json.loads(line)) == list(documented_columns()) for line in lines)
    as_csv = kvbudget("--db", str(db), "--csv")
    assert as_csv.stdout.splitlines()[0].split(",") == list(documented_columns())


def test_disk_usage_json_prints_the_documented_fields(db: Path) -> None:
    rows = table_rows(doc_section("`kvbudget log --disk-usage --json`", SCHEMA_DOC), ("field",))
    done = kvbudget("--db", str(db), "--disk-usage", "--json")
    assert done.returncode == 0, done.stderr
    assert list(json.loads(done.stdout)) == [names(row[0])[0] for row in rows]


def test_datasette_metadata_describes_the_view_and_its_tables() -> None:
    tables = json.loads(METADATA.read_text())["databases"]["decisions"]["tables"]
    for name in ("decisions", "decisions_indexed", "decisions_recent"):
        assert tables[name]["columns"] == documented_columns(), name
    assert "meta" in tables


def test_the_doc_names_every_kind_the_version_and_the_operator_rows() -> None:
    from kvbudget.cli.cmd_log import KINDS
    from kvbudget.daemon.core.records import DecisionKind
    from kvbudget.daemon.log.schema import SCHEMA_VERSION

    rows = table_rows(doc_section("Columns", SCHEMA_DOC), ("column", "type", "unit", "meaning"))
    (kind_meaning,) = [meaning for column, _type, _unit, meaning, *_ in rows if names(column) == ["kind"]]
    kinds = re.findall(r"`([a-z_]+)`", kind_meaning)
    assert kinds == [k.value for k in DecisionKind] == list(KINDS)  # `kvbudget log --kind` takes each
    tables = table_rows(doc_section("What to query", SCHEMA_DOC), ("name", "kind", "holds"))
    (meta,) = [holds for name, _kind, holds, *_ in tables if names(name) == ["meta"]]
    assert f"`schema_version` (`{SCHEMA_VERSION}`)" in meta
    # The operator rows' table: the (kind, reason) pairs the daemon writes for a change
    # (daemon/server/admin_changes.py; tests/test_log_admin_rows.py writes each).
    changes = table_rows(doc_section("Operator changes (`admin` and `policy` rows)", SCHEMA_DOC),
                         ("what", "`kind`", "`reason`"))
    assert sorted((kind.strip("`"), reason.strip("`")) for _what, kind, reason, *_ in changes) == [
        ("admin", "draining"), ("admin", "quota"), ("policy", "switch")]
