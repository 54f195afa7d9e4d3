"""A fresh ledger on each backend, for tests in any folder, and what a missing PostgreSQL means.

SQLite: a file in the folder given. PostgreSQL: a database of its own on the server named by
``EFFECTFLOW_TEST_PG`` (default: the local one), dropped after. When no server answers, the test
skips, saying why — unless ``EFFECTFLOW_REQUIRE_PG`` is set (``.ci/run`` sets it): then it fails,
so that a run whose PostgreSQL half did not run cannot pass. Every fixture that needs the shared
server, or a private one (``pg_server``), goes through :func:`pg_missing`.

A PostgreSQL database costs its test more than the test itself, mostly: ``CREATE DATABASE``
copies ``template1`` through the WAL (0.1-0.5 s here) and ``DROP DATABASE`` waits for a checkpoint
(0.3-1.3 s). So one thread of each test process creates the next databases while a test runs and
drops the finished ones after it (:class:`_Spares`); a test still gets a database nobody used
before, made from ``template1``, and it is still dropped with its sessions ended.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
import threading
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


class _Spares:
    """Databases created ahead of the tests that take them, and dropped behind them, by one
    thread of this process: a test waits only for a rename (milliseconds), not for a copy of
    ``template1`` and a checkpoint.

    The thread starts after this process first created a database itself, so a server that does
    not answer is met by the test (``pg_unreachable``), never by the thread; a spare it fails to
    create is simply not there, and the test creates its own. :meth:`finish` (at the end of the
    session) drops what is left and says on stderr what it could not drop.
    """

    #: Databases kept ready: a test takes one, and now and then a second (another ledger).
    READY = 2

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._ready: list[str] = []
        self._making = 0
        self._drops: list[str] = []
        self._failed: list[str] = []
        self._thread: threading.Thread | None = None
        self._stopping = False

    def take(self, name: str) -> bool:
        """Rename a spare to ``name``; False when none is ready (the caller creates ``name``)."""
        with self._cond:
            spare = self._ready.pop(0) if self._ready else None
            self._cond.notify_all()
        if spare is None:
            return False
        try:
            with psycopg.connect(PG, autocommit=True, connect_timeout=3) as conn:
                conn.execute(f'ALTER DATABASE "{spare}" RENAME TO "{name}"')
        except psycopg.Error:
            self.drop(spare)
            return False
        return True

    def created(self) -> None:
        """This process created a database itself: the server answers, the thread may start."""
        with self._cond:
            if self._thread is None and not self._stopping:
                self._thread = threading.Thread(
                    target=self._work, name="test-databases", daemon=True
                )
                self._thread.start()

    def drop(self, name: str) -> None:
        """Drop ``name`` (its sessions ended) on the thread, or now where it does not run."""
        with self._cond:
            if self._thread is not None and not self._stopping:
                self._drops.append(name)
                self._cond.notify_all()
                return
        if not _drop_database(name):
            self._failed.append(name)

    def finish(self) -> None:
        """Let the thread drop what it holds, then drop the spares nobody took."""
        with self._cond:
            self._stopping = True
            thread = self._thread
            self._cond.notify_all()
        if thread is not None:
            thread.join(timeout=300)
        with self._cond:
            left = self._ready + self._drops
            self._ready, self._drops = [], []
        self._failed += [name for name in left if not _drop_database(name)]
        if self._failed:
            print(f"tests/ledgers.py: could not drop {sorted(self._failed)}", file=sys.stderr)

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._drops and not self._stopping and self._short() == 0:
                    self._cond.wait()
                if self._stopping and not self._drops:
                    return
                make = not self._stopping and self._short() > 0
                if make:
                    self._making += 1
                    name = f"ef_spare_{uuid.uuid4().hex[:12]}"
                else:
                    name = self._drops.pop(0)
            if make:
                made = _create_database(name)
                with self._cond:
                    self._making -= 1
                    if made:
                        self._ready.append(name)
                    else:
                        # The server refused a spare: the tests create their own from now on.
                        self._stopping = True
            elif not _drop_database(name):
                self._failed.append(name)

    def _short(self) -> int:
        """How many spares are missing (the lock held)."""
        return self.READY - len(self._ready) - self._making


def _create_database(name: str) -> bool:
    try:
        with psycopg.connect(PG, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error:
        return False
    return True


def _drop_database(name: str) -> bool:
    try:
        with psycopg.connect(PG, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    except psycopg.Error:
        return False
    return True


#: This process's spare databases (``tests/conftest.py`` finishes them at the session's end).
SPARES = _Spares()


@contextlib.contextmanager
def pg_database(prefix: str = "ef_it") -> Iterator[str]:
    """The URL of a new, empty database on the test server; dropped (its sessions ended) after
    the block, by :data:`SPARES`' thread."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    if not SPARES.take(name):
        try:
            with psycopg.connect(PG, autocommit=True, connect_timeout=3) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
        except psycopg.Error as exc:
            pg_unreachable(PG, exc)
        SPARES.created()
    try:
        yield url_of(name)
    finally:
        SPARES.drop(name)


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
