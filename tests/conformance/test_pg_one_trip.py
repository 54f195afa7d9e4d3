"""Issue 18 on PostgreSQL: a write step's batch in one round trip, and what it still refuses.

A batch is composed on the run's head (and its shard's) that the store's last write left, and sent
whole as one statement: ``pg_temp.effectflow_apply``, which each pooled connection creates
(``ledger/queries/postgres_apply.sql``). These tests count the round trips on the wire (libpq's
trace of the store's one connection: every ``Sync`` or simple ``Query`` is a wait for the server)
and hold the guarantees on a real server with a real second writer: a stale lease token, a head or
shard moved under the batch, a taken binding, a failed expectation each write nothing.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from psycopg import pq
from test_store import T0, TTL, claim, create_run, intent_batch, make_attempt, snapshot

from conftest import Backend
from effectflow import errors
from effectflow.ledger import audit, postgres
from effectflow.ledger.records import Outcome, RunStatus, StepStatus
from effectflow.ledger.store import Batch


@pytest.fixture
def pg(pg_backend: Backend) -> Iterator[postgres.PostgresStore]:
    """A PostgreSQL store with one pooled connection (so one trace sees all it sends)."""
    store = postgres.PostgresStore(f"{pg_backend.url}&pool_max=1")
    yield store
    store.close()


@pytest.fixture
def other(pg_backend: Backend) -> Iterator[postgres.PostgresStore]:
    """A second store on the same ledger: another worker's connections."""
    store = postgres.PostgresStore(pg_backend.url)
    yield store
    store.close()


@contextmanager
def wire(store: postgres.PostgresStore) -> Iterator[list[str]]:
    """The frontend messages that wait for the server (``Sync``, ``Query``) sent in the block."""
    fd, name = tempfile.mkstemp(prefix="pgtrace-")
    sent: list[str] = []
    with store._pool.connection() as conn:
        conn.pgconn.trace(fd)
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
    try:
        yield sent
    finally:
        with store._pool.connection() as conn:
            conn.pgconn.untrace()
        lines = Path(name).read_text("utf-8", errors="replace").splitlines()
        os.unlink(name)
        sent.extend(line for line in lines if line.startswith("F\t") and _waits(line))


def _waits(line: str) -> bool:
    kind = line.split("\t")[2].split()[0]
    return kind in ("Sync", "Query")


def outcome_batch(run_token: int, step_id: str = "send") -> Batch:
    """What the write path commits after a call: the step, its attempt, an audit event."""
    from test_store import make_step

    batch = Batch("r1", lease_token=run_token)
    batch.step(make_step("r1", step_id, status=StepStatus.CONFIRMED, output={"id": "m1"}))
    batch.attempt(
        dataclasses.replace(make_attempt("r1", step_id), outcome=Outcome.COMMITTED, ended_at=T0 + 2)
    )
    batch.event("succeeded", T0 + 2, step_id=step_id)
    return batch


def started(store: postgres.PostgresStore) -> int:
    """r1 created and claimed, its first step written: the store knows its head and shard."""
    create_run(store)
    run = claim(store)
    store.apply(intent_batch(run, "warm"), lease_ttl=TTL, now=T0 + 1)
    return run.lease_token


def test_a_write_step_s_intent_and_outcome_are_one_round_trip_each(
    pg: postgres.PostgresStore,
) -> None:
    """Once the store has written the run, each of a write step's two batches is one statement:
    one ``Sync`` on the wire, and the ledger verifies after."""
    token = started(pg)
    before = dict(pg.trips)
    run = pg.get_run("r1")
    assert run is not None
    with wire(pg) as intent:
        pg.apply(intent_batch(run), lease_ttl=TTL, now=T0 + 3)
    with wire(pg) as outcome:
        pg.apply(outcome_batch(token), lease_ttl=TTL, now=T0 + 4)
    assert len(intent) == 1, intent
    assert len(outcome) == 1, outcome
    assert pg.trips["one_trip"] == before["one_trip"] + 2
    assert pg.trips["by_statement"] == before["by_statement"]
    steps = {s.step_id: s.status for s in pg.steps("r1")}
    assert steps == {"warm": StepStatus.INTENT_RECORDED, "send": StepStatus.CONFIRMED}
    assert pg.verify_audit() == []


