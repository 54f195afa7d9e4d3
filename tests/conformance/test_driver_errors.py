"""A store never lets its driver's exceptions out: they leave as the ledger's own family,
``LedgerUnavailable`` when the database was away or could not write (worth retrying) and
``LedgerError`` when it refused a statement, each with the driver's exception as its cause. A local
transaction's own statements are the tool's: their errors stay the tool's.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
import pytest
from test_store import T0, TTL, create_run

from effectflow import errors
from effectflow.ledger.store import Batch, LedgerStore, open_store

if TYPE_CHECKING:
    from conftest import Backend

#: Makes the database refuse every new run (what a schema edited by hand, or a bug, looks like).
REFUSE_RUNS = {
    "sqlite": [
        "CREATE TRIGGER refuse_runs BEFORE INSERT ON runs "
        "BEGIN SELECT RAISE(ABORT, 'refused by hand'); END"
    ],
    "postgres": [
        "CREATE FUNCTION refuse_runs() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'refused by hand'; END $$",
        "CREATE TRIGGER refuse_runs BEFORE INSERT ON runs "
        "FOR EACH ROW EXECUTE FUNCTION refuse_runs()",
    ],
}


def test_a_statement_the_database_refuses_is_a_ledger_error(
    backend: Backend, store: LedgerStore
) -> None:
    """A write the database refuses raises ``LedgerError`` (not the driver's exception, and not
    "unavailable": retrying would not help), with the driver's exception as its cause; nothing is
    written."""
    for statement in REFUSE_RUNS[backend.name]:
        backend.execute(statement, ())
    with pytest.raises(errors.LedgerError, match="refused by hand") as caught:
        create_run(store, "refused")
    assert type(caught.value) is errors.LedgerError
    assert isinstance(caught.value.__cause__, backend.db_error)
    assert store.get_run("refused") is None


def test_a_locked_sqlite_file_is_unavailable(tmp_path: Path) -> None:
    """Another process holding the file's write lock past the busy timeout: ``LedgerUnavailable``,
    caused by sqlite3's ``OperationalError``; the write lands once the lock is gone."""
    path = f"{tmp_path}/locked.db"
    store = open_store(f"sqlite:///{path}?busy_timeout=0.2")
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(errors.LedgerUnavailable, match="locked") as caught:
            create_run(store, "waits")
        assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
        with pytest.raises(errors.LedgerUnavailable):
            store.claim_runnable(owner="w", ttl=TTL, now=T0, limit=5)
        holder.execute("ROLLBACK")
        create_run(store, "waits")
        assert store.get_run("waits") is not None
    finally:
        holder.close()
        store.close()


def test_an_unreachable_postgresql_server_is_unavailable() -> None:
    """No server at the address: ``LedgerUnavailable`` at once, caused by psycopg's
    ``OperationalError``, its message naming the server without a password."""
    url = "postgresql://postgres:secret@127.0.0.1:9/postgres?connect_timeout=2"
    with pytest.raises(errors.LedgerUnavailable) as caught:
        open_store(url)
    assert isinstance(caught.value.__cause__, psycopg.OperationalError)
    assert "secret" not in str(caught.value)
    assert "127.0.0.1:9" in str(caught.value)


def test_a_local_transactions_own_error_stays_the_tools(
    backend: Backend, store: LedgerStore
) -> None:
    """What the tool's own statements raise inside ``apply_with`` reaches the caller as it was
    raised (the runtime records it as the tool's rollback), and nothing of the batch is written."""
    run = create_run(store, "local")
    claimed = store.claim("local", owner="w", expected_token=run.lease_token, ttl=TTL, now=T0)
    assert claimed is not None

    # The tool's own constraint, raised by the driver its statements run on.
    taken = sqlite3.IntegrityError if backend.name == "sqlite" else psycopg.IntegrityError

    def work(tx: object) -> None:
        raise taken("seat 3C is taken")

    def finish(value: None) -> Batch:
        raise AssertionError("a failed tool has no checkpoint")

    with pytest.raises(taken, match="seat 3C") as caught:
        store.apply_with(work, finish, lease_ttl=TTL, now=T0)
    assert type(caught.value) is taken
    assert store.steps("local") == []
