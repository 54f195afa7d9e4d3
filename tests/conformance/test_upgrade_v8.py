"""A version-7 ledger upgraded to version 8, on both backends: what version 7 sealed still
verifies (its row digests, its seals outside any shard, PostgreSQL's jsonb rewritten as canonical
text), and the runs it left paused go on under version 8 with a ledger that verifies after.

The ledger is `tests/fixtures/ledger_v7_keyed.sql`: written by effectflow at the last version-7
commit (keyed), dumped as INSERTs, and loaded here into each backend's version-7 schema.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

import effectflow as ef
import ledgers
from effectflow import digests
from effectflow.cli import main as cli_main
from effectflow.ledger import audit
from effectflow.ledger import postgres as pg_store
from effectflow.ledger import sqlite as sqlite_store

FIXTURE = Path(__file__).parent.parent / "fixtures" / "ledger_v7_keyed.sql"
KEY = "k" * 32


@ef.tool("v7_lost", effect="external_write", effect_id="id")
def lost(*, idempotency_key: str) -> dict[str, str]:
    raise ef.OutcomeUnknown("the answer was lost")


@ef.workflow("v7_doubt")
def doubt(ctx: ef.Context) -> Any:
    return ctx.call("lost", lost)


def _statements(fixture: Path) -> list[str]:
    return [
        line for line in fixture.read_text().splitlines() if line.startswith(("INSERT", "UPDATE"))
    ]


@contextlib.contextmanager
def _v7_ledger(backend: str, folder: Path) -> Iterator[str]:
    """A ledger at schema version 7 holding the fixture's rows."""
    with ledger_at(backend, folder, 7, FIXTURE) as url:
        yield url


@contextlib.contextmanager
def ledger_at(backend: str, folder: Path, at: int, fixture: Path) -> Iterator[str]:
    """A ledger at schema version ``at`` holding a fixture's rows (INSERT and UPDATE lines)."""
    with ledgers.fresh(backend, folder, prefix=f"ef_v{at}") as url:
        if backend == "sqlite":
            conn = sqlite3.connect(url.removeprefix("sqlite:///"))
            conn.execute(
                "CREATE TABLE schema_migrations "
                "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
            )
            for version, name, sql in sqlite_store.migrations():
                if version > at:
                    break
                for statement in sqlite_store._split_sql(sql):
                    conn.execute(statement)
                conn.execute("INSERT INTO schema_migrations VALUES (?, ?, 0)", (version, name))
            for statement in _statements(fixture):
                conn.execute(statement)
            conn.commit()
            conn.close()
        else:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(
                    "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, "
                    "name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)"
                )
                for version, name, sql in pg_store.migrations():
                    if version > at:
                        break
                    conn.execute(sql)
                    conn.execute(
                        "INSERT INTO schema_migrations VALUES (%s, %s, 0)", (version, name)
                    )
                for statement in _statements(fixture):
                    # the audit's seq is an identity column: keep the dumped numbers
                    conn.execute(
                        statement.replace(") VALUES (", ") OVERRIDING SYSTEM VALUE VALUES (", 1)
                        if statement.startswith("INSERT")
                        else statement
                    )
                conn.execute(
                    "SELECT setval(pg_get_serial_sequence('audit', 'seq'), max(seq)) FROM audit"
                )
        yield url


def raw(url: str, sql: str) -> list[tuple[Any, ...]]:
    """``sql``'s rows, read from the ledger's database directly (not through the store): what an
    upgrade test checks the migration left."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.close()
    with psycopg.connect(url) as pg:
        return pg.execute(sql).fetchall()


@pytest.fixture(params=ledgers.BACKENDS)
def v7(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    monkeypatch.setenv(audit.KEY_ENV, KEY)
    with _v7_ledger(request.param, tmp_path) as url:
        yield url


def _verify(url: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli_main.app, ["audit", "verify", "--db", url])
    return result.exit_code, result.output


def test_a_version_7_ledger_verifies_after_the_upgrade(v7: str) -> None:
    with ef.Runtime(v7) as rt:
        assert rt.store.schema_version() == sqlite_store.migrations()[-1][0]
        assert rt.store.verify_audit() == []
        assert {r.run_id for r in rt.runs()} == {"old-a", "old-b", "old-settled", "old-paused"}
        assert rt.run("old-a").output[0]["note"] == "Zoë ✓"
    code, out = _verify(v7)
    assert code == 0, out
    if v7.startswith("postgresql"):
        # jsonb's print ('{"id": "msg-a", ...}') became the canonical one the write path digests
        with psycopg.connect(v7) as pg:
            texts = [
                t
                for (t,) in pg.execute("SELECT output_json FROM runs WHERE output_json IS NOT NULL")
            ]
        assert texts
        assert all(t == digests.canonical_json(json.loads(t)) for t in texts), texts


def test_a_paused_version_7_run_goes_on_under_version_8_and_the_ledger_verifies(v7: str) -> None:
    with ef.Runtime(v7) as rt:
        [effect] = rt.effects(run_id="old-paused")
        settled = rt.resolve(
            effect.effect_id, committed=True, evidence={"id": "x-2"}, by="ops", decision_id="D-2"
        )
        assert settled.status is ef.StepStatus.CONFIRMED
        done = rt.resume("old-paused", by="ops")
        assert done.status is ef.RunStatus.SUCCEEDED, done
        rt.start(doubt, run_id="new-run")
        assert rt.store.verify_audit() == []
    code, out = _verify(v7)
    assert code == 0, out


def test_a_version_7_seal_removed_after_the_upgrade_is_still_caught(v7: str) -> None:
    """Version 7's seals have no place in a shard; what they seal is still checked by the run's
    own seal chain."""
    with ef.Runtime(v7) as rt:
        assert rt.store.verify_audit() == []
    if v7.startswith("sqlite"):
        conn = sqlite3.connect(v7.removeprefix("sqlite:///"))
        conn.execute("DROP TRIGGER seals_no_delete")
        conn.execute("DELETE FROM seals WHERE run_id = 'old-a' AND n = 2")
        conn.commit()
        conn.close()
    else:
        with psycopg.connect(v7, autocommit=True) as pg:
            pg.execute("DROP TRIGGER seals_no_delete ON seals")
            pg.execute("DELETE FROM seals WHERE run_id = 'old-a' AND n = 2")
    code, out = _verify(v7)
    assert code == 4, out
    assert "run old-a" in out
