"""One conformance suite, every ledger backend.

Each backend is described by a ``Backend``: how to open a store on a fresh database, and how an
attacker with direct database access would reach the raw tables (to prove tampering is detected).
Tests take ``store`` (a fresh store) or ``backend`` (to reopen, or to go around the store).

To add a backend, add its name to ``BACKENDS`` and a branch to ``backend`` building its ``Backend``.

PostgreSQL: the server named by ``EFFECTFLOW_TEST_PG`` (default: the local one), where the session
makes a database and each test gets a fresh schema of it (see ``pg_empty_url``), dropped after the
test. When no server answers, the postgres tests skip, saying why (and fail where
``EFFECTFLOW_REQUIRE_PG`` is set: ``ledgers.pg_missing``).
"""

from __future__ import annotations

import dataclasses
import sqlite3
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

import psycopg
import pytest

import ledgers
from effectflow.ledger import postgres as postgres_backend
from effectflow.ledger import sqlite as sqlite_backend
from effectflow.ledger.store import LedgerStore, open_store

#: The backends every conformance test runs against.
BACKENDS = ["sqlite", "postgres"]

#: The PostgreSQL server the postgres tests use: a URL of its maintenance database.
PG_URL = ledgers.PG


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
    #: Runs one SQL statement (``?`` placeholders on every backend) on a connection of its own;
    #: returns the rows.
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


def _pg_admin(sql: str, url: str = PG_URL) -> None:
    """Run one statement in autocommit (CREATE/DROP DATABASE cannot run in a transaction)."""
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql)


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """The URL of a database made for this session on the test server, dropped at its end."""
    with ledgers.pg_database("effectflow_test") as url:
        yield url


@pytest.fixture
def pg_empty_url(pg_database: str) -> Iterator[str]:
    """The URL of a fresh, empty schema (nothing migrated), dropped with its tables after the test.

    A schema, not a database per test: CREATE DATABASE forces a checkpoint that writes out the
    whole previous copy, a second or more per test on a busy disk; a schema costs milliseconds.
    Every connection the URL opens (pool, listener, raw access) works in that schema.
    """
    schema = f"t_{uuid.uuid4().hex[:12]}"
    _pg_admin(f"CREATE SCHEMA {schema}", pg_database)
    parsed = urlparse(pg_database)
    option = f"options=-csearch_path%3D{schema}"
    yield urlunparse(parsed._replace(query=f"{parsed.query}&{option}" if parsed.query else option))
    _pg_admin(f"DROP SCHEMA {schema} CASCADE", pg_database)


@pytest.fixture
def pg_backend(pg_empty_url: str) -> Backend:
    """A fresh PostgreSQL ledger: an empty schema that the first store opened migrates."""

    def execute(sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(pg_empty_url, autocommit=True) as conn:
            cur = conn.execute(sql.replace("?", "%s"), params or None)
            return cur.fetchall() if cur.description is not None else []

    return Backend(
        name="postgres",
        url=pg_empty_url,
        db_error=psycopg.Error,
        migration_versions=[version for version, _, _ in postgres_backend.migrations()],
        execute=execute,
        drop_trigger_sql=lambda trigger: f"DROP TRIGGER {trigger} ON audit",
    )


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """A fresh database of each backend."""
    if request.param == "sqlite":
        return _sqlite(tmp_path)
    if request.param == "postgres":
        made: Backend = request.getfixturevalue("pg_backend")
        return made
    raise AssertionError(f"no conformance fixture for backend {request.param!r}")


@pytest.fixture
def store(backend: Backend) -> Iterator[LedgerStore]:
    """A store opened on a fresh database of each backend."""
    opened = backend.open()
    yield opened
    opened.close()
