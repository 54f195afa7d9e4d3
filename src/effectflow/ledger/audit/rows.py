"""The digests of state rows a seal holds, and the names rows have in it (``table:<id>``).

A digest must come out the same whether it is computed from the record a batch writes or from the
row read back from either backend: JSON fields are their canonical text, and a time is a float
even when SQLite hands a whole REAL back as an int. Version 8 digests a row by the values its
INSERT sends (``values_digest``); version 7 digested the record (``row_digest``), and seals of
that version are still verified that way.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from typing import Any

from effectflow import digests
from effectflow.ledger import records

#: Run fields that change without a batch (leases), or that are the seals' own bookkeeping: not
#: sealed.
_VOLATILE = {
    "runs": {"lease_owner", "lease_token", "lease_expires_at", "updated_at"},
}


def row_digest(table: str, record: Any) -> str:
    """The digest of one state row as a record, the same whether computed from the record a batch
    writes or from the row read back (its JSON columns round-trip through canonical JSON)."""
    # The record's own fields, shallow (no deep copy: canonical JSON walks nested values once;
    # enums are strings to it). This runs for every row of every write: keep it lean.
    data: dict[str, Any] = record.__dict__
    late = [k for k in _LATE.get(table, ()) if k in data and data[k] is None]
    if late:  # sealed (version 7) before the column existed
        data = {k: v for k, v in data.items() if k not in late}
    volatile = _VOLATILE.get(table)
    if volatile:
        data = {k: v for k, v in data.items() if k not in volatile}
    ints = [k for k in _float_fields(type(record)) if type(data.get(k)) is int]
    if ints:  # SQLite hands a whole REAL back as an int: a time is a float either way
        data = {**data, **{k: float(data[k]) for k in ints}}
    # 128 bits: the seal that holds it is itself hashed (and keyed): a shorter digest keeps each
    # seal, written with every batch, small.
    return digests.sha256_hex(digests.canonical_json([table, data]))[:32]


#: The record type each sealed table holds (its fields are the table's columns, in this order).
_RECORDS: dict[str, type] = {}
#: Fields stored as canonical JSON text (``<field>_json`` columns).
JSON_FIELDS = frozenset({"input", "output", "error", "evidence", "control", "detail", "arguments"})
#: Per table: the columns added after seals began (the last of the record's fields), each with
#: the version that added it. A row sealed before its column existed was digested without it; a
#: NULL in that column is digested the same way, so those seals still verify, and any value set
#: there since is an edit. (Steps' ``arguments``: version 11.)
_LATE = {"steps": ("arguments",)}
#: Per table: the record's field names, and the positions of its float fields (times).
_LAYOUT: dict[str, tuple[tuple[str, ...], tuple[int, ...]]] = {}


def _layout(table: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    found = _LAYOUT.get(table)
    if found is None:
        cls = _record_types()[table]
        names = tuple(f.name for f in dataclasses.fields(cls))
        floats = set(_float_fields(cls))
        found = (names, tuple(i for i, name in enumerate(names) if name in floats))
        _LAYOUT[table] = found
    return found


def _record_types() -> dict[str, type]:
    if not _RECORDS:
        _RECORDS.update(
            steps=records.StepRecord,
            effects=records.EffectRecord,
            attempts=records.AttemptRecord,
            approvals=records.ApprovalRecord,
            decisions=records.DecisionRecord,
            operations=records.OperationBinding,
        )
    return _RECORDS


def values_digest(table: str, values: list[Any]) -> str:
    """The digest of one state row as the values a batch writes to its columns: the record's
    fields in order, JSON ones as their canonical text (``record_values``). Written from the list
    the INSERT sends anyway (no second print of its JSON), verified from the row read back.

    A time is a float either way (SQLite hands a whole REAL back as an int; a test clock may give
    an int)."""
    floats = _layout(table)[1]
    late = _LATE.get(table)
    if late:
        values = _without_late(values, len(late))
    for i in floats:
        if type(values[i]) is int:
            values = [
                float(v) if type(v) is int and j in floats else v for j, v in enumerate(values)
            ]
            break
    # 128 bits: the seal that holds it is itself hashed (and keyed); a shorter digest keeps each
    # seal, written with every batch, small. (The values are JSON scalars and canonical texts:
    # no key to sort, so the plain encoder prints them the one way.)
    text = table + _print_values(values, floats)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def _print_values(values: list[Any], floats: tuple[int, ...]) -> str:
    """``_plain(values)``, the same text; a row with a float in one of its ``floats`` positions
    printed value by value, its floats by ``digests.json_number``.

    A float's print is the dearest part of a row's (~8,000 instructions of a row's ~50,000, and
    a row has two or three), and the times a batch prints repeat (its ``now``, the times of the
    rows it rewrites): ``json_number`` remembers them. Each other value is printed as the encoder
    prints it inside a list: a ``str`` by the encoder's own ``encode_basestring``, ``None`` as
    ``null``, an exact ``int`` by ``int.__repr__``, and anything else by the encoder itself."""
    end = len(values)
    for i in floats:
        if i < end and type(values[i]) is float:
            break
    else:
        return _plain(values)
    text = digests.json_string
    number = digests.json_number
    whole = int.__repr__
    plain = _plain
    return (
        "["
        + ",".join(
            [
                text(v)
                if type(v) is str
                else "null"
                if v is None
                else number(v)
                if type(v) is float
                else whole(v)
                if type(v) is int
                else plain(v)
                for v in values
            ]
        )
        + "]"
    )


def _without_late(values: list[Any], count: int) -> list[Any]:
    """``values`` without its trailing late columns that are NULL (the last first: a column added
    later is only left out when the ones after it are too)."""
    end = len(values)
    while count and end and values[end - 1] is None:
        end -= 1
        count -= 1
    return values if end == len(values) else values[:end]


#: A list of scalars prints the same with or without sorted keys; without, the C encoder's
#: fast path (made once: ``digests.json_printer``).
_plain = digests.json_printer(sort_keys=False)


def record_values(table: str, record: Any) -> list[Any]:
    """A record as the values its table's columns hold: JSON fields as canonical text."""
    data = record.__dict__
    return [
        digests.canonical_json(data[f]) if f in JSON_FIELDS and data[f] is not None else data[f]
        for f in _layout(table)[0]
    ]


