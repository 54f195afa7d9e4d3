"""One conformance suite, every ledger backend.

Each backend is described by a ``Backend``: how to open a store on a fresh database, and how an
attacker with direct database access would reach the raw tables (to prove tampering is detected).
Tests take ``store`` (a fresh store) or ``backend`` (to reopen, or to go around the store).

To add a backend, add its name to ``BACKENDS`` and a branch to ``backend`` building its ``Backend``
(PostgreSQL: a fresh database cloned from a migrated template per test).
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from effectflow.ledger import sqlite as sqlite_backend
from effectflow.ledger.store import LedgerStore, open_store

#: The backends every conformance test runs against.
BACKENDS = ["sqlite"]


@dataclasses.dataclass
class Backend:
    """A backend under test, and raw access to its database."""

    #: The backend's name (the test id).
    name: str
    #: The URL a store opens.
    url: str
    #: The driver's base error, raised when the database itself refuses a statement.
    db_error: type[Exception]
    #: Versions of the migrations the backend ships, in order.
    migration_versions: list[int]
    #: Runs one SQL statement on a connection of its own; returns the rows.
    execute: Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]
    #: The statement that removes a named trigger (what an attacker with file access can do).
    drop_trigger_sql: Callable[[str], str]

    def open(self) -> LedgerStore:
        """A store on this backend's database (running its migrations)."""
        return open_store(self.url)


def _sqlite(tmp_path: Path) -> Backend:
    path = tmp_path / "l.db"

    def execute(sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()

    return Backend(
        name="sqlite",
        url=f"sqlite:///{path}",
        db_error=sqlite3.DatabaseError,
        migration_versions=[version for version, _, _ in sqlite_backend.migrations()],
        execute=execute,
        drop_trigger_sql=lambda name: f"DROP TRIGGER {name}",
    )


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """A fresh, empty database of each backend."""
    if request.param == "sqlite":
        return _sqlite(tmp_path)
    raise AssertionError(f"no conformance fixture for backend {request.param!r}")


@pytest.fixture
def store(backend: Backend) -> Iterator[LedgerStore]:
    """A store opened on a fresh database of each backend."""
    opened = backend.open()
    yield opened
    opened.close()
