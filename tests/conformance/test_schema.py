"""The schema the migrations leave is the published one (`docs/schema/`), on both backends, and
both backends hold the same tables with the same columns (PostgreSQL's `insert_seq` tie-breaker
aside): a migration that changes the schema changes the published copy in the same commit."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import ledgers
from effectflow.ledger import schema

PUBLISHED = Path(__file__).resolve().parents[2] / "docs" / "schema"


@pytest.mark.parametrize("backend", ledgers.BACKENDS)
def test_the_migrated_schema_is_the_published_one(tmp_path: Path, backend: str) -> None:
    with ledgers.fresh(backend, tmp_path, prefix="ef_schema") as url:
        found = schema.describe(url)
    published = (PUBLISHED / f"{backend}.txt").read_text()
    assert found == published, (
        f"the migrated {backend} schema differs from docs/schema/{backend}.txt; if the change is "
        f"meant, print the new one: python -m effectflow.ledger.schema <a new {backend} ledger URL>"
    )


def _columns(text: str) -> dict[str, list[str]]:
    tables: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        if m := re.match(r"table (\w+)", line):
            current = m.group(1)
            tables[current] = []
        elif m := re.match(r"  column (\w+)", line):
            tables[current].append(m.group(1))
    return tables


def test_both_backends_hold_the_same_tables_and_columns() -> None:
    sqlite = _columns((PUBLISHED / "sqlite.txt").read_text())
    postgres = _columns((PUBLISHED / "postgres.txt").read_text())
    assert sorted(sqlite) == sorted(postgres)
    for table, columns in sqlite.items():
        theirs = [c for c in postgres[table] if c != "insert_seq"]
        assert sorted(columns) == sorted(theirs), table
