"""The ``durability`` ledger option on both backends: which commits wait for the disk.

``durability=full`` (the default) flushes every commit but a run's start in ``rt.start``, which rides
the run's next flushed commit (``Batch.rides``). ``durability=intents`` flushes intents, run ends
and people's actions, and lets a call's outcome commit without a flush of its own:
SQLite commits it at ``synchronous=NORMAL``, PostgreSQL with ``synchronous_commit=off``. On both, the
log is one sequence, so the next flushed commit makes the deferred one durable too. A power cut in
between leaves the step with its intent and no outcome: the state a crash between call and record
leaves, which the crash tests settle through the lookup (tests/crash).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from effectflow import bench, errors
from effectflow.ledger import postgres as postgres_backend
from effectflow.ledger import sqlite as sqlite_backend
from effectflow.ledger.records import StepStatus
from effectflow.ledger.store import Batch, LedgerStore, open_store

if TYPE_CHECKING:
    from conftest import Backend


def _with_option(url: str, option: str) -> str:
    return f"{url}&{option}" if "?" in url else f"{url}?{option}"


@contextlib.contextmanager
def _workloads(url: str, tmp_path: Path) -> Iterator[bench.Workloads]:
    """The benchmark's workloads (ten external writes a run: intent, call, outcome) on ``url``."""
    provider = bench.Provider(tmp_path / "provider.txt")
    workloads = bench.Workloads(url, provider)
    try:
        yield workloads
    finally:
        workloads.close()
        provider.close()


