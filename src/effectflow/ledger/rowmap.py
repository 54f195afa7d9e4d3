"""How records become rows and rows records, the same on both ledgers.

Each record maps to a table whose columns are its fields; a JSON field lives in a ``<field>_json``
column holding the canonical JSON text the write path printed (TEXT on SQLite and, since ledger
version 8, on PostgreSQL too), so a record reads back exactly as it was written on either backend.
A row is anything that reads by column name: an ``sqlite3.Row``, a psycopg dict row, a dict.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from effectflow import digests
from effectflow.ledger import audit, expect, records
from effectflow.ledger.store import DecisionRecord, OperationBinding

T = TypeVar("T")


class Row(Protocol):
    """A row read by column name (``sqlite3.Row``, a psycopg dict row, a dict)."""

    def __getitem__(self, key: str, /) -> Any: ...


#: The fields stored as JSON text, in ``<field>_json`` columns.
JSON_FIELDS = audit.JSON_FIELDS


def column(field: str) -> str:
    """The column a record's field lives in."""
    return f"{field}_json" if field in JSON_FIELDS else field


def fields(cls: type[Any]) -> list[str]:
    """A record type's fields, in order: its table's columns."""
    return [f.name for f in dataclasses.fields(cls)]


RUN_FIELDS = fields(records.RunRecord)
STEP_FIELDS = fields(records.StepRecord)
ATTEMPT_FIELDS = fields(records.AttemptRecord)
EFFECT_FIELDS = fields(records.EffectRecord)
AUDIT_FIELDS = fields(records.AuditEvent)
DECISION_FIELDS = fields(DecisionRecord)
APPROVAL_FIELDS = fields(records.ApprovalRecord)
OPERATION_FIELDS = fields(OperationBinding)
RUN_COLUMNS = [column(f) for f in RUN_FIELDS]

#: What a batch reads of its run's row: the chains' heads, the control request, and the changing
#: fields its seal covers (not the input, however large: it is sealed once, at the creation).
HEAD = ", ".join(
    [
        "audit_head",
        "audit_count",
        "seal_head",
        "seal_count",
        "control_json",
        *(column(f) for f in audit.RUN_STATE),
    ]
)


def dumps(value: Any) -> str | None:
    """A JSON field's column value (None stays NULL)."""
    return None if value is None else digests.canonical_json(value)


def loads(text: str | None) -> Any:
    """A JSON column's value as the field it was."""
    return None if text is None else json.loads(text)


def value(field: str, value: Any) -> Any:
    """One field's column value."""
    return dumps(value) if field in JSON_FIELDS else value


def row_values(record: Any, names: list[str]) -> list[Any]:
    """A record's column values, in ``names`` order (what an INSERT sends, and a seal digests)."""
    # Read the instance dict directly: seven records a step go through here.
    data = record.__dict__
    return [dumps(data[name]) if name in JSON_FIELDS else data[name] for name in names]


def from_row(cls: type[T], names: list[str], row: Row) -> T:
    """The record a row holds."""
    return cls(**{f: (loads(row[column(f)]) if f in JSON_FIELDS else row[f]) for f in names})


def run(row: Row) -> records.RunRecord:
    """A ``runs`` row as its record."""
    found = from_row(records.RunRecord, RUN_FIELDS, row)
    return dataclasses.replace(
        found,
        status=records.RunStatus(found.status),
        next_action=records.NextAction(found.next_action),
    )


def run_state(row: Row) -> dict[str, Any]:
    """The run's changing fields as stored (JSON ones as their canonical text), for its seal."""
    return {f: row[column(f)] for f in audit.RUN_STATE}


def step(row: Row) -> records.StepRecord:
    """A ``steps`` row as its record."""
    found = from_row(records.StepRecord, STEP_FIELDS, row)
    return dataclasses.replace(
        found,
        status=records.StepStatus(found.status),
        next_action=records.NextAction(found.next_action),
    )


def attempt(row: Row) -> records.AttemptRecord:
    """An ``attempts`` row as its record."""
    found = from_row(records.AttemptRecord, ATTEMPT_FIELDS, row)
    return dataclasses.replace(
        found,
        kind=records.AttemptKind(found.kind),
        outcome=None if found.outcome is None else records.Outcome(found.outcome),
    )


