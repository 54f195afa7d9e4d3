"""A fresh ledger on each backend, for tests in any folder.

SQLite: a file in the folder given. PostgreSQL: a database of its own on the server named by
``EFFECTFLOW_TEST_PG`` (default: the local one), dropped after; the test skips, saying why, when
no server answers.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

#: The PostgreSQL server the postgres half of the tests uses (its maintenance database).
PG = os.environ.get("EFFECTFLOW_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")

#: The backends a ledger test runs on.
BACKENDS = ("sqlite", "postgres")


@contextlib.contextmanager
def fresh(backend: str, folder: Path, prefix: str = "ef_it") -> Iterator[str]:
    """The URL of an empty ledger on ``backend`` for the duration of the block."""
    if backend == "sqlite":
        yield f"sqlite:///{folder / 'ledger.db'}"
        return
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    try:
        with psycopg.connect(PG, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as exc:
        pytest.skip(f"PostgreSQL not reachable at {PG}: {' '.join(str(exc).split())}")
    try:
        yield PG.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(PG, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