def test_only_call_outcomes_are_deferrable(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine marks exactly the outcome commits: never an intent, a run's start or its end."""
    seen: list[tuple[bool, list[str]]] = []
    with _workloads(_with_option(backend.url, "durability=intents"), tmp_path) as workloads:
        store = workloads.rt.store
        apply = store.apply

        def recording(batch: Batch, **kw: Any) -> dict[str, Any] | None:
            seen.append((batch.deferrable, [event.kind for event in batch.audit]))
            return apply(batch, **kw)

        monkeypatch.setattr(store, "apply", recording)
        workloads.run("write", 2, "marks")
    deferred = [kinds for deferrable, kinds in seen if deferrable]
    flushed = [kinds for deferrable, kinds in seen if not deferrable]
    assert len(deferred) == 20
    assert all(kinds == ["outcome"] for kinds in deferred)
    assert sum(kinds.count("intent") for kinds in flushed) == 20
    assert not any("outcome" in kinds for kinds in flushed)
    assert any("run_started" in kinds for kinds in flushed)
    assert any("run_succeeded" in kinds for kinds in flushed)


def test_intents_mode_records_the_same_facts(backend: Backend, tmp_path: Path) -> None:
    """Deferring the flush changes no record: every step confirmed, the audit chain intact."""
    with _workloads(_with_option(backend.url, "durability=intents"), tmp_path) as workloads:
        workloads.run("write", 3, "dur")
        store: LedgerStore = workloads.rt.store
        assert store.durability == "intents"
        for r in range(3):
            steps = store.steps(f"dur-{r}")
            assert [s.status for s in steps] == [StepStatus.CONFIRMED] * 10
        assert store.verify_audit() == []


@pytest.mark.parametrize("value", ["fast", "none", "NORMAL"])
def test_an_unknown_durability_is_refused_before_anything_is_written(
    backend: Backend, value: str, tmp_path: Path
) -> None:
    url = backend.url
    if backend.name == "sqlite":
        url = f"sqlite:///{tmp_path / 'never.db'}"
    with pytest.raises(errors.ContractError) as caught:
        open_store(_with_option(url, f"durability={value}"))
    message = str(caught.value)
    for needed in (f"durability={value!r}", "full", "intents"):
        assert needed in message
    assert not (tmp_path / "never.db").exists()


def test_default_is_full(backend: Backend) -> None:
    store = backend.open()
    try:
        assert store.durability == "full"
    finally:
        store.close()


# -- SQLite: the synchronous mode of each transaction --------------------------------------------


def _traced_sqlite(url: str, tmp_path: Path, workload: str = "write", runs: int = 1) -> list[str]:
    """The statements one run of ten external writes (or ``runs`` of ``workload``'s) sends to
    SQLite, with ``CALL`` where the provider is called."""
    statements: list[str] = []

    class Recorded(bench.Provider):
        def append(self, key: str, payload: str) -> None:
            statements.append("CALL")
            super().append(key, payload)

    provider = Recorded(tmp_path / "provider.txt")
    workloads = bench.Workloads(url, provider)
    try:
        store = workloads.rt.store
        assert isinstance(store, sqlite_backend.SQLiteStore)
        store._conn.set_trace_callback(statements.append)
        workloads.run(workload, runs, "trace")
        store._conn.set_trace_callback(None)
    finally:
        workloads.close()
        provider.close()
    return statements


def _sync_of_each_commit(statements: list[str]) -> list[str]:
    """For each COMMIT, the synchronous mode last set before it."""
    mode, modes = "FULL", []
    for sql in statements:
        if sql.upper().startswith("PRAGMA SYNCHRONOUS="):
            mode = sql.split("=", 1)[1].strip().upper()
        elif sql.strip().upper() == "COMMIT":
            modes.append(mode)
    return modes


def test_sqlite_intents_commit_outcomes_at_normal_and_intents_at_full(tmp_path: Path) -> None:
    statements = _traced_sqlite(f"sqlite:///{tmp_path / 'intents.db'}?durability=intents", tmp_path)
    modes = _sync_of_each_commit(statements)
    # One run of ten writes: the start rides the first intent's flush (NORMAL), then intent (FULL)
    # and outcome (NORMAL) ten times, then the end.
    assert modes == ["NORMAL"] + ["FULL", "NORMAL"] * 10 + ["FULL"]


def test_sqlite_default_flushes_every_commit_but_the_start_that_rides_the_next(
    tmp_path: Path,
) -> None:
    """``rt.start``'s first commit is not flushed on its own (``Batch.rides``): the run's next
    commit, an intent flushed before its call, syncs the WAL and the start with it. Every other
    commit is flushed."""
    statements = _traced_sqlite(f"sqlite:///{tmp_path / 'full.db'}", tmp_path)
    assert _sync_of_each_commit(statements) == ["NORMAL"] + ["FULL"] * 21
    commits = [sql for sql in statements if sql.strip().upper() == "COMMIT" or sql == "CALL"]
    assert commits[:3] == ["COMMIT", "COMMIT", "CALL"]  # start, flushed intent, then the call
    first_call = statements.index("CALL")
    assert "PRAGMA synchronous=FULL" in statements[:first_call]


def test_sqlite_a_pure_run_is_flushed_once(tmp_path: Path) -> None:
    """A run of pure steps commits its start and its end; only the end waits for the disk."""
    statements = _traced_sqlite(f"sqlite:///{tmp_path / 'pure.db'}", tmp_path, "sequential")
    assert _sync_of_each_commit(statements) == ["NORMAL", "FULL"]


def _transactions(statements: list[str]) -> list[tuple[str, list[str]]]:
    """Each transaction's synchronous mode at its COMMIT and its statements (a ``CALL`` between
    transactions is its own entry, mode ``CALL``)."""
    mode, found, current = "FULL", [], []
    for sql in statements:
        text = sql.strip()
        if text.upper().startswith("PRAGMA SYNCHRONOUS="):
            mode = text.split("=", 1)[1].strip().upper()
        elif text.upper() == "COMMIT":
            found.append((mode, current))
            current = []
        elif text == "CALL":
            found.append(("CALL", []))
        elif not text.upper().startswith("BEGIN"):
            current.append(text)
    return found


def test_sqlite_start_async_rides_too_alone_and_grouped(tmp_path: Path) -> None:
    """``start_async``'s first commit rides like ``rt.start``'s, alone or grouped with other
    runs' starts (8 at a time on one loop); no call is made before a FULL commit after it, and
    every transaction that records an intent is flushed."""
    statements = _traced_sqlite(f"sqlite:///{tmp_path / 'async.db'}", tmp_path, "write_async")
    txns = _transactions(statements)
    starts = [mode for mode, sqls in txns if any("INSERT INTO runs" in q for q in sqls)]
    assert starts == ["NORMAL"]
    committed = [mode for mode, _ in txns if mode != "CALL"]
    assert committed == ["NORMAL"] + ["FULL"] * 21

    statements = _traced_sqlite(f"sqlite:///{tmp_path / 'grouped.db'}", tmp_path, "write_async", 8)
    txns = _transactions(statements)
    with_starts = [
        (mode, sqls) for mode, sqls in txns if any("INSERT INTO runs" in q for q in sqls)
    ]
    assert sum(q.count("INSERT INTO runs") for _, sqls in with_starts for q in sqls) == 8
    assert any(len([q for q in sqls if "INSERT INTO runs" in q]) > 1 for _, sqls in with_starts)
    assert [mode for mode, _ in with_starts] == ["NORMAL"] * len(with_starts)
    for mode, sqls in txns:
        starts_only = any("INSERT INTO runs" in q for q in sqls) and not any(
            "INSERT INTO effects" in q for q in sqls
        )
        if mode != "CALL" and not starts_only:
            assert mode == "FULL", sqls[:3]
    # Before the first call, the WAL was flushed after every start.
    first_call = next(i for i, (mode, _) in enumerate(txns) if mode == "CALL")
    last_start = max(i for i, (mode, sqls) in enumerate(txns[:first_call]) if mode == "NORMAL")
    assert any(mode == "FULL" for mode, _ in txns[last_start + 1 : first_call])


def test_sqlite_a_run_created_for_workers_is_flushed(tmp_path: Path) -> None:
    """A run submitted for the workers is answered at once: its commit is flushed."""
    statements: list[str] = []
    with _workloads(f"sqlite:///{tmp_path / 'sub.db'}", tmp_path) as workloads:
        store = workloads.rt.store
        assert isinstance(store, sqlite_backend.SQLiteStore)
        store._conn.set_trace_callback(statements.append)
        workloads.rt.submit(workloads._flows["write"], run_id="queued")
        store._conn.set_trace_callback(None)
    assert _sync_of_each_commit(statements) == ["FULL"]


def test_sqlite_intents_on_a_normal_ledger_changes_nothing(tmp_path: Path) -> None:
    """``synchronous=normal`` flushes nothing per commit already; intents mode must not raise it."""
    db = tmp_path / "normal.db"
    statements = _traced_sqlite(f"sqlite:///{db}?synchronous=normal&durability=intents", tmp_path)
    assert not any("synchronous" in sql.lower() for sql in statements)
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


# -- PostgreSQL: synchronous_commit of each transaction -----------------------------------------


def _synchronous_commit(store: postgres_backend.PostgresStore, *, deferrable: bool) -> str:
    with store._batch(deferrable=deferrable) as conn:
        row = conn.execute("SHOW synchronous_commit").fetchone()
    assert row is not None
    return str(row[0])


def test_postgres_intents_commit_outcomes_asynchronously(pg_backend: Backend) -> None:
    store = open_store(_with_option(pg_backend.url, "durability=intents"))
    assert isinstance(store, postgres_backend.PostgresStore)
    try:
        assert _synchronous_commit(store, deferrable=True) == "off"
        # SET LOCAL ends with its transaction: the next one on the same pool flushes again.
        assert _synchronous_commit(store, deferrable=False) == "on"
        assert _synchronous_commit(store, deferrable=False) == "on"
    finally:
        store.close()


def test_postgres_default_commits_synchronously(pg_backend: Backend) -> None:
    store = open_store(pg_backend.url)
    assert isinstance(store, postgres_backend.PostgresStore)
    try:
        assert _synchronous_commit(store, deferrable=True) == "on"
    finally:
        store.close()


def test_postgres_a_run_start_rides_asynchronously(
    pg_backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rt.start``'s first commit is asynchronous on PostgreSQL too (the server's WAL is one
    sequence: the run's first intent, committed synchronously before its call, flushes it); every
    other batch of the default durability commits synchronously, on the one-trip path (the
    function's last argument) and statement by statement (``_riding_txn``)."""
    with _workloads(pg_backend.url, tmp_path) as workloads:
        store = workloads.rt.store
        assert isinstance(store, postgres_backend.PostgresStore)
        made = store._one_trip_params
        seen: list[tuple[list[str], bool]] = []

        def recording(batch: Batch, *args: Any, **kw: Any) -> Any:
            params, shard_after = made(batch, *args, **kw)
            seen.append(([event.kind for event in batch.audit], params[-1]))
            return params, shard_after

        monkeypatch.setattr(store, "_one_trip_params", recording)
        workloads.run("write", 1, "rides")
        # (A batch composed again on a head that moved is counted once a try.)
        assert {tuple(kinds) for kinds, off in seen if off} == {("run_started",)}
        assert sum(kinds.count("intent") for kinds, off in seen if not off) >= 10
        with store._riding_txn() as conn:
            row = conn.execute("SHOW synchronous_commit").fetchone()
        assert row is not None
        assert row[0] == "off"
        assert _synchronous_commit(store, deferrable=False) == "on"


def test_postgres_forgets_the_heads_of_runs_that_ended(pg_backend: Backend, tmp_path: Path) -> None:
    """The one-trip path remembers a running run's chain heads, not a finished run's: memory for
    the runs in flight, not for every run this process finished (up to 4,096 of them before)."""
    with _workloads(pg_backend.url, tmp_path) as workloads:
        store = workloads.rt.store
        assert isinstance(store, postgres_backend.PostgresStore)
        workloads.run("write", 3, "ended")
        assert store.trips["one_trip"] > 0
        assert not [run_id for run_id in store._heads if run_id.startswith("ended-")]
        assert store.verify_audit() == []
