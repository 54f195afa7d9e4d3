"""A fresh ledger on each backend, for tests in any folder, and what a missing PostgreSQL means.

SQLite: a file in the folder given. PostgreSQL: a database of its own on the server named by
``EFFECTFLOW_TEST_PG`` (default: the local one), dropped after. When no server answers, the test
skips, saying why — unless ``EFFECTFLOW_REQUIRE_PG`` is set (``.ci/run`` sets it): then it fails,
so that a run whose PostgreSQL half did not run cannot pass. Every fixture that needs the shared
server, or a private one (``pg_server``), goes through :func:`pg_missing`.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlparse, urlunparse

import psycopg
import pytest

#: The PostgreSQL server the postgres half of the tests uses (its maintenance database).
PG = os.environ.get("EFFECTFLOW_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")

#: The variable that says the PostgreSQL tests must run: set and not ``0``, a missing server fails
#: them instead of skipping them.
REQUIRE_PG = "EFFECTFLOW_REQUIRE_PG"

#: The backends a ledger test runs on.
BACKENDS = ("sqlite", "postgres")


def pg_required() -> bool:
    """Whether this run must not skip the PostgreSQL tests (``EFFECTFLOW_REQUIRE_PG``)."""
    return os.environ.get(REQUIRE_PG, "") not in ("", "0")


def pg_missing(reason: str) -> NoReturn:
    """Skip the test for ``reason`` — or fail it, where ``EFFECTFLOW_REQUIRE_PG`` is set."""
    if pg_required():
        pytest.fail(f"{reason} ({REQUIRE_PG} is set: the PostgreSQL tests must run)", pytrace=False)
    pytest.skip(reason)


def pg_unreachable(url: str, exc: BaseException) -> NoReturn:
    """:func:`pg_missing` for a server at ``url`` that did not answer with ``exc``."""
    pg_missing(f"PostgreSQL not reachable at {url}: {' '.join(str(exc).split())}")


def url_of(database: str, server: str = PG) -> str:
    """The URL of ``database`` on the server of URL ``server`` (its query, if any, kept)."""
    return urlunparse(urlparse(server)._replace(path=f"/{database}"))


@contextlib.contextmanager
def pg_database(prefix: str = "ef_it") -> Iterator[str]:
    """The URL of a new, empty database on the test server; dropped (its sessions ended) after."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    try:
        with psycopg.connect(PG, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as exc:
        pg_unreachable(PG, exc)
    try:
        yield url_of(name)
    finally:
        with psycopg.connect(PG, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def fresh(backend: str, folder: Path, prefix: str = "ef_it") -> Iterator[str]:
    """The URL of an empty ledger on ``backend`` for the duration of the block."""
    if backend == "sqlite":
        yield f"sqlite:///{folder / 'ledger.db'}"
        return
    with pg_database(prefix) as url:
        yield url


class Raw:
    """SQL on one ledger around the store, whatever its backend: the view of someone with write
    access to the database and no audit key (``?`` placeholders on both)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.pg = not url.startswith("sqlite")

    def sql(self, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run one statement in a transaction of its own; its rows."""
        if not self.pg:
            conn = sqlite3.connect(self.url.removeprefix("sqlite:///").split("?")[0])
            try:
                rows = conn.execute(statement, params).fetchall()
                conn.commit()
                return rows
            finally:
                conn.close()
        with psycopg.connect(self.url, autocommit=True) as pg:
            cur = pg.execute(statement.replace("?", "%s"), params)
            return cur.fetchall() if cur.description else []

    def unprotect(self) -> None:
        """What an attacker does first: the append-only triggers of audit and seals go."""
        for table in ("audit", "seals"):
            for what in ("update", "delete"):
                on = f" ON {table}" if self.pg else ""
                self.sql(f"DROP TRIGGER IF EXISTS {table}_no_{what}{on}")
