"""What ``audit.verify`` reads, a chunk of runs at a time: the same ``audit.Material`` per run as
``audit.materials``, in a number of statements that grows with the chunks, not the runs.

``audit.materials`` reads each run through the store's own readers: eight statements a run and one
more per effect (a PostgreSQL round trip each). This reads the ``runs`` rows a chunk at a time in
run id order (``run_id > `` the last of the previous chunk, through the primary key), each row
giving both the chains' heads and the run record; then each other table once for the chunk —
``run_id BETWEEN first AND last``, which the run id indexes answer — and groups the rows by run.
Rows become records through the backend's own row mappers, in the order its readers give them, so
each ``Material`` equals, field by field, the one ``audit.materials`` builds
(tests/conformance/test_audit_read.py). A store of neither backend is read run by run.

The statements are the dialect's named queries (``chunk_*`` in ``ledger/queries/<dialect>.sql``,
where each orders a run's rows as that dialect's reader of one run does). Every chunk statement
finds its rows through an index (``operations`` by run and ``decisions`` by effect since ledger
version 8). ``audit.verify`` reads inside ``store.audit_snapshot``, so on a ledger being written
every statement sees the same moment.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from effectflow import errors
from effectflow.ledger import audit, queries, rowmap
from effectflow.ledger import store as store_mod

#: A row as ``audit_rows`` returns it: column name -> value.
Row = dict[str, Any]
#: How a backend turns a row of one table into its record.
Mapper = Callable[[Row], Any]


class RowReader(Protocol):
    """What this module needs of a store: its dialect's named statements, and read-only queries
    (``?`` placeholders, or the dialect's own)."""

    @property
    def SQL(self) -> Mapping[str, str]:
        """The dialect's named statements (``ledger/queries/<dialect>.sql``)."""
        ...

    def audit_rows(self, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        """The rows of a read-only query."""
        ...


@dataclasses.dataclass(frozen=True)
class Dialect:
    """A backend's row mappers and its named statements, whose chunk reads order each table's rows
    as its readers of one run do."""

    #: ``runs`` row -> ``records.RunRecord``.
    run: Mapper
    #: ``steps`` row -> ``records.StepRecord``.
    step: Mapper
    #: ``effects`` row -> ``records.EffectRecord``.
    effect: Mapper
    #: ``attempts`` row -> ``records.AttemptRecord``.
    attempt: Mapper
    #: ``approvals`` row -> ``records.ApprovalRecord``.
    approval: Mapper
    #: ``audit`` row -> ``records.AuditEvent``.
    event: Mapper
    #: The dialect's named statements (``queries.statements``).
    sql: Mapping[str, str]


def _dialect(name: str) -> Dialect:
    # Both ledgers map rows alike (``rowmap``); they order a run's rows by their own tie-breakers,
    # written in their query files.
    return Dialect(
        run=rowmap.run,
        step=rowmap.step,
        effect=rowmap.effect,
        attempt=rowmap.attempt,
        approval=rowmap.approval,
        event=rowmap.event,
        sql=queries.statements(name),
    )


@functools.cache
def sqlite_dialect() -> Dialect:
    """SQLite's (its index walks keep insertion order for equal keys: no tie-breaker)."""
    return _dialect("sqlite")


@functools.cache
def postgres_dialect() -> Dialect:
    """PostgreSQL's (its tables also hold ``insert_seq``, the tie-breaker of its orders)."""
    return _dialect("postgres")


def dialect_of(store: object) -> Dialect | None:
    """The dialect of a store of either backend, or None (another store: read run by run)."""
    dialect = getattr(type(store), "DIALECT", None)
    if dialect == "sqlite":
        return sqlite_dialect()
    if dialect == "postgres":
        return postgres_dialect()
    return None


def materials_batched(
    store: RowReader, run_id: str | None = None, *, chunk: int = 500
) -> Iterator[tuple[str, audit.Material]]:
    """Every run's material (or one run's), by run id in run id order, ``chunk`` runs at a time:
    what ``audit.materials`` returns, holding one chunk in memory.

    Raises:
        errors.ArgumentError: ``chunk`` is not a positive integer (raised here, not when the
            iterator is first read).
    """
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise errors.ArgumentError(f"chunk must be a positive integer, not {chunk!r}")
    return _materials(store, run_id, chunk, dialect_of(store))


def _materials(
    store: RowReader, run_id: str | None, chunk: int, dialect: Dialect | None
) -> Iterator[tuple[str, audit.Material]]:
    for heads in _run_chunks(store, run_id, chunk):
        if dialect is None:
            for head in heads:
                yield str(head["run_id"]), audit._material(store, head)
        else:
            yield from _chunk_materials(store, dialect, heads)


def _run_chunks(store: RowReader, run_id: str | None, chunk: int) -> Iterator[list[Row]]:
    """The ``runs`` rows, ``chunk`` at a time in run id order (through the primary key)."""
    if run_id is not None:
        found = store.audit_rows(store.SQL["get_run"], (run_id,))
        if found:
            yield found
        return
    after: str | None = None
    while True:
        rows = (
            store.audit_rows(store.SQL["chunk_first_runs"], (chunk,))
            if after is None
            else store.audit_rows(store.SQL["chunk_next_runs"], (after, chunk))
        )
        if rows:
            yield rows
        if len(rows) < chunk:
            return
        after = str(rows[-1]["run_id"])


#: Per table, the named query that reads a chunk's rows.
_CHUNK_QUERIES = {
    "steps": "chunk_steps",
    "effects": "chunk_effects",
    "attempts": "chunk_attempts",
    "approvals": "chunk_approvals",
    "operations": "chunk_operations",
    "decisions": "chunk_decisions",
    "seals": "chunk_seals",
    "audit": "chunk_audit",
}


def chunk_statements(dialect: Dialect) -> dict[str, str]:
    """Per table, the one statement that reads a chunk's rows (parameters: first and last run id).

    Each orders its rows as the backend's reader of one run does, after the run id (the seals and
    the event chain are in chain order; the other tables fill a dict, where order only decides
    which of two rows with one key is kept, as it does in ``audit.materials``)."""
    return {table: dialect.sql[name] for table, name in _CHUNK_QUERIES.items()}


def _chunk_materials(
    store: RowReader, dialect: Dialect, heads: list[Row]
) -> Iterator[tuple[str, audit.Material]]:
    """The materials of one chunk of runs (``heads``: their ``runs`` rows, in run id order)."""
    first, last = str(heads[0]["run_id"]), str(heads[-1]["run_id"])
    found: dict[str, collections.defaultdict[str, list[Row]]] = {}
    for table, sql in chunk_statements(dialect).items():
        column = "effect_run_id" if table == "decisions" else "run_id"
        # Rows of run ids between the chunk's that have no run (orphans) are grouped and never
        # read: ``audit.verify`` reports them on its own.
        by_run: collections.defaultdict[str, list[Row]] = collections.defaultdict(list)
        for row in store.audit_rows(sql, (first, last)):
            by_run[str(row[column])].append(row)
        found[table] = by_run
    for head in heads:
        rid = str(head["run_id"])
        yield rid, _material(dialect, head, {table: by[rid] for table, by in found.items()})


def _material(dialect: Dialect, head: Row, tables: Mapping[str, list[Row]]) -> audit.Material:
    """One run's material from its rows, built as ``audit._material`` builds it."""
    rid = str(head["run_id"])
    run = dialect.run(head)
    rows: dict[str, Any] = {f"runs:{rid}": run, f"runs_fixed:{rid}": run}
    for table, mapper in (
        ("steps", dialect.step),
        ("effects", dialect.effect),
        ("attempts", dialect.attempt),
        ("approvals", dialect.approval),
    ):
        for row in tables[table]:
            record = mapper(row)
            rows[audit.row_key(table, record)] = record
    for row in tables["operations"]:
        op = _record(store_mod.OperationBinding, row)
        rows[audit.row_key("operations", op)] = op
    for row in tables["decisions"]:
        decision = _record(store_mod.DecisionRecord, row)
        rows[audit.row_key("decisions", decision)] = decision
    seals = []
    for row in tables["seals"]:
        seal = dict(row)
        seal["rows"] = json.loads(seal["rows_json"])
        seals.append(seal)
    # A binding past its retention may have been purged (``purge_expired_keys``): not a deletion.
    purgeable = {name for seal in seals for name in seal["rows"] if name.startswith("operations:")}
    purgeable -= set(rows)
    return audit.Material(
        run=run,
        audit_head=str(head["audit_head"]),
        audit_count=int(head["audit_count"]),
        seal_head=head["seal_head"],
        seal_count=int(head["seal_count"] or 0),
        events=[dialect.event(row) for row in tables["audit"]],
        seals=seals,
        rows=rows,
        purgeable=purgeable,
    )


def _record(cls: type[Any], row: Row) -> Any:
    """A record whose fields are its table's columns (``audit._material``'s way)."""
    return cls(**{f.name: row[f.name] for f in dataclasses.fields(cls)})
