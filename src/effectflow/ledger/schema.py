"""The ledger's schema as the migrations leave it, printed one way, for the published copies.

``docs/schema/sqlite.txt`` and ``docs/schema/postgres.txt`` are what a ledger at the newest version
holds: tables with their columns, indexes, triggers. ``tests/conformance/test_schema.py`` applies
every migration to a fresh ledger of each backend and compares: a migration that changes the
schema changes the published copy in the same commit, where a reviewer sees it. Print one with::

    python -m effectflow.ledger.schema sqlite:///path/to/new.db
    python -m effectflow.ledger.schema postgresql://postgres@127.0.0.1:5432/some_empty_database
"""

from __future__ import annotations

import sqlite3
import sys
from typing import Any

from effectflow.ledger import queries
from effectflow.ledger.store import open_store


def describe(url: str) -> str:
    """The schema of the ledger at ``url`` (migrated first, if it is new), one line a fact."""
    store: Any = open_store(url)
    try:
        if url.startswith("sqlite"):
            return _sqlite(store.path)
        return _postgres(store)
    finally:
        store.close()


def _sqlite(path: str) -> str:
    sql = queries.statements("sqlite")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        lines = []
        tables = [r[0] for r in conn.execute(sql["catalog_tables"])]
        for table in tables:
            create = conn.execute(sql["catalog_table_sql"], (table,)).fetchone()[0]
            without_rowid = "WITHOUT ROWID" in create
            lines.append(f"table {table}" + (" without rowid" if without_rowid else ""))
            columns = conn.execute(sql["catalog_columns"].format(table=table))
            for _, name, kind, notnull, default, pk in columns:
                lines.append(
                    f"  column {name} {kind or 'ANY'}"
                    + (" NOT NULL" if notnull else "")
                    + (f" DEFAULT {default}" if default is not None else "")
                    + (f" PK{pk}" if pk else "")
                )
        for kind, name, table, statement in conn.execute(sql["catalog_indexes_and_triggers"]):
            lines.append(f"{kind} {name} on {table}: {' '.join(statement.split())}")
        return "\n".join(lines) + "\n"
    finally:
        conn.close()


def _postgres(store: Any) -> str:
    lines = []
    tables = [r["table_name"] for r in store.audit_rows(store.SQL["catalog_schema_tables"], ())]
    for table in tables:
        lines.append(f"table {table}")
        for c in store.audit_rows(store.SQL["catalog_schema_columns"], (table,)):
            lines.append(
                f"  column {c['column_name']} {c['data_type']}"
                + (" NOT NULL" if c["is_nullable"] == "NO" else "")
                + (f" DEFAULT {c['column_default']}" if c["column_default"] is not None else "")
                + (" IDENTITY" if c["is_identity"] == "YES" else "")
            )
    for r in store.audit_rows(store.SQL["catalog_indexes"], ()):
        definition = (
            r["indexdef"].replace(" ON public.", " ON ").replace(" ON ONLY public.", " ON ")
        )
        lines.append(f"index {r['indexname']} on {r['tablename']}: {definition}")
    for r in store.audit_rows(store.SQL["catalog_triggers"], ()):
        lines.append(
            f"trigger {r['trigger_name']} on {r['event_object_table']}: "
            f"{r['action_timing']} {r['event_manipulation']}"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(describe(sys.argv[1]))
