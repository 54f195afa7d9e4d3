"""What only the PostgreSQL backend promises: many workers at once. Concurrent claimers never share a
run, writers of one run serialize on its row, processes starting together migrate once, and a
waiting worker wakes on NOTIFY instead of polling."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
from test_store import T0, TTL, claim, create_run

from effectflow import errors, ledger
from effectflow.ledger import postgres
from effectflow.ledger.records import RunStatus
from effectflow.ledger.store import Batch, LedgerStore, open_store

if TYPE_CHECKING:
    from conftest import Backend


def run_threads(count: int, target: Callable[[int], None]) -> None:
    """Run ``target(i)`` in ``count`` threads started together; re-raise the first failure."""
    barrier = threading.Barrier(count)
    failures: list[BaseException] = []

    def body(i: int) -> None:
        try:
            barrier.wait(10)
            target(i)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    if failures:
        raise failures[0]


def test_concurrent_claimers_never_claim_the_same_run(pg_backend: Backend) -> None:
    """8 workers (each with its own store) claim 200 runs in small batches at once: every run is
    claimed exactly once, by the worker whose lease it now holds."""
    setup = pg_backend.open()
    try:
        for i in range(200):
            create_run(setup, f"run{i:03d}", created_at=T0 + i)
    finally:
        setup.close()

    stores = [pg_backend.open() for _ in range(8)]
    claimed: list[list[tuple[str, str | None, int]]] = [[] for _ in stores]

    def worker(i: int) -> None:
        while True:
            got = stores[i].claim_runnable(owner=f"w{i}", ttl=600, now=T0 + 1000, limit=3)
            if not got:
                return
            claimed[i].extend((c.run.run_id, c.run.lease_owner, c.run.lease_token) for c in got)

    try:
        run_threads(len(stores), worker)
        every = [c for per_worker in claimed for c in per_worker]
        ids = [run_id for run_id, _, _ in every]
        assert len(ids) == len(set(ids)), "a run was claimed twice"
        assert set(ids) == {f"run{i:03d}" for i in range(200)}
        for i, per_worker in enumerate(claimed):
            assert all(owner == f"w{i}" and token == 1 for _, owner, token in per_worker)
        assert sum(1 for per_worker in claimed if per_worker) > 1, "only one worker ever claimed"
        assert stores[0].claim_runnable(owner="late", ttl=600, now=T0 + 1000, limit=10) == []
    finally:
        for store in stores:
            store.close()


def test_concurrent_writers_of_one_run_keep_its_audit_chain(pg_backend: Backend) -> None:
    """Unfenced writers (people acting on a run) and its fenced worker commit at once: each batch
    extends the head the previous one left, so the chain verifies and counts every event."""
    stores = [pg_backend.open() for _ in range(4)]
    try:
        create_run(stores[0])
        held = claim(stores[0])

        def writer(i: int) -> None:
            for n in range(15):
                fenced = i == 0
                batch = Batch("r1", lease_token=held.lease_token if fenced else None)
                batch.event("note", T0 + n, actor=f"writer{i}", n=n)
                stores[i].apply(batch, lease_ttl=TTL, now=T0 + n)

        run_threads(len(stores), writer)
        events = stores[0].audit("r1")
        assert len(events) == 1 + 4 * 15
        assert stores[0].verify_audit() == []
    finally:
        for store in stores:
            store.close()


def test_processes_starting_at_once_apply_each_migration_once(pg_empty_url: str) -> None:
    """Several stores opened together on an empty database migrate it once, under one lock."""
    stores: list[LedgerStore | None] = [None] * 4

    def opener(i: int) -> None:
        stores[i] = open_store(pg_empty_url)

    try:
        run_threads(len(stores), opener)
        first = stores[0]
        assert first is not None
        versions = [version for version, _, _ in postgres.migrations()]
        assert first.schema_version() == versions[-1]  # type: ignore[attr-defined]
        assert first.migrate() == []  # type: ignore[attr-defined]
    finally:
        for store in stores:
            if store is not None:
                store.close()


def waker(store: LedgerStore, action: Callable[[], Any]) -> float:
    """Seconds a worker blocked in ``wait_for_work(10)`` takes to wake after ``action`` commits."""
    store.wait_for_work(0)  # opens the listening connection, so nothing sent after it is missed
    woke = threading.Event()
    waiter = threading.Thread(target=lambda: (store.wait_for_work(10), woke.set()))
    waiter.start()
    time.sleep(0.1)  # the waiter is blocked now
    started = time.monotonic()
    action()
    assert woke.wait(5), "the waiter was not woken"
    waiter.join()
    return time.monotonic() - started


def test_wait_for_work_wakes_on_a_new_run_and_on_a_released_lease(pg_backend: Backend) -> None:
    """A run created for workers (no lease), a lease released, and a lease revoked by a batch on a
    running run each wake a waiting worker at once; it does not sit out its 10 s timeout."""
    worker = pg_backend.open()
    other = pg_backend.open()
    try:
        assert waker(worker, lambda: create_run(other, "fresh")) < 1.0
        held = claim(other, "fresh")
        assert waker(worker, lambda: other.release("fresh", token=held.lease_token)) < 1.0

        held = claim(other, "fresh")
        revoke = Batch("fresh", lease_token=None)  # a person's action revokes the lease
        revoke.run_changes.update(
            lease_token=held.lease_token + 1, lease_owner=None, lease_expires_at=None
        )
        assert waker(worker, lambda: other.apply(revoke, lease_ttl=TTL, now=T0)) < 1.0
    finally:
        worker.close()
        other.close()


def test_wait_for_work_sleeps_through_runs_no_worker_can_take(pg_backend: Backend) -> None:
    """A paused run, a run created already leased, and a finished one wake nobody."""
    worker = pg_backend.open()
    other = pg_backend.open()
    try:
        worker.wait_for_work(0)
        create_run(other, "paused", status=RunStatus.PAUSED)
        create_run(other, "leased", lease_owner="w1", lease_token=1, lease_expires_at=T0 + TTL)
        done = Batch("leased", lease_token=1)
        done.run_changes.update(status=RunStatus.SUCCEEDED, lease_owner=None)
        other.apply(done, lease_ttl=TTL, now=T0)
        started = time.monotonic()
        worker.wait_for_work(0.3)
        assert time.monotonic() - started >= 0.29
    finally:
        worker.close()
        other.close()


def test_pool_size_comes_from_the_url(pg_backend: Backend) -> None:
    """``?pool_max=`` bounds the pool and ``?pool_timeout=`` the wait for a connection; other
    query options pass to libpq; a bad size or timeout is refused."""
    # libpq refuses query options it does not know: connecting proves pool_max was taken out.
    sep = "&" if "?" in pg_backend.url else "?"
    store = open_store(f"{pg_backend.url}{sep}pool_max=2&connect_timeout=5")
    try:
        assert isinstance(store, postgres.PostgresStore)
        assert store.pool_max == 2
    finally:
        store.close()
    with pytest.raises(errors.ContractError, match="pool_max"):
        open_store(f"{pg_backend.url}{sep}pool_max=none")
    timed = open_store(f"{pg_backend.url}{sep}pool_timeout=2.5")
    try:
        assert isinstance(timed, postgres.PostgresStore)
        assert timed.pool_timeout == 2.5
    finally:
        timed.close()
    for bad in ("0", "soon"):
        with pytest.raises(errors.ContractError, match="pool_timeout"):
            open_store(f"{pg_backend.url}{sep}pool_timeout={bad}")
    alias = open_store(pg_backend.url.replace("postgresql://", "postgres://", 1))
    alias.close()


def test_a_missing_driver_names_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without psycopg, a postgresql:// URL is refused with the packages to install."""
    monkeypatch.setitem(sys.modules, "effectflow.ledger.postgres", None)
    monkeypatch.delattr(ledger, "postgres")
    with pytest.raises(errors.ContractError, match=r"psycopg\[binary\].*psycopg-pool"):
        open_store("postgresql://nobody@127.0.0.1:1/none")
