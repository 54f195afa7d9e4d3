"""Ledger files handled with care: a file that is not SQLite, another application's SQLite
database, a ledger from a newer effectflow, and a read-only ledger — through the real CLI, with
the files checked byte for byte afterwards."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

import effectflow as ef
import ledgers
from effectflow.ledger import sqlite as sqlite_store

EFFECTFLOW = str(Path(sys.executable).with_name("effectflow"))
READ_VERBS = [["runs"], ["show", "r1"], ["effects"], ["attention"], ["audit", "verify"]]


@ef.tool("lf_send", effect="external_write", idempotency=ef.Idempotency(supported=True))
def send(to: str, *, idempotency_key: str) -> dict[str, str]:
    return {"id": f"msg-{to}"}


@ef.workflow("lf_case")
def case(ctx: ef.Context, to: str) -> dict[str, str]:
    return ctx.call("send", send, to=to)


def _digest(folder: Path) -> dict[str, str]:
    """Every file of the folder by its bytes — but SQLite's own ``-shm`` index and an empty
    ``-wal``, which any reader of a WAL-mode database opens next to it (they hold no data)."""
    found = {}
    for p in sorted(folder.iterdir()):
        if p.name.endswith("-shm") or (p.name.endswith("-wal") and p.stat().st_size == 0):
            continue
        found[p.name] = hashlib.sha256(p.read_bytes()).hexdigest()
    return found


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EFFECTFLOW, *args], capture_output=True, text=True, check=False)


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    """A real ledger with one run, closed (its WAL checkpointed into the file)."""
    path = tmp_path / "ledger.db"
    with ef.Runtime(f"sqlite:///{path}") as rt:
        rt.start(case, run_id="r1", to="a")
    return path


def _foreign(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO users (name) VALUES ('ana')")
    conn.commit()
    conn.close()


@pytest.mark.parametrize("verb", [["runs"], ["recover"], ["audit", "verify"]])
@pytest.mark.parametrize("kind", ["not_sqlite", "foreign_sqlite", "newer_schema"])
def test_a_file_effectflow_must_not_open_is_refused_in_one_line_and_left_untouched(
    tmp_path: Path, ledger: Path, kind: str, verb: list[str]
) -> None:
    target = ledger
    if kind == "not_sqlite":
        target = tmp_path / "notes.db"
        target.write_text("these are my notes, not a database\n" * 50)
        says = "is not an SQLite database"
    elif kind == "foreign_sqlite":
        target = tmp_path / "app.db"
        _foreign(target)
        says = "another application"
    else:
        conn = sqlite3.connect(ledger)
        conn.execute("INSERT INTO schema_migrations VALUES (99, '0099_from_the_future', 0)")
        conn.commit()
        conn.close()
        known = sqlite_store.migrations()[-1][0]
        says = f"schema version 99; this effectflow ({ef.__version__}) knows versions up to {known}"
    before = _digest(tmp_path)
    header = target.read_bytes()[18:20]
    answer = _cli(*verb, "--db", f"sqlite:///{target}")
    assert answer.returncode == 2, answer.stderr
    assert says in answer.stderr
    assert "was not touched" in answer.stderr
    assert len(answer.stderr.strip().splitlines()) == 1, answer.stderr  # no traceback
    assert _digest(tmp_path) == before
    assert target.read_bytes()[18:20] == header  # not switched to WAL either


@pytest.mark.parametrize("verb", READ_VERBS, ids=lambda v: "-".join(v))
def test_read_only_verbs_read_a_read_only_ledger_and_change_nothing(
    tmp_path: Path, ledger: Path, verb: list[str]
) -> None:
    before = _digest(tmp_path)
    os.chmod(ledger, 0o444)
    os.chmod(tmp_path, 0o555)  # as an operator would find it (root ignores modes: bytes decide)
    try:
        answer = _cli(*verb, "--db", f"sqlite:///{ledger}")
    finally:
        os.chmod(tmp_path, 0o755)
        os.chmod(ledger, 0o644)
    assert answer.returncode == 0, answer.stderr
    assert _digest(tmp_path) == before


def test_a_read_only_open_of_a_ledger_that_needs_an_upgrade_says_so(
    tmp_path: Path, ledger: Path
) -> None:
    conn = sqlite3.connect(ledger)
    conn.execute(
        "DELETE FROM schema_migrations WHERE version = (SELECT max(version) FROM schema_migrations)"
    )
    conn.commit()
    conn.close()
    before = _digest(tmp_path)
    answer = _cli("runs", "--db", f"sqlite:///{ledger}")
    assert answer.returncode == 2
    assert "must be upgraded first" in answer.stderr
    assert _digest(tmp_path) == before


def test_postgres_refuses_a_newer_schema(tmp_path: Path) -> None:
    with ledgers.fresh("postgres", tmp_path, prefix="ef_lf") as url:
        ef.Runtime(url).close()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("INSERT INTO schema_migrations VALUES (99, '0099_future', 0)")
            tables = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname='public'")
            count = tables.fetchone()
        with pytest.raises(ef.LedgerFileError, match="schema version 99"):
            ef.Runtime(url)
        with psycopg.connect(url, autocommit=True) as conn:
            again = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname='public'")
            assert again.fetchone() == count
