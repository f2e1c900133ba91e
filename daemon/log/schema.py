"""The decision log's file format: tables, the row encoding of a Decision, and versioning.

Readers query the view `decisions` over `decisions_recent` (no index: cheap commits) and
`decisions_indexed` (rows folded in later); files of versions 1 and 2 are upgraded in place.
"""

from __future__ import annotations

import dataclasses
import functools
import sqlite3
import time
from typing import Any

import sqlite_utils

from kvbudget.daemon.core.records import Decision, DecisionKind, Reason

# Version 3 added the `admin` kind (an operator's change, reason `quota`): same columns, but
# a kvbudget that knows only versions 1-2 would fail on the kind mid-read (its QueryDecisions
# cannot name it), so it refuses the file by its version instead. Versions 1 and 2 hold no
# admin rows: read as they are, upgraded (the version bumped) when a daemon opens them.
SCHEMA_VERSION = 3
READABLE_VERSIONS = frozenset({"1", "2", "3"})  # version 1 has the same columns in one table
APP_NAME = "kvbudget"
VIEW = "decisions"  # what readers query
RECENT = "decisions_recent"  # what commits write
INDEXED = "decisions_indexed"  # where folded rows live

# Column type of each Decision field, from its annotation (the module uses postponed
# annotations, so these are strings). A new field with another type fails at import,
# which is the moment to bump SCHEMA_VERSION.
_SQL_TYPE_OF_ANNOTATION: dict[str, type] = {
    "int": int,
    "float": float,
    "str": str,
    "DecisionKind": str,
    "Reason": str,
    "tuple[int, ...]": str,  # JSON text
    "tuple[tuple[int, ...], ...]": str,  # JSON text
}
DECISION_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Decision))
JSON_FIELDS: frozenset[str] = frozenset(
    f.name for f in dataclasses.fields(Decision) if str(f.type).startswith("tuple")
)
COLUMNS: tuple[str, ...] = ("logged_at", *DECISION_FIELDS)
# seq came later (an `ORDER BY seq` or seq range from sqlite-utils or Datasette read the
# whole log): `ensure_indexes` adds a missing one when the daemon opens a log, with no
# version bump, as an older kvbudget reads a log with an extra index unchanged.
INDEXED_COLUMNS: tuple[str, ...] = ("logged_at", "request_id", "kind", "engine_id", "tenant", "seq")


def _column_types() -> dict[str, type]:
    types: dict[str, type] = {"id": int, "logged_at": float}
    for f in dataclasses.fields(Decision):
        try:
            types[f.name] = _SQL_TYPE_OF_ANNOTATION[str(f.type)]
        except KeyError:
            raise TypeError(f"Decision.{f.name}: no column type for {f.type!r}") from None
    return types


COLUMN_TYPES: dict[str, type] = _column_types()


class DecisionLogError(Exception):
    """The file is missing, unreadable, not SQLite, or not a KVBudget decision log."""


# ----------------------------------------------------------------------- encoding
@functools.lru_cache(maxsize=4096)
def _int_list(values: tuple[int, ...]) -> str:
    """JSON text of an int tuple. str(list) is valid JSON for ints ("[1, 2]") and runs in
    C, ~5x faster than json.dumps; remembered, because the per-group block counts of
    decisions (blocks_reserved, blocks_held) take few distinct values, and the lookup
    costs a third of building the text."""
    return str(list(values))


def _nested_int_list(values: tuple[tuple[int, ...], ...]) -> str:
    """JSON text of the block ids per group (not remembered: ids differ every time)."""
    if not values:
        return "[]"
    if len(values) == 1:  # one group (most models); often one block: skip the list repr
        (ids,) = values
        return f"[[{ids[0]}]]" if len(ids) == 1 else f"[{list(ids)}]"
    return str([list(ids) for ids in values])


# `kind` and `reason` are str enums. sqlite3 binds a str subclass only after trying its
# adaptation protocol (an adapter lookup and two missing-attribute lookups per value),
# which made them the dearest columns of a row; plain text binds at once.
_KIND_TEXT: dict[DecisionKind, str] = {k: k.value for k in DecisionKind}
_REASON_TEXT: dict[Reason, str] = {r: r.value for r in Reason}


def decision_row(row_id: int, decision: Decision, logged_at: float) -> tuple[Any, ...]:
    """One Decision as a row in `("id", *COLUMNS)` order."""
    d = decision
    return (
        row_id,
        logged_at,
        d.seq,
        d.time_s,
        _KIND_TEXT[d.kind],
        _REASON_TEXT[d.reason],
        d.request_id,
        d.engine_id,
        d.tenant,
        d.policy,
        d.prompt_tokens,
        d.max_new_tokens,
        d.num_tokens,
        d.num_computed,
        _int_list(d.blocks_reserved),
        _int_list(d.blocks_held),
        _nested_int_list(d.new_block_ids),
        d.freed_blocks,
        d.cached_hit_blocks,
        d.num_free_blocks,
        d.num_waiting,
        d.num_running,
        d.detail,
    )


