"""The embedded SQLite ledger: one file, WAL, stdlib ``sqlite3``.

Durability: ``synchronous=FULL`` by default, so a commit survives power loss, not just a process
crash (``?synchronous=normal`` in the URL trades that for speed; the benchmark says by how much).
``?durability=intents`` keeps FULL for intents and lets a call's outcome commit at NORMAL: it
becomes power-safe with the next FULL commit, which syncs the whole WAL (``store.DURABILITY``).
Writers take ``BEGIN IMMEDIATE`` so two processes on one file serialize instead of failing
mid-transaction.

What a batch writes and what the reads ask is written once for both ledgers (``sql_core``, rows
mapped by ``rowmap``); this module keeps what is SQLite's own: the file (refusing foreign ones,
read-only opens), the lock and transactions, group commit's savepoints, the shards' remembered
heads, claims and leases, and the migrations. Its statements are the named queries of
``ledger/queries/sqlite.sql``; only transaction control (``BEGIN``, ``SAVEPOINT``, ``PRAGMA``) is
written here.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlparse

from effectflow import errors
from effectflow.ledger import audit as audit_chain
from effectflow.ledger import queries, records, upgrades
from effectflow.ledger.edge import ToolRaised, driver_cause, driver_errors
from effectflow.ledger.local import LocalTransaction
from effectflow.ledger.sql_core import SQLCore
from effectflow.ledger.sql_reads import SQLReads
from effectflow.ledger.store import (
    LEDGER_URL_FORMS,
    Batch,
    parse_durability,
)

T = TypeVar("T")

_SYNC_MODES = {"off": "OFF", "normal": "NORMAL", "full": "FULL", "extra": "EXTRA"}


def parse_url(url: str) -> tuple[str, dict[str, str]]:
    """The file path and options of a ``sqlite:///`` URL (or a plain path).

    A slip is refused rather than guessed at, before any file is created: ``sqlite://x.db`` names
    a host, not a file (it used to be read as a relative path, so a typo decided where the ledger
    lived), ``sqlite:/x.db`` is no URL and would have been a file in a folder named ``sqlite:``.

    Raises:
        errors.ContractError: the URL is malformed (names what was given and the right forms).
    """
    forms = f"write {LEDGER_URL_FORMS}"
    if "://" not in url:
        scheme, colon, rest = url.partition(":")
        slipped = scheme.lower() in ("sqlite", "sqlite3", "file", "postgres", "postgresql")
        if colon and (slipped or (len(scheme) > 1 and scheme.isalnum() and rest.startswith("/"))):
            raise errors.ContractError(f"{url!r} is not a ledger URL (a scheme needs ://); {forms}")
        if not url:
            raise errors.ContractError(f"no ledger given; {forms}")
        return url, {}
    parsed = urlparse(url)
    if parsed.scheme not in ("sqlite", "file"):
        raise errors.ContractError(f"{url!r} is not a SQLite URL; {forms}")
    if parsed.netloc:
        raise errors.ContractError(
            f"{url!r}: two slashes make {parsed.netloc!r} a host, not a file (a relative path is "
            f"{parsed.scheme}:///{parsed.netloc}{parsed.path}); {forms}"
        )
    path = parsed.path[1:]  # sqlite:///rel.db -> rel.db ; sqlite:////abs.db -> /abs.db
    options = {key: values[-1] for key, values in parse_qs(parsed.query).items()}
    if not path or path.endswith("/"):
        raise errors.ContractError(f"{url!r}: no database file; {forms}")
    return path, options


def _seconds(url: str, options: dict[str, str], name: str, default: float) -> float:
    """A URL option in seconds (``?busy_timeout=5``)."""
    if name not in options:
        return default
    try:
        value = float(options[name])
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise errors.ContractError(f"{url!r}: {name}={options[name]!r}; give seconds, e.g. 5")
    return value


class SQLiteStore(SQLCore, SQLReads):
    """A ledger in one SQLite file. Thread-safe: one connection behind a lock."""

    DIALECT = "sqlite"
    SQL = queries.statements("sqlite")
    _MARK = "?"
    #: BEGIN IMMEDIATE holds the file's write lock: a batch's fence is a read, its run updated once.
    _FENCE_BY_READ = True

    def __init__(self, url: str) -> None:
        self.url = url
        path, options = parse_url(url)
        sync = options.get("synchronous", "full").lower()
        if sync not in _SYNC_MODES:
            raise errors.ContractError(
                f"{url!r}: synchronous={sync!r}; use one of {sorted(_SYNC_MODES)}"
            )
        #: The database file.
        self.path = path
        #: The ``PRAGMA synchronous`` mode in force (FULL survives power loss).
        self.synchronous = _SYNC_MODES[sync]
        #: ``full`` or ``intents``: whether a call's outcome waits for its own fsync.
        self.durability = parse_durability(url, options.get("durability"))
        # With ``intents`` a deferrable batch commits at NORMAL: written to the WAL, not synced.
        # The next FULL commit syncs the WAL file, and with it every frame written before it.
        self._deferred_sync = (
            "NORMAL"
            if self.durability == "intents" and self.synchronous in ("FULL", "EXTRA")
            else self.synchronous
        )
        self._sync_now = self.synchronous
        #: One writer at a time: grouping the commits of runs in flight saves fsyncs
        #: (BENCHMARKS.md, "Workers").
        self.group_commit_default = True
        self.max_concurrent_writers = 1
        #: The threads' group commit takes turns (``group_commit``): the statements of the one
        #: writer's transaction run while the other threads are parked.
        self.group_commit_turns = True
        #: How long an idle worker sleeps between looks for work (no LISTEN/NOTIFY in SQLite).
        self.poll_interval = float(options.get("poll_interval", 0.1))
        mode = options.get("mode", "rw").lower()
        if mode not in ("rw", "ro"):
            raise errors.ContractError(f"{url!r}: mode={mode!r}; use rw (the default) or ro")
        #: Opened with SQLite's read-only mode (``?mode=ro``): nothing can be written, not even
        #: the journal mode or a migration.
        self.read_only = mode == "ro"
        #: The operator's audit key (``EFFECTFLOW_AUDIT_KEY``): chains are HMACs with it.
        self.audit_key = audit_chain.key_from_env()
        if path != ":memory:":
            _refuse_foreign_file(Path(path))
            if not self.read_only:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        #: Each shard's (n, head) as this store last committed it (see ``_seal_txn``).
        self._shard_heads: dict[int, tuple[int, str]] = {}
        #: How long a statement waits for another writer's lock before failing (seconds).
        self.busy_timeout = _seconds(url, options, "busy_timeout", 30.0)
        target, uri = path, False
        if self.read_only and path != ":memory:":
            target, uri = f"{Path(path).absolute().as_uri()}?mode=ro", True
        with self._edge():
            self._conn = sqlite3.connect(
                target,
                isolation_level=None,
                check_same_thread=False,
                timeout=self.busy_timeout,
                uri=uri,
            )
        self._conn.row_factory = sqlite3.Row
        try:
            _check_schema(self._conn, path, read_only=self.read_only)
            with self._edge():
                self._conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
                if not self.read_only:
                    self._conn.execute("PRAGMA journal_mode=WAL")
                    self._conn.execute(f"PRAGMA synchronous={self.synchronous}")
            if not self.read_only:
                self.migrate()
        except BaseException:
            self._conn.close()
            raise

    def _edge(self) -> AbstractContextManager[None]:
        """Where ``sqlite3``'s exceptions become the ledger's: a lock held past the busy timeout,
        a full disk, an I/O error (``OperationalError``) are ``LedgerUnavailable``, worth
        retrying; any other is ``LedgerError``."""
        return driver_errors(self.path, (sqlite3.OperationalError,), sqlite3.Error)

    def bound_waits(self, seconds: float) -> None:
        """A statement waits for another writer's lock at most ``seconds`` (and never past
        ``busy_timeout``)."""
        wait = max(0.1, min(self.busy_timeout, seconds))
        with self._lock:
            self._conn.execute(f"PRAGMA busy_timeout={int(wait * 1000)}")

    # -- schema ---------------------------------------------------------------------------------

    def _migrations(self) -> list[tuple[int, str, str]]:
        return migrations()

    def _run_script(self, conn: sqlite3.Connection, sql: str) -> None:
        """One statement at a time (``sqlite3`` runs one per call); triggers keep their inner
        semicolons."""
        for statement in _split_sql(sql):
            conn.execute(statement)

    def _describe(self) -> str:
        return self.path

    def _lock_migrations(self, conn: sqlite3.Connection) -> None:
        """The file's write lock (``BEGIN IMMEDIATE``) is held already."""

    def schema_version(self) -> int:
        """The newest migration applied to this file."""
        return int(self._all(self.SQL["schema_version"])[0][0] or 0)

    @contextmanager
    def _write(
        self, *, deferrable: bool = False, rides: bool = False
    ) -> Iterator[sqlite3.Connection]:
        with self._edge(), self._lock:
            # PRAGMA synchronous is the connection's, read at each commit: set it per transaction.
            if rides:  # ``Batch.rides``: the next FULL commit syncs the WAL, this one with it
                sync = "NORMAL" if self.synchronous in ("FULL", "EXTRA") else self.synchronous
            else:
                sync = self._deferred_sync if deferrable else self.synchronous
            if sync != self._sync_now:
                self._conn.execute(f"PRAGMA synchronous={sync}")
                self._sync_now = sync
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            else:
                self._conn.execute("COMMIT")

    # -- writes ---------------------------------------------------------------------------------

    def apply_with(
        self,
        work: Callable[[LocalTransaction], T],
        finish: Callable[[T], Batch],
        *,
        lease_ttl: float,
        now: float,
    ) -> tuple[T, dict[str, Any] | None]:
        """A local transaction: the tool's writes and its checkpoint in one commit.

        A COMMIT that fails and leaves no transaction open (an I/O error part-way) may have landed:
        it raises ``CommitInDoubt``. One that leaves it open is rolled back here: nothing landed.
        """
        batch: Batch | None = None
        written = False
        with self._lock:
            try:
                with self._write() as conn:
                    try:
                        value = work(LocalTransaction(conn, backend="sqlite", paramstyle="qmark"))
                    except Exception as exc:
                        raise ToolRaised(exc) from exc  # the tool's own, not the ledger's
                    batch = finish(value)
                    control, seal = self._apply_txn(conn, batch, lease_ttl=lease_ttl, now=now)
                    self._seal_txn(conn, [seal] if seal else [])
                    written = True  # from here on, only the COMMIT can fail
            except Exception as exc:
                if batch is None or not written:
                    raise
                cause = driver_cause(exc)
                if self._conn.in_transaction:
                    with self._edge():
                        self._conn.execute("ROLLBACK")  # SQLite kept it open: it did not commit
                    # The COMMIT was refused (a deferred constraint of the tool's own writes): the
                    # refusal is the transaction's, as the tool's errors are.
                    raise cause from cause.__cause__
                raise errors.CommitInDoubt(
                    f"run {batch.run_id}: the COMMIT of a local transaction failed part-way "
                    f"({cause}); it may have committed",
                    run_id=batch.run_id,
                ) from cause
        return value, control

    def checkpoint_committed(self, run_id: str, attempt_id: str) -> bool:
        """Read the checkpoint's attempt row (see ``LedgerStore.checkpoint_committed``). The
        transaction it settles is over: its connection is this store's own, which has ended it."""
        rows = self._all(self.SQL["checkpoint_outcome"], (run_id, attempt_id))
        return bool(rows) and rows[0]["outcome"] == records.Outcome.COMMITTED.value

    def _rollback_savepoint(self, conn: sqlite3.Connection) -> None:
        """Undo what one refused batch of a group wrote."""
        conn.execute("ROLLBACK TO batch")

    def _seal_txn(self, conn: sqlite3.Connection, seals: list[list[Any]]) -> None:
        """Append the transaction's seals, each chained into its shard (see ``audit``).

        The shards' heads come from this store's memory of its last commit, each confirmed by
        its UPDATE (``... AND n = <remembered n> AND head = <remembered head>``: the head too, as
        a transaction rolled back after this may have left a memory of the right length and the
        wrong head): one statement a shard, not a read and a write. A shard another process wrote
        since is read (the write lock is ours: it cannot move again) and chained anew."""
        if not seals:
            return
        shards = audit_chain.shards_of(seals)
        heads = self._shard_heads
        missing = [s for s in shards if s not in heads]
        if missing:
            heads.update(self._read_shards(conn, missing))
        rows, moved = audit_chain.chain_shards(seals, heads, self.audit_key)
        stale = [
            shard
            for n, head, shard in moved
            if conn.execute(self.SQL["move_shard"], (n, head, shard, *heads[shard])).rowcount != 1
        ]
        if stale:
            heads.update(self._read_shards(conn, stale))
            rows, moved = audit_chain.chain_shards(seals, heads, self.audit_key)
            for n, head, shard in moved:
                if shard in stale:
                    conn.execute(self.SQL["update_shard"], (n, head, shard))
        if audit_chain.first_uses(heads, shards):
            used = conn.execute(self.SQL["used_shards"], (audit_chain.INDEX,)).fetchall()
            index = audit_chain.index_row([*(r[0] for r in used), *shards], self.audit_key)
            conn.execute(self.SQL["update_shard"], index)
        self._many(conn, self.SQL["insert_seal"], rows)
        # Remembered as committed; if the transaction rolls back, the next UPDATE finds another
        # n and reads the shard again.
        heads.update((shard, (n, head)) for n, head, shard in moved)

    def _read_shards(
        self, conn: sqlite3.Connection, shards: list[int]
    ) -> dict[int, tuple[int, str]]:
        marks = ", ".join("?" * len(shards))
        rows = conn.execute(self.SQL["read_shards"].format(marks=marks), shards).fetchall()
        return audit_chain.shard_heads_read(shards, [(r[0], r[1], r[2]) for r in rows])

    def heartbeat(self, leases: Sequence[tuple[str, int]], *, ttl: float, now: float) -> list[str]:
        """Extend held leases; report the lost ones."""
        lost = []
        with self._write() as conn:
            for run_id, token in leases:
                row = conn.execute(self.SQL["heartbeat"], (now + ttl, run_id, token)).fetchone()
                if row is None:
                    lost.append(run_id)
        return lost

    def wait_for_work(self, timeout: float) -> bool:
        """SQLite has no notifications: sleep a short poll interval, then look."""
        time.sleep(max(0.0, min(timeout, self.poll_interval)))
        return True

    # -- the shared write path's hooks (``sql_core``) -------------------------------------------

    def _one(self, conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> sqlite3.Row | None:
        """Run ``sql`` and read its first row."""
        row: sqlite3.Row | None = conn.execute(sql, params).fetchone()
        return row

    def _exec(self, conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> None:
        """Run ``sql``."""
        conn.execute(sql, params)

    def _many(self, conn: sqlite3.Connection, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run ``sql`` once per row (one row: a plain execute, cheaper than executemany)."""
        if len(rows) == 1:
            conn.execute(sql, rows[0])
        else:
            conn.executemany(sql, rows)

    def _rows(self, conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> list[sqlite3.Row]:
        """Run ``sql`` and read all its rows."""
        return conn.execute(sql, params).fetchall()

    def _batch_txn(self, *, deferrable: bool = False) -> AbstractContextManager[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` (see ``_write``)."""
        return self._write(deferrable=deferrable)

    def _riding_txn(self) -> AbstractContextManager[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` committed at NORMAL (``Batch.rides``)."""
        return self._write(rides=True)

    def _plain_txn(self) -> AbstractContextManager[sqlite3.Connection]:
        """``BEGIN IMMEDIATE``: SQLite has no pipeline, every transaction is plain."""
        return self._write()

    def _write_rows(self, sql: str, params: Sequence[Any] | Mapping[str, Any]) -> list[sqlite3.Row]:
        """One statement under the write lock, in its own transaction."""
        with self._write() as conn:
            return conn.execute(sql, params).fetchall()

    def _claim_rows(self, or_dead: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """The candidates with their owners, then their claim, in one write transaction."""
        with self._write() as conn:
            picked = conn.execute(
                self.SQL["claim_runnable_candidates"].format(or_dead=or_dead), params
            ).fetchall()
            if not picked:
                return []
            before = {r["run_id"]: r["previous_owner"] for r in picked}
            term, named = self._in_named("run_id", "picked", list(before))
            claimed = conn.execute(
                self.SQL["claim_runnable"].format(picked=term), {**params, **named}
            ).fetchall()
        return [{**dict(r), "previous_owner": before[r["run_id"]]} for r in claimed]

    def _in_named(
        self, column: str, name: str, values: Sequence[Any]
    ) -> tuple[str, dict[str, Any]]:
        """``column IN (:name_0, ...)``: SQLite binds no arrays."""
        names = [f"{name}_{i}" for i in range(len(values))]
        marks = ", ".join(":" + n for n in names)
        return f"{column} IN ({marks})", dict(zip(names, values, strict=True))

    def _wrote(self, conn: sqlite3.Connection, batch: Batch, changes: dict[str, Any]) -> None:
        """Nothing to announce: SQLite has no notifications, workers poll (``wait_for_work``)."""

    # -- reads (the rest are ``sql_reads.SQLReads``) ---------------------------------------------

    def _read(self, sql: str, params: Sequence[Any]) -> list[Any]:
        """Run a read-only statement on the store's connection (the reads of ``sql_core``)."""
        return self._all(sql, params)

    def _in(self, column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
        """``column IN (?, ...)``: SQLite binds no arrays."""
        return f"{column} IN ({', '.join('?' for _ in values)})", list(values)

    def _qmark(self, sql: str) -> str:
        """SQLite's placeholder is ``?`` already."""
        return sql

    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._edge(), self._lock:
            return self._conn.execute(sql, params).fetchall()

    @contextmanager
    def audit_snapshot(self) -> Iterator[None]:
        """The reads of this store see one moment of the file until the block ends (a read
        transaction; WAL keeps it while others write): ``verify`` on a live ledger reads a run's
        row and its seals as they were together. This store's own writes wait for the block."""
        with self._edge(), self._lock:
            if self._conn.in_transaction:
                yield
                return
            self._conn.execute("BEGIN")
            try:
                yield
            finally:
                self._conn.execute("COMMIT")

    def audit_stream(
        self, sql: str, params: Sequence[Any], *, size: int = 5000
    ) -> Iterator[dict[str, Any]]:
        """The rows of a read-only query, ``size`` at a time, in a snapshot: what ``verify`` reads
        of every seal, in bounded memory."""
        with self.audit_snapshot(), self._edge():
            cur = self._conn.execute(sql, params)
            while rows := cur.fetchmany(size):
                yield from (dict(r) for r in rows)

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._conn.close()

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r}, synchronous={self.synchronous}, pid={os.getpid()})"


#: The first bytes of every SQLite database file.
_SQLITE_MAGIC = b"SQLite format 3\x00"


def _refuse_foreign_file(path: Path) -> None:
    """Refuse, before opening it, a file that is not an SQLite database (nothing is written)."""
    try:
        with path.open("rb") as fh:
            head = fh.read(len(_SQLITE_MAGIC))
    except FileNotFoundError:
        return  # a new ledger
    except OSError as exc:
        raise errors.LedgerFileError(f"{path}: cannot be read ({exc.strerror})") from None
    if head and head != _SQLITE_MAGIC:
        raise errors.LedgerFileError(
            f"{path} is not an SQLite database, so not an effectflow ledger; it was not touched. "
            "Point the ledger URL at an effectflow ledger file (sqlite:///path/to/ledger.db), or "
            "at a path that does not exist yet for a new one"
        )


def _check_schema(conn: sqlite3.Connection, path: str, *, read_only: bool) -> None:
    """Refuse another application's database, a schema newer than this effectflow knows, and a
    read-only ledger that needs an upgrade — read through ``sqlite_master`` only, so the file is
    not changed (not even switched to WAL)."""
    try:
        tables = {r[0] for r in conn.execute(SQLiteStore.SQL["file_tables"])}
    except sqlite3.DatabaseError as exc:
        raise errors.LedgerFileError(
            f"{path} cannot be read as an SQLite database ({exc}); it was not touched"
        ) from None
    known = migrations()[-1][0]
    if "schema_migrations" not in tables:
        if tables - {"sqlite_sequence"}:
            raise errors.LedgerFileError(
                f"{path} is an SQLite database of another application (tables: "
                f"{', '.join(sorted(tables)[:5])}), not an effectflow ledger; it was not touched"
            )
        if read_only:
            raise errors.LedgerFileError(
                f"{path} holds no effectflow ledger yet, and it is opened read-only"
            )
        return
    row = conn.execute(SQLiteStore.SQL["schema_version"]).fetchone()
    version = int(row[0] or 0)
    if version > known:
        raise errors.LedgerFileError(
            f"{path} is an effectflow ledger at schema version {version}; this effectflow "
            f"({_package_version()}) knows versions up to {known}. Upgrade effectflow to open it "
            "(pip install -U effectflow); the file was not touched"
        )
    if read_only and version < known:
        raise errors.LedgerFileError(
            f"{path} is at schema version {version} and this effectflow reads version {known}: "
            "it must be upgraded first, which a read-only open cannot do. Run any command that "
            "writes (e.g. effectflow recover) once, with write access"
        )


def _package_version() -> str:
    import effectflow

    return str(effectflow.__version__)


def migrations() -> list[tuple[int, str, str]]:
    """The packaged migrations, ``(version, name, sql)`` in order."""
    return upgrades.packaged("sqlite")


_split_sql = upgrades.split_sqlite_script
