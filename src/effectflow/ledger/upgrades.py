"""The packaged migrations (``ledger/migrations/<dialect>/NNNN_name.sql``) and the Python steps
some of them need after their SQL, in the same transaction.

The runner is ``SQLCore.migrate``; what each version changed is said at the top of its SQL file.
Version 8 on PostgreSQL rewrites every JSON column's text (``canonical_json_columns``); version 9's
work is all Python and shared by both dialects (``SQLCore._migrate_awaiting_approval``, run once
every pending script is applied, since it writes with today's statements): its scripts hold only
comments. Version 11 adds a step's ``arguments_json`` column (NULL for older steps).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from importlib import resources
from typing import Any

from effectflow import digests


def packaged(dialect: str) -> list[tuple[int, str, str]]:
    """A dialect's packaged migrations, ``(version, name, sql)`` in order."""
    folder = resources.files("effectflow.ledger").joinpath("migrations", dialect)
    found = []
    for entry in folder.iterdir():
        name = entry.name
        if name.endswith(".sql"):
            version = int(name.split("_", 1)[0])
            found.append((version, name.removesuffix(".sql"), entry.read_text("utf-8")))
    return sorted(found)


def split_sqlite_script(sql: str) -> list[str]:
    """The statements of an SQLite migration, one at a time (``sqlite3`` runs one per call);
    triggers keep their inner semicolons."""
    statements: list[str] = []
    buf: list[str] = []
    for line in sql.splitlines():
        stripped = line.strip()
        if not buf and (not stripped or stripped.startswith("--")):
            continue
        buf.append(line)
        text = "\n".join(buf)
        if stripped.endswith(";") and sqlite3.complete_statement(text):
            statements.append(text)
            buf = []
    if buf and "\n".join(buf).strip():
        statements.append("\n".join(buf))
    return statements


def has_statements(sql: str) -> bool:
    """Whether a migration's script holds a statement, not only comments (version 9's work is
    all in Python: ``SQLCore._through_write_path``)."""
    return any(line.strip() and not line.strip().startswith("--") for line in sql.splitlines())


#: The JSON columns migration 8 turned from jsonb into TEXT.
JSON_COLUMNS = {
    "runs": ("input_json", "output_json", "error_json", "control_json"),
    "steps": ("output_json", "error_json"),
    "attempts": ("error_json",),
    "effects": ("evidence_json",),
}


def canonical_json_columns(conn: Any) -> None:
    """After migration 8: the JSON text of earlier rows is jsonb's print (spaces, its own key
    order); rewrite it as the canonical print the write path makes and digests (same values). Read
    a thousand rows at a time (a server-side cursor): a large ledger is not held in memory."""
    for table, columns in JSON_COLUMNS.items():
        assignments = ", ".join(f"{c} = %s" for c in columns)
        with conn.cursor(name=f"effectflow_v8_{table}") as read:
            read.itersize = 1000
            read.execute(f"SELECT ctid::text, {', '.join(columns)} FROM {table}")
            while rows := read.fetchmany(1000):
                fixed = []
                for ctid, *texts in rows:
                    canonical = [
                        None if t is None else digests.canonical_json(json.loads(t)) for t in texts
                    ]
                    if canonical != texts:
                        fixed.append((*canonical, ctid))
                if fixed:
                    with conn.cursor() as cur:
                        cur.executemany(
                            f"UPDATE {table} SET {assignments} WHERE ctid = %s::tid", fixed
                        )


#: Python that a PostgreSQL migration needs after its SQL, in its transaction (each takes the
#: transaction's psycopg connection). The steps both dialects share are ``SQLCore._through_write_path``.
POSTGRES_AFTER: dict[int, Callable[[Any], None]] = {8: canonical_json_columns}