def effect(row: Row) -> records.EffectRecord:
    """An ``effects`` row as its record."""
    found = from_row(records.EffectRecord, EFFECT_FIELDS, row)
    return dataclasses.replace(
        found,
        status=records.StepStatus(found.status),
        next_action=records.NextAction(found.next_action),
    )


def event(row: Row) -> records.AuditEvent:
    """An ``audit`` row as its event."""
    return from_row(records.AuditEvent, AUDIT_FIELDS, row)


def approval(row: Row) -> records.ApprovalRecord:
    """An ``approvals`` row as its record."""
    return from_row(records.ApprovalRecord, APPROVAL_FIELDS, row)


def decision(row: Row) -> DecisionRecord:
    """A ``decisions`` row as its record."""
    return from_row(DecisionRecord, DECISION_FIELDS, row)


def operation(row: Row) -> OperationBinding:
    """An ``operations`` row as its binding."""
    return from_row(OperationBinding, OPERATION_FIELDS, row)


#: How each expectation's row becomes what ``expect.refusal`` compares.
EXPECTED_ROW: dict[expect.Subject, Callable[[Row], Any]] = {
    expect.Subject.RUN: run,
    expect.Subject.STEP: step,
    expect.Subject.EFFECT: effect,
    expect.Subject.UNAPPROVED: lambda row: row["approval_id"],
}


def insert_sql(table: str, names: list[str], mark: str = "?") -> str:
    """``INSERT INTO table (columns) VALUES (marks)`` for a record's fields."""
    cols = [column(f) for f in names]
    return f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join(mark for _ in cols)})"


def upsert_sql(
    table: str,
    names: list[str],
    keys: tuple[str, ...],
    fixed: tuple[str, ...] = (),
    mark: str = "?",
) -> str:
    """An insert that updates the row its ``keys`` find. ``fixed``: indexed columns a record
    never changes after its insert, left out of the SET list (SQLite rewrites the entries of
    every index whose columns the SET list names, changed or not: each outcome commit spares
    those index pages)."""
    updates = ", ".join(
        f"{c} = excluded.{c}" for c in map(column, names) if c not in keys and c not in fixed
    )
    return (
        f"{insert_sql(table, names, mark)} ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {updates}"
    )


# -- the write path's statements (``?`` placeholders; PostgreSQL swaps in ``%s``) -------------------

UPSERT_STEP = upsert_sql("steps", STEP_FIELDS, ("run_id", "step_id"))
UPSERT_ATTEMPT = upsert_sql(
    "attempts", ATTEMPT_FIELDS, ("attempt_id",), fixed=("run_id", "step_id", "number")
)
UPSERT_EFFECT = upsert_sql(
    "effects",
    EFFECT_FIELDS,
    ("effect_id",),
    fixed=("run_id", "step_id", "created_at", "compensates"),
)
# A run id taken already inserts nothing and returns no row: the batch is refused on its own
# (IdempotencyConflict), not the group transaction it shares with other runs' batches.
INSERT_RUN = (
    f"INSERT INTO runs ({', '.join(RUN_COLUMNS)}, audit_head, audit_count) "
    f"VALUES ({', '.join('?' for _ in RUN_COLUMNS)}, ?, 0) "
    f"ON CONFLICT (run_id) DO NOTHING RETURNING {HEAD}"
)
INSERT_AUDIT = (
    "INSERT INTO audit (run_id, step_id, effect_id, kind, actor, detail_json, at, prev_hash, hash) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
#: The shards that hold seals (for the index row, ``audit.INDEX``).
USED_SHARDS = "SELECT shard FROM audit_shards WHERE n > 0 AND shard <> ?"
# A decision or approval id taken already (by a concurrent decision too: the insert waits for it)
# inserts nothing and returns no row: the batch is refused with IdempotencyConflict, never with
# the driver's unique violation.
INSERT_DECISION = (
    insert_sql("decisions", DECISION_FIELDS) + " ON CONFLICT DO NOTHING RETURNING decision_id"
)
INSERT_APPROVAL = (
    insert_sql("approvals", APPROVAL_FIELDS) + " ON CONFLICT DO NOTHING RETURNING approval_id"
)
BIND_OPERATION = (
    insert_sql("operations", OPERATION_FIELDS) + " ON CONFLICT DO NOTHING RETURNING tenant"
)
