"""Which schema version a ledger is at, and what opening it would apply, read without changing it.

Opening a ledger migrates it (``SQLCore.migrate``), so ``effectflow migrate --check`` — the step a
deploy runs before it starts new workers, or a readiness gate that must not write — does not open
one: it reads ``schema_migrations`` over a plain connection (SQLite in its read-only mode).
"""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path
from urllib.parse import urlparse

from effectflow import errors
from effectflow.ledger import edge


@dataclasses.dataclass(frozen=True)
class SchemaStatus:
    """A ledger's schema against this effectflow's migrations."""

    #: The ledger: its file, or its URL without the password.
    where: str
    #: The newest migration applied; None when there is no ledger there yet.
    current: int | None
    #: The newest migration this effectflow has.
    newest: int
    #: ``(version, name)`` of each migration opening the ledger would apply, in order.
    pending: tuple[tuple[int, str], ...]

    @property
    def newer(self) -> bool:
        """Whether the ledger was migrated by a newer effectflow (this one refuses to open it)."""
        return self.current is not None and self.current > self.newest


def status(url: str) -> SchemaStatus:
    """The schema status of the ledger ``url`` names; nothing is written, nothing is created.

    Raises:
        errors.ContractError: a malformed URL.
        errors.LedgerFileError: an SQLite file that is not an effectflow ledger.
        errors.LedgerUnavailable: the database cannot be reached.
    """
    scheme = urlparse(url).scheme if "://" in url else ""
    if scheme in ("postgres", "postgresql"):
        return _postgres(url)
    return _sqlite(url)


def _status(
    where: str, applied: set[int] | None, migrations: list[tuple[int, str, str]]
) -> SchemaStatus:
    done = applied or set()
    return SchemaStatus(
        where=where,
        current=None if applied is None else max(applied, default=0),
        newest=migrations[-1][0],
        pending=tuple((v, name) for v, name, _ in migrations if v not in done),
    )


def _sqlite(url: str) -> SchemaStatus:
    from effectflow.ledger import sqlite

    path, _ = sqlite.parse_url(url)
    if path == ":memory:" or not Path(path).exists():
        return _status(path, None, sqlite.migrations())
    with edge.driver_errors(path, (sqlite3.OperationalError,), sqlite3.Error):
        conn = sqlite3.connect(f"{Path(path).absolute().as_uri()}?mode=ro", uri=True)
        try:
            try:
                tables = {r[0] for r in conn.execute(sqlite.SQLiteStore.SQL["file_tables"])}
            except sqlite3.DatabaseError as exc:
                raise errors.LedgerFileError(
                    f"{path} cannot be read as an SQLite database ({exc}); it was not touched"
                ) from None
            if "schema_migrations" not in tables:
                if tables - {"sqlite_sequence"}:
                    raise errors.LedgerFileError(
                        f"{path} is an SQLite database of another application (tables: "
                        f"{', '.join(sorted(tables)[:5])}), not an effectflow ledger"
                    )
                return _status(path, None, sqlite.migrations())
            sql = sqlite.SQLiteStore.SQL["applied_migrations"]
            applied = {int(r[0]) for r in conn.execute(sql)}
        finally:
            conn.close()
    return _status(path, applied, sqlite.migrations())


def _postgres(url: str) -> SchemaStatus:
    import psycopg

    from effectflow.ledger import postgres

    conninfo, _ = postgres.parse_url(url)
    where = postgres.redacted(url)
    with (
        edge.driver_errors(where, (psycopg.OperationalError,), psycopg.Error),
        psycopg.connect(conninfo, connect_timeout=10, application_name="effectflow") as conn,
    ):
        sql = postgres.PostgresStore.SQL
        row = conn.execute(sql["has_migrations_table"]).fetchone()
        applied = None
        if row is not None and row[0]:
            applied = {int(r[0]) for r in conn.execute(sql["applied_migrations"])}
    return _status(where, applied, postgres.migrations())