# decision_row spells the fields out for speed; make sure it follows the dataclass.
assert DECISION_FIELDS == (
    "seq", "time_s", "kind", "reason", "request_id", "engine_id", "tenant", "policy",
    "prompt_tokens", "max_new_tokens", "num_tokens", "num_computed", "blocks_reserved",
    "blocks_held", "new_block_ids", "freed_blocks", "cached_hit_blocks", "num_free_blocks",
    "num_waiting", "num_running", "detail",
), "records.Decision changed: update decision_row and bump SCHEMA_VERSION"


def decision_from_row(row: dict[str, Any]) -> Decision:
    """Back from a `query_decisions` row (JSON columns already decoded) to a Decision."""
    values: dict[str, Any] = {name: row[name] for name in DECISION_FIELDS}
    values["kind"] = DecisionKind(values["kind"])
    values["reason"] = Reason(values["reason"])
    values["blocks_reserved"] = tuple(values["blocks_reserved"])
    values["blocks_held"] = tuple(values["blocks_held"])
    values["new_block_ids"] = tuple(tuple(ids) for ids in values["new_block_ids"])
    return Decision(**values)


# ----------------------------------------------------------------------- schema
def _create_tables(db: sqlite_utils.Database) -> None:
    """The tables, indexes and view (an existing `decisions_indexed` is kept)."""
    for table in (INDEXED, RECENT):
        db[table].create(COLUMN_TYPES, pk="id", column_order=["id", *COLUMNS], if_not_exists=True)
    ensure_indexes(db)
    db.create_view(VIEW, f"SELECT * FROM {INDEXED} UNION ALL SELECT * FROM {RECENT}")


def ensure_indexes(db: sqlite_utils.Database) -> None:
    """The indexes of INDEXED_COLUMNS that the indexed table lacks (a log made before one
    was added gets it on open: a one-off build, ~1 s per million rows)."""
    for column in INDEXED_COLUMNS:
        db[INDEXED].create_index([column], index_name=f"idx_{VIEW}_{column}", if_not_exists=True)


def create_or_upgrade(db: sqlite_utils.Database, where: str) -> None:
    """Create the schema in an empty file, upgrade a version-1 or -2 log, or check it is current."""
    if not db.table_names():
        with db.atomic():
            db["meta"].create({"key": str, "value": str}, pk="key")
            db["meta"].insert_all(
                [
                    {"key": "app", "value": APP_NAME},
                    {"key": "schema_version", "value": str(SCHEMA_VERSION)},
                    {"key": "created_at", "value": repr(time.time())},
                ]
            )
            _create_tables(db)
    elif (version := check_meta(db.conn, where)) == "1":
        # Version 1: the indexed table was named `decisions`. Renaming keeps its rows and
        # indexes (whose names already read idx_decisions_<column>).
        with db.atomic():
            db.execute(f"ALTER TABLE {VIEW} RENAME TO {INDEXED}")
            _create_tables(db)
            db["meta"].upsert({"key": "schema_version", "value": str(SCHEMA_VERSION)}, pk="key")
    else:
        with db.atomic():
            ensure_indexes(db)
            if version != str(SCHEMA_VERSION):  # version 2: the same tables; it may now hold admin rows
                db["meta"].upsert({"key": "schema_version", "value": str(SCHEMA_VERSION)}, pk="key")
    if check_meta(db.conn, where) != str(SCHEMA_VERSION):
        raise DecisionLogError(f"{where}: upgrade to schema version {SCHEMA_VERSION} failed")


def check_meta(conn: sqlite3.Connection, where: str) -> str:
    """The file's schema version, if it is a KVBudget decision log this code can read."""
    try:
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            raise DecisionLogError(f"{where} is not a KVBudget decision log (no meta table)") from None
        raise DecisionLogError(f"cannot read {where}: {exc}") from None
    if meta.get("app") != APP_NAME:
        raise DecisionLogError(f"{where} is not a KVBudget decision log (meta.app={meta.get('app')!r})")
    version = meta.get("schema_version")
    if version not in READABLE_VERSIONS:
        raise DecisionLogError(
            f"{where} has schema version {version}, this kvbudget reads versions "
            f"{', '.join(sorted(READABLE_VERSIONS))}"
        )
    return str(version)