def test_a_stale_lease_token_writes_nothing(
    pg: postgres.PostgresStore, other: postgres.PostgresStore
) -> None:
    """Another worker takes the lease on its own connection; the zombie's batch, composed on the
    head it knows, is refused (LeaseLost) and writes nothing, through the function and after it."""
    token = started(pg)
    taken = other.claim("r1", owner="w2", expected_token=token, ttl=TTL, now=T0 + 2)
    assert taken is not None
    before = snapshot(pg, "r1")
    zombie = intent_batch(dataclasses.replace(taken, lease_token=token))
    zombie.run_changes["status"] = RunStatus.FAILED
    # The function itself, called as the store calls it: refused before it writes.
    head = pg._heads["r1"]
    composed = pg._compose(zombie, head, now=T0 + 3)
    shard = audit.shard_of("r1")
    params, _ = pg._one_trip_params(
        zombie, head, composed, shard, pg._shard_heads[shard], lease_ttl=TTL, now=T0 + 3
    )
    with pg._pool.connection() as conn:
        answer = postgres.call_apply(conn, params)
    assert answer == {"refused": "lease_lost"}
    assert snapshot(pg, "r1") == before
    with pytest.raises(errors.LeaseLost):
        pg.apply(zombie, lease_ttl=TTL, now=T0 + 3)
    assert snapshot(pg, "r1") == before
    assert pg.get_operation("acme", "op_r1_send") is None
    assert pg.verify_audit() == []


def test_a_head_moved_by_another_writer_is_composed_again(
    pg: postgres.PostgresStore, other: postgres.PostgresStore
) -> None:
    """A person's unfenced batch moves the run's head on another connection: the worker's next
    batch, composed on the old head, finds the new one (nothing written), is composed on it and
    commits; both chains verify."""
    token = started(pg)
    person = Batch("r1", lease_token=None)
    person.run_changes["control"] = {"kind": "cancel", "by": "alice"}
    person.event("cancel_requested", T0 + 2, actor="alice")
    other.apply(person, lease_ttl=TTL, now=T0 + 2)
    moved = pg.trips["moved"]
    control = pg.apply(outcome_batch(token, "warm"), lease_ttl=TTL, now=T0 + 3)
    assert control == {"kind": "cancel", "by": "alice"}  # the head it was composed on at last
    assert pg.trips["moved"] == moved + 1
    kinds = [e.kind for e in pg.audit("r1")]
    assert kinds[-2:] == ["cancel_requested", "succeeded"]
    assert pg.verify_audit() == []


def test_a_shard_moved_by_another_run_is_chained_again(
    pg: postgres.PostgresStore, other: postgres.PostgresStore
) -> None:
    """Another worker seals a run of the same shard: the batch finds the shard's new head, is
    chained after it, and the shard's chain verifies."""
    token = started(pg)
    shard = audit.shard_of("r1")
    neighbour = next(f"n{i}" for i in range(10_000) if audit.shard_of(f"n{i}") == shard)
    create_run(other, neighbour)
    moved = pg.trips["moved"]
    pg.apply(outcome_batch(token, "warm"), lease_ttl=TTL, now=T0 + 3)
    assert pg.trips["moved"] == moved + 1
    assert pg.verify_audit() == []


def test_a_binding_taken_meanwhile_rolls_the_whole_batch_back(
    pg: postgres.PostgresStore, other: postgres.PostgresStore
) -> None:
    """The function has begun to write when it finds the operation bound by another run: it
    raises, the transaction writes nothing, and the store says why (IdempotencyConflict)."""
    token = started(pg)
    create_run(other, "r2")
    r2 = claim(other, "r2", owner="w2")
    other.apply(intent_batch(r2, "send", logical_operation_id="op_shared"), lease_ttl=TTL, now=T0)
    run = pg.get_run("r1")
    assert run is not None
    assert run.lease_token == token
    before = snapshot(pg, "r1")
    with pytest.raises(errors.IdempotencyConflict):
        pg.apply(
            intent_batch(run, "send", logical_operation_id="op_shared"), lease_ttl=TTL, now=T0 + 3
        )
    assert snapshot(pg, "r1") == before
    assert pg.verify_audit() == []