_FLOATS: dict[type, tuple[str, ...]] = {}


def _float_fields(cls: type) -> tuple[str, ...]:
    """The record's float fields (times): what a backend may hand back as a whole int."""
    found = _FLOATS.get(cls)
    if found is None:
        found = tuple(
            f.name for f in dataclasses.fields(cls) if str(f.type).split(" |")[0] == "float"
        )
        _FLOATS[cls] = found
    return found


#: The run's fields a write may change (sealed with every write) and its JSON ones; the rest is
#: fixed at its creation and sealed once (``runs_fixed``), so a write does not encode the input.
RUN_STATE = (
    "status", "output", "error", "next_action", "generation", "control", "workflow_version",
    "workflow_code",
)  # fmt: skip
RUN_JSON = frozenset({"output", "error", "control"})
_RUN_FIXED_DROP = frozenset(RUN_STATE) | _VOLATILE["runs"]


def run_state_digest(state: Mapping[str, Any]) -> str:
    """The digest of a run's changing fields, given with its JSON fields as canonical JSON text
    (how SQLite stores them): cheap enough for every write."""
    return digests.sha256_hex(digests.canonical_json(["runs", [state[f] for f in RUN_STATE]]))[:32]


def run_state_of(run: Any, changes: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A run record's changing fields in ``run_state_digest`` form, ``changes`` applied."""
    state = {f: getattr(run, f) for f in RUN_STATE}
    state.update({k: v for k, v in (changes or {}).items() if k in state})
    return _as_state(state)


def _as_state(state: dict[str, Any]) -> dict[str, Any]:
    return {
        k: (None if v is None else digests.canonical_json(v)) if k in RUN_JSON else v
        for k, v in state.items()
    }


def apply_state(state: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """A stored run state (JSON fields as text) with a batch's ``changes`` applied."""
    out = dict(state)
    out.update(_as_state({k: v for k, v in changes.items() if k in out}))
    return out


def digest_of(table: str, record: Any, by_columns: bool = True) -> str:
    """A row's digest as a seal holds it: ``by_columns`` as version 8 writes them
    (``values_digest``), else as version 7 did (``row_digest``)."""
    if table == "runs":
        return run_state_digest(run_state_of(record))
    if table == "runs_fixed":
        fixed = {k: v for k, v in record.__dict__.items() if k not in _RUN_FIXED_DROP}
        fixed["created_at"] = float(fixed["created_at"])  # SQLite: a whole REAL comes back an int
        return digests.sha256_hex(digests.canonical_json(["runs_fixed", fixed]))[:32]
    if by_columns:
        return values_digest(table, record_values(table, record))
    return row_digest(table, record)


#: Each sealed table's id field.
_ID_FIELD = {
    "steps": "step_id",
    "effects": "effect_id",
    "attempts": "attempt_id",
    "approvals": "approval_id",
    "decisions": "decision_id",
    "operations": "logical_operation_id",
}


def row_key(table: str, record: Any) -> str:
    """The name a row has in a seal: ``table:<its id>``."""
    return f"{table}:{record.__dict__[_ID_FIELD[table]]}"
