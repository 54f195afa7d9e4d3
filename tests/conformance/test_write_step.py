"""The write step's own commit, as issue 18 made it cheaper: the lease a fenced batch extends (or,
told not to, leaves where it is), the run row it writes once on SQLite, and the audit event hashed
from the detail it stores."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from test_store import T0, TTL, claim, create_run, intent_batch, snapshot

from effectflow import digests, errors
from effectflow.ledger import audit
from effectflow.ledger import sqlite as sqlite_backend
from effectflow.ledger.store import Batch, LedgerStore


def test_a_fenced_batch_extends_the_lease_and_its_own_lease_change_is_kept(
    store: LedgerStore,
) -> None:
    """A batch under a current token moves the lease's expiry to its own time plus the TTL; a
    batch that changes the lease itself (a run ending gives it up) keeps its change."""
    create_run(store)
    run = claim(store)
    assert run.lease_expires_at == T0 + TTL
    store.apply(intent_batch(run), lease_ttl=TTL, now=T0 + 7)
    extended = store.get_run("r1")
    assert extended is not None
    assert (extended.lease_owner, extended.lease_expires_at) == ("w1", T0 + 7 + TTL)
    assert extended.updated_at == T0 + 7

    done = Batch("r1", lease_token=run.lease_token)
    done.run_changes.update(lease_owner=None, lease_expires_at=None)
    store.apply(done, lease_ttl=TTL, now=T0 + 8)
    ended = store.get_run("r1")
    assert ended is not None
    assert (ended.lease_owner, ended.lease_expires_at) == (None, None)
    assert store.verify_audit() == []


def test_a_batch_fenced_out_after_its_lease_moved_changes_no_expiry(store: LedgerStore) -> None:
    """The lease a zombie's batch would have extended stays the new owner's, to the second."""
    create_run(store)
    zombie = claim(store)
    taken = store.claim("r1", owner="w2", expected_token=zombie.lease_token, ttl=TTL, now=T0 + 1)
    assert taken is not None
    before = snapshot(store, "r1")
    with pytest.raises(errors.LeaseLost):
        store.apply(intent_batch(zombie), lease_ttl=TTL, now=T0 + 30)
    assert snapshot(store, "r1") == before


@pytest.mark.parametrize("checked", [False, True], ids=["plain", "with_expectation"])
def test_a_batch_that_does_not_renew_leaves_the_lease_where_it_is(
    store: LedgerStore, checked: bool
) -> None:
    """``renews_lease=False`` (what the writer sends while two thirds of a lease are left): the
    batch's rows land, the run's expiry stays where the last renewal put it (PostgreSQL: on the
    one-trip path and, with an expectation, statement by statement through ``fence_run``), a
    stale token is still refused with nothing written, and the next renewing batch moves it."""
    create_run(store)
    run = claim(store)
    batch = intent_batch(run)
    batch.renews_lease = False
    if checked:
        batch.expect_run(lease_token=run.lease_token)
    store.apply(batch, lease_ttl=TTL, now=T0 + 7)
    kept = store.get_run("r1")
    assert kept is not None
    assert (kept.lease_owner, kept.lease_expires_at, kept.updated_at) == ("w1", T0 + TTL, T0 + 7)
    assert [s.step_id for s in store.steps("r1")] == ["send"]

    taken = store.claim("r1", owner="w2", expected_token=run.lease_token, ttl=TTL, now=T0 + 8)
    assert taken is not None
    before = snapshot(store, "r1")
    stale = Batch("r1", lease_token=run.lease_token, renews_lease=False)
    stale.event("late", T0 + 9)
    with pytest.raises(errors.LeaseLost):
        store.apply(stale, lease_ttl=TTL, now=T0 + 9)
    assert snapshot(store, "r1") == before

    renewing = Batch("r1", lease_token=taken.lease_token)
    renewing.event("on_time", T0 + 10)
    store.apply(renewing, lease_ttl=TTL, now=T0 + 10)
    moved = store.get_run("r1")
    assert moved is not None
    assert (moved.lease_owner, moved.lease_expires_at) == ("w2", T0 + 10 + TTL)
    assert store.verify_audit() == []


def test_sqlite_writes_a_fenced_batch_s_run_row_once(tmp_path: Path) -> None:
    """On SQLite the fence is a read under BEGIN IMMEDIATE's lock, and the lease's extension rides
    on the batch's one UPDATE of the run: one run-row write a transaction, not two."""
    store = sqlite_backend.SQLiteStore(f"sqlite:///{tmp_path}/l.db")
    try:
        create_run(store)
        run = claim(store)
        seen: list[str] = []
        conn: sqlite3.Connection = store._conn
        conn.set_trace_callback(seen.append)
        try:
            store.apply(intent_batch(run), lease_ttl=TTL, now=T0 + 3)
        finally:
            conn.set_trace_callback(None)
        updates = [s for s in seen if s.lstrip().upper().startswith("UPDATE RUNS")]
        assert len(updates) == 1, seen
        assert "lease_expires_at = " in updates[0]
        assert "RETURNING" not in updates[0]
        assert seen[0] == "BEGIN IMMEDIATE"
        assert seen[-1] == "COMMIT"

        # A batch that does not renew writes the run's row without its lease (so the lease's
        # index entry, runs_by_status_lease, is not rewritten).
        seen.clear()
        quiet = intent_batch(run, "second")
        quiet.renews_lease = False
        conn.set_trace_callback(seen.append)
        try:
            store.apply(quiet, lease_ttl=TTL, now=T0 + 4)
        finally:
            conn.set_trace_callback(None)
        updates = [s for s in seen if s.lstrip().upper().startswith("UPDATE RUNS")]
        assert len(updates) == 1, seen
        assert "lease_expires_at" not in updates[0]
    finally:
        store.close()


@pytest.mark.parametrize(
    ("detail", "at"),
    [
        ({"b": [1, "é\u2028\x00"], "a": None, "c": {"z": 1.5e-7, "y": True}}, 1_700_000_000.123456),
        ({}, 5),
        ({"n": -0.0}, 0.1),
    ],
)
@pytest.mark.parametrize("key", [None, b"k" * 32])
def test_an_event_hashed_from_its_stored_detail_is_the_hash_of_its_canonical_list(
    detail: dict[str, object], at: float, key: bytes | None
) -> None:
    """The write path prints an event's detail once, for its row and its hash: the hash is still
    the one `audit verify` computes from the whole event (the canonical list, printed at once)."""
    whole = digests.canonical_json(['r"1', None, "e", "k", "ü", detail, at])
    expected = audit._hash(key, f"prev\n{whole}")
    text = audit.event_hash_of_text(
        "prev",
        run_id='r"1',
        step_id=None,
        effect_id="e",
        kind="k",
        actor="ü",
        detail_json=digests.canonical_json(detail),
        at=at,
        key=key,
    )
    assert text == expected
    assert expected == audit.event_hash(
        "prev",
        run_id='r"1',
        step_id=None,
        effect_id="e",
        kind="k",
        actor="ü",
        detail=detail,
        at=at,
        key=key,
    )