def test_a_failed_expectation_writes_nothing(pg: postgres.PostgresStore) -> None:
    """A batch with an expectation is applied statement by statement (its check reads the row
    under the run's lock); refused, it writes nothing, and the next batch is one trip again."""
    token = started(pg)
    before = snapshot(pg, "r1")
    run = pg.get_run("r1")
    assert run is not None
    batch = intent_batch(run)
    batch.expect_run(status=RunStatus.PAUSED)
    with pytest.raises(errors.StaleState):
        pg.apply(batch, lease_ttl=TTL, now=T0 + 3)
    assert snapshot(pg, "r1") == before
    one_trip = pg.trips["one_trip"]
    pg.apply(outcome_batch(token, "warm"), lease_ttl=TTL, now=T0 + 4)
    assert pg.trips["one_trip"] >= one_trip
    assert pg.verify_audit() == []


def test_a_session_that_lost_the_function_applies_batches_by_statement(
    pg: postgres.PostgresStore,
) -> None:
    """A pooled session without the function (a pooler in front of the server handed the store
    another one) costs the batch nothing but the try: it is applied statement by statement, and
    so is every later batch of the store."""
    token = started(pg)
    with pg._pool.connection() as conn:
        conn.execute("DROP FUNCTION pg_temp.effectflow_apply")
    pg.apply(outcome_batch(token, "warm"), lease_ttl=TTL, now=T0 + 3)
    assert pg.one_trip is False
    by_statement = pg.trips["by_statement"]
    pg.apply(outcome_batch(token, "warm"), lease_ttl=TTL, now=T0 + 4)
    assert pg.trips["by_statement"] == by_statement + 1
    assert {s.step_id: s.status for s in pg.steps("r1")}["warm"] is StepStatus.CONFIRMED
    assert pg.verify_audit() == []


def test_a_forgotten_head_costs_a_round_trip_not_a_write(
    pg: postgres.PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store remembers a bounded number of heads: a run whose head it let go is asked for
    it (nothing written), then written, and the chains verify."""
    monkeypatch.setattr(postgres, "_HEADS_KEPT", 2)
    token = started(pg)
    shard = audit.shard_of("r1")
    same = [f"n{i}" for i in range(10_000) if audit.shard_of(f"n{i}") == shard][:2]
    for run_id in same:  # in r1's shard, whose head the store knows: each one trip
        create_run(pg, run_id)
    assert set(pg._heads) == set(same)
    assert "r1" not in pg._heads
    moved = pg.trips["moved"]
    pg.apply(outcome_batch(token, "warm"), lease_ttl=TTL, now=T0 + 3)
    assert pg.trips["moved"] == moved + 1
    assert {s.step_id: s.status for s in pg.steps("r1")}["warm"] is StepStatus.CONFIRMED
    assert pg.verify_audit() == []


def test_a_session_whose_prepared_statements_went_prepares_the_function_s_again(
    pg: postgres.PostgresStore,
) -> None:
    """psycopg deallocates a session's prepared statements after a ROLLBACK once it prepared its
    own there: the next batch finds the function's statement missing, prepares it again, and is
    still one trip that writes once."""
    token = started(pg)
    with pg._pool.connection() as conn:
        conn.execute("DEALLOCATE ALL")
    one_trip = pg.trips["one_trip"]
    pg.apply(outcome_batch(token, "warm"), lease_ttl=TTL, now=T0 + 3)
    assert pg.trips["one_trip"] == one_trip + 1
    assert pg.one_trip is True
    assert {s.step_id: s.status for s in pg.steps("r1")}["warm"] is StepStatus.CONFIRMED
    assert [e.kind for e in pg.audit("r1")].count("succeeded") == 1
    assert pg.verify_audit() == []
