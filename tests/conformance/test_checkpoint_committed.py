"""``checkpoint_committed`` on every backend: how a local transaction whose COMMIT got no answer is
settled. The checkpoint's attempt row commits with the tool's writes, so reading it says whether the
transaction committed, once no transaction that may still commit it is open (PostgreSQL: the run's
row lock, which the checkpoint's fence holds until its transaction ends).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import psycopg
import pytest
from test_store import TTL, claim, create_run, make_attempt

from effectflow import errors
from effectflow.ledger import postgres as postgres_backend
from effectflow.ledger.records import Outcome
from effectflow.ledger.store import Batch, LedgerStore

if TYPE_CHECKING:
    from conftest import Backend


def _checkpoint(store: LedgerStore, outcome: Outcome, number: int = 1) -> str:
    """Commit a local transaction whose checkpoint records attempt ``number`` with ``outcome``."""
    run = claim(store)
    attempt = make_attempt(number=number, outcome=outcome, ended_at=time.time())

    def finish(value: str) -> Batch:
        batch = Batch(run.run_id, run.lease_token)
        batch.attempt(attempt)
        return batch

    store.apply_with(lambda tx: "written", finish, lease_ttl=TTL, now=time.time())
    return attempt.attempt_id


def test_a_committed_checkpoint_reads_as_committed(store: LedgerStore) -> None:
    """The attempt row a committed checkpoint wrote as ``committed`` settles it as committed."""
    create_run(store)
    attempt_id = _checkpoint(store, Outcome.COMMITTED)

    assert store.checkpoint_committed("r1", attempt_id) is True


def test_an_absent_or_other_checkpoint_reads_as_not_committed(store: LedgerStore) -> None:
    """No row for the attempt (or one of another run, or not committed): not committed."""
    create_run(store)
    create_run(store, "r2")
    not_committed = _checkpoint(store, Outcome.NOT_COMMITTED)
    committed = _checkpoint(store, Outcome.COMMITTED, number=2)

    assert store.checkpoint_committed("r1", "att_never_written") is False
    assert store.checkpoint_committed("r1", not_committed) is False
    assert store.checkpoint_committed("r2", committed) is False


def test_a_local_transaction_that_raises_writes_no_checkpoint(store: LedgerStore) -> None:
    """``work`` raising rolls the checkpoint back: the driver's error as it was, nothing to read."""
    create_run(store)
    run = claim(store)
    attempt = make_attempt(outcome=Outcome.COMMITTED)

    def work(tx: object) -> str:
        raise RuntimeError("the seat map changed")

    def finish(value: str) -> Batch:
        batch = Batch(run.run_id, run.lease_token)
        batch.attempt(attempt)
        return batch

    with pytest.raises(RuntimeError, match="seat map"):
        store.apply_with(work, finish, lease_ttl=TTL, now=time.time())
    assert store.checkpoint_committed("r1", attempt.attempt_id) is False


def _open_checkpoint(backend: Backend, attempt_id: str) -> psycopg.Connection[tuple[object, ...]]:
    """A transaction that fenced the run and wrote a committed attempt row, left open (the state
    of a checkpoint whose COMMIT is still on its way)."""
    conn = psycopg.connect(backend.url)
    conn.execute("UPDATE runs SET lease_expires_at = lease_expires_at WHERE run_id = 'r1'")
    conn.execute(
        "INSERT INTO attempts (attempt_id, run_id, step_id, number, kind, generation, started_at, "
        "ended_at, outcome) VALUES (%s, 'r1', 'send', 1, 'call', 0, %s, %s, %s)",
        (attempt_id, time.time(), time.time(), Outcome.COMMITTED.value),
    )
    return conn


def test_postgres_waits_for_a_checkpoint_still_open_before_reading_it(
    pg_backend: Backend,
) -> None:
    """A checkpoint transaction still open (its COMMIT not yet arrived) is waited for, not read as
    absent: once it commits, the read says committed."""
    store = pg_backend.open()
    try:
        create_run(store)
        claim(store)
        conn = _open_checkpoint(pg_backend, "att_in_flight")
        answer: list[bool] = []
        reader = threading.Thread(
            target=lambda: answer.append(store.checkpoint_committed("r1", "att_in_flight"))
        )
        reader.start()
        reader.join(timeout=0.5)
        assert reader.is_alive(), "the read did not wait for the open checkpoint"
        conn.commit()
        conn.close()
        reader.join(timeout=5)
        assert answer == [True]
    finally:
        store.close()


def test_postgres_leaves_it_in_doubt_when_the_checkpoint_stays_open(
    pg_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction holding the run past the lock timeout: ``CommitInDoubt``, never "absent"."""
    monkeypatch.setattr(postgres_backend, "_SETTLE_LOCK_TIMEOUT", 0.2)
    store = pg_backend.open()
    try:
        create_run(store)
        claim(store)
        conn = _open_checkpoint(pg_backend, "att_stuck")
        try:
            with pytest.raises(errors.CommitInDoubt, match="may still commit"):
                store.checkpoint_committed("r1", "att_stuck")
        finally:
            conn.rollback()
            conn.close()
        assert store.checkpoint_committed("r1", "att_stuck") is False
    finally:
        store.close()
