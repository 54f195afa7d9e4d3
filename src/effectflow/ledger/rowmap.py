"""How records become rows and rows records, the same on both ledgers.

Each record maps to a table whose columns are its fields; a JSON field lives in a ``<field>_json``
column holding the canonical JSON text the write path printed (TEXT on SQLite and, since ledger
version 8, on PostgreSQL too), so a record reads back exactly as it was written on either backend.
A row is anything that reads by column name: an ``sqlite3.Row``, a psycopg dict row, a dict.
The statements that write and read them are the named queries of ``ledger/queries/``; their
column lists follow the records' fields in order (``tests/conformance/test_queries.py``).
"""

from __future__ import annotations

import dataclasses
import json
import operator
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


#: The JSON fields' columns (every other field's column is its name).
_JSON_COLUMNS = {f: f"{f}_json" for f in JSON_FIELDS}


def column(field: str) -> str:
    """The column a record's field lives in."""
    return _JSON_COLUMNS.get(field, field)


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


def dumps(value: Any) -> str | None:
    """A JSON field's column value (None stays NULL)."""
    return None if value is None else digests.canonical_json(value)


def loads(text: str | None) -> Any:
    """A JSON column's value as the field it was."""
    return None if text is None else json.loads(text)


def value(field: str, value: Any) -> Any:
    """One field's column value."""
    return dumps(value) if field in JSON_FIELDS else value


#: The records' fields that hold one of their ``StrEnum`` values (a status, a next action, an
#: attempt's kind and outcome, a compensation status). Only a speed-up: a ``str`` subclass found
#: in one is sent as its plain ``str``, and any other value as it is.
_ENUM_FIELDS = frozenset({"status", "next_action", "kind", "outcome", "compensation_status"})

_Layout = tuple[list[str], Callable[[dict[str, Any]], Any], tuple[int, ...], tuple[int, ...]]
#: Per field list (by identity; the list is kept so that its id is never reused): a getter of its
#: fields from a record's ``__dict__``, the positions of its JSON fields and of its enum fields.
_LAYOUTS: dict[int, _Layout] = {}


def _layout(names: list[str]) -> _Layout:
    found = _LAYOUTS.get(id(names))
    if found is None or found[0] is not names:
        if len(_LAYOUTS) > 256:  # field lists made per call (not this module's): don't grow
            _LAYOUTS.clear()
        getter = operator.itemgetter(*names) if len(names) > 1 else lambda d: (d[names[0]],)
        at_json = tuple(i for i, name in enumerate(names) if name in JSON_FIELDS)
        at_enum = tuple(i for i, name in enumerate(names) if name in _ENUM_FIELDS)
        found = (names, getter, at_json, at_enum)
        _LAYOUTS[id(names)] = found
    return found


def row_values(record: Any, names: list[str]) -> list[Any]:
    """A record's column values, in ``names`` order (what an INSERT sends, and a seal digests).

    An enum field's value is sent as the plain ``str`` it is (the same text, stored and digested
    alike): a ``str`` subclass is not one of the types ``sqlite3`` binds directly, and looking for
    its adapter costs ~3,000 instructions a value (18 a write step)."""
    # Read the instance dict directly, all fields in one C call, and print only the JSON ones:
    # seven records a step go through here.
    _, getter, at_json, at_enum = _layout(names)
    values = list(getter(record.__dict__))
    for i in at_json:
        found = values[i]
        if found is not None:
            values[i] = digests.canonical_json(found)
    for i in at_enum:
        found = values[i]
        if type(found) is not str and isinstance(found, str):
            values[i] = str.__str__(found)
    return values


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


#: The run's changing fields and their columns (``run_state`` reads one with every batch).
_RUN_STATE_COLUMNS = tuple((f, column(f)) for f in audit.RUN_STATE)


def run_state(row: Row) -> dict[str, Any]:
    """The run's changing fields as stored (JSON ones as their canonical text), for its seal."""
    return {f: row[c] for f, c in _RUN_STATE_COLUMNS}


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
