"""The PostgreSQL ledger: psycopg 3 and a connection pool, for many workers on many machines.

Every batch is one transaction on a pooled connection. Writers of one run serialize on the run's row:
a fenced batch takes it with ``UPDATE ... WHERE lease_token = ... RETURNING`` and an unfenced one
with ``SELECT ... FOR UPDATE``, so the audit head it extends cannot move under it; writers of
different runs never wait for each other. Claimers skip the rows other claimers hold
(``FOR UPDATE SKIP LOCKED``), and a transaction that leaves a run waiting for a worker sends
``NOTIFY effectflow_runnable``, which ``wait_for_work`` listens for on a connection of its own.

Records read back identical to SQLite's: times are DOUBLE PRECISION epoch seconds, and JSON
columns hold the canonical JSON text the write path printed (TEXT, as SQLite does: jsonb would
print ``1e16`` back as the integer ``10000000000000000``, another value than the one recorded and
sealed). Cast a column to jsonb to query into it (``output_json::jsonb ->> 'id'``).

What a batch writes and what the reads ask is written once for both ledgers (``sql_core``, rows
mapped by ``rowmap``); this module keeps what is PostgreSQL's own: the pool, pipelined
transactions, savepoints, locking the shards, claims, leases and notifications, settling a lost
COMMIT, and the migrations.
"""

from __future__ import annotations

import contextlib
import functools
import json
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from importlib import resources
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlparse, urlunparse

import psycopg
import psycopg_pool
from psycopg import conninfo as pg_conninfo
from psycopg.rows import TupleRow, dict_row

from effectflow import digests, errors
from effectflow.ledger import audit as audit_chain
from effectflow.ledger import records, rowmap
from effectflow.ledger.local import LocalTransaction
from effectflow.ledger.sql_core import SQLCore, SQLReads
from effectflow.ledger.store import (
    Applied,
    Batch,
    parse_durability,
)

T = TypeVar("T")
Row = dict[str, Any]
Connection = psycopg.Connection[TupleRow]

#: The channel a transaction notifies when it leaves a run for workers; the payload is the run id.
CHANNEL = "effectflow_runnable"
#: The advisory lock migrations run under, so processes starting at once apply each one once.
_MIGRATION_LOCK = int.from_bytes(b"effmigr8", "big") >> 1
#: Statuses in which a step's key binding must be kept even past retention.
_UNSETTLED = [
    str(status)
    for status in (
        records.StepStatus.INTENT_RECORDED,
        records.StepStatus.UNKNOWN,
        records.StepStatus.NEEDS_ATTENTION,
        records.StepStatus.NOT_COMMITTED,
        records.StepStatus.AWAITING_COMPLETION,
    )
]
#: How long settling a lost COMMIT waits for the run's row lock (``checkpoint_committed``).
_SETTLE_LOCK_TIMEOUT = 5.0
#: SQLSTATE classes of errors that do not answer a COMMIT: connection exceptions, and operator
#: intervention (a backend told to terminate may do so right after its commit record is written).
_NO_ANSWER_CLASSES = ("08", "57")
#: URL query options the store reads itself; every other one goes to libpq as is.
_OWN_OPTIONS = ("pool_max", "pool_timeout", "durability")


def parse_url(url: str) -> tuple[str, dict[str, str]]:
    """The libpq connection URL and the store's own options of a ``postgresql://`` URL."""
    parsed = urlparse(url)
    if parsed.scheme not in ("postgres", "postgresql"):
        raise errors.ContractError(f"{redacted(url)!r}: not a postgresql:// URL")
    # libpq's options pass through as written (decoding and encoding again would turn a space
    # into a "+", which libpq does not read back as a space).
    pieces = [piece for piece in parsed.query.split("&") if piece]
    ours = [piece for piece in pieces if piece.split("=", 1)[0] in _OWN_OPTIONS]
    theirs = "&".join(piece for piece in pieces if piece not in ours)
    return urlunparse(parsed._replace(query=theirs)), dict(parse_qsl("&".join(ours)))


def redacted(url: str) -> str:
    """The URL without its password, fit for messages and logs."""
    parsed = urlparse(url)
    if parsed.password is None:
        return url
    netloc = parsed.netloc.replace(f":{parsed.password}@", ":***@", 1)
    return urlunparse(parsed._replace(netloc=netloc))


@functools.lru_cache(maxsize=1024)
def _pg(sql: str) -> str:
    """A statement written with ``?`` placeholders, in psycopg's ``%s``."""
    return sql.replace("?", "%s")


_UPSERT_STEP = _pg(rowmap.UPSERT_STEP)
_UPSERT_ATTEMPT = _pg(rowmap.UPSERT_ATTEMPT)
_UPSERT_EFFECT = _pg(rowmap.UPSERT_EFFECT)
_INSERT_DECISION = _pg(rowmap.INSERT_DECISION)
_INSERT_APPROVAL = _pg(rowmap.INSERT_APPROVAL)
_BIND_OPERATION = _pg(rowmap.BIND_OPERATION)
_INSERT_RUN = _pg(rowmap.INSERT_RUN)
_INSERT_AUDIT = _pg(rowmap.INSERT_AUDIT)
_INSERT_SEAL = _pg(audit_chain.INSERT_SEAL)
_UPDATE_SHARD = _pg(audit_chain.UPDATE_SHARD)
_USED_SHARDS = _pg(rowmap.USED_SHARDS)
# Locked in shard order (``audit.shards_of`` sorts them): the rows are locked as the sort yields
# them.
_LOCK_SHARDS = (
    "SELECT shard, n, head FROM audit_shards WHERE shard = ANY(%s) ORDER BY shard FOR UPDATE"
)


@contextmanager
def _pipeline(conn: Connection) -> Iterator[None]:
    """``conn.pipeline()``; after an error it first reads the results the error aborted, so that
    leaving the pipeline does not fail (and log) a second time."""
    with conn.pipeline() as pipeline:
        try:
            yield
        except BaseException:
            with contextlib.suppress(psycopg.Error):
                pipeline.sync()
            raise


def _answered(exc: Exception) -> bool:
    """Whether an error raised by a COMMIT is the server's answer to it (then nothing committed),
    rather than the connection going away with the answer unread."""
    state = exc.sqlstate if isinstance(exc, psycopg.Error) else None
    return state is not None and not state.startswith(_NO_ANSWER_CLASSES)


def _one(conn: Connection, sql: str, params: Sequence[Any] = ()) -> Row | None:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(sql, params)
        return cur.fetchone()


def _rows(conn: Connection, sql: str, params: Sequence[Any] = ()) -> list[Row]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(sql, params)
        return cur.fetchall()


class _ToolConnection:
    """What a local transaction's ``tx`` drives: the ledger's connection, DB-API style.

    psycopg connections have no ``executemany``, and read ``%`` as a placeholder even in a statement
    without parameters; this gives tools the same two calls the SQLite connection offers.
    """

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Any = ()) -> psycopg.Cursor[TupleRow]:
        return self._conn.execute(sql, params or None)

    def executemany(self, sql: str, rows: Any) -> psycopg.Cursor[TupleRow]:
        cur = self._conn.cursor()
        cur.executemany(sql, rows)
        return cur


class PostgresStore(SQLCore, SQLReads):
    """A ledger in a PostgreSQL database. Thread-safe: every call takes a pooled connection.

    URL options (the query string): ``pool_max`` (default 8) bounds the pool; ``durability``
    (``full``, the default, or ``intents``: see ``store.DURABILITY``); the rest go to libpq
    (``sslmode``, ``connect_timeout``, ``application_name``, ...).
    """

    def __init__(self, url: str) -> None:
        self.url = url
        #: The operator's audit key (``EFFECTFLOW_AUDIT_KEY``): chains are HMACs with it.
        self.audit_key = audit_chain.key_from_env()
        conninfo, options = parse_url(url)
        try:
            pool_max = int(options.get("pool_max", "8"))
        except ValueError:
            pool_max = 0
        if pool_max < 1:
            raise errors.ContractError(
                f"{redacted(url)!r}: pool_max={options['pool_max']!r}; "
                "use a whole number of connections >= 1"
            )
        #: Most connections the pool opens.
        self.pool_max = pool_max
        try:
            pool_timeout = float(options.get("pool_timeout", "10"))
        except ValueError:
            pool_timeout = -1.0
        if not pool_timeout > 0:
            raise errors.ContractError(
                f"{redacted(url)!r}: pool_timeout={options['pool_timeout']!r}; give seconds > 0"
            )
        #: How long a call waits for a pooled connection before failing with ``PoolTimeout``
        #: (seconds). Bounded so that a server that is down surfaces as an error the runtime
        #: retries within its ``ledger_retry``, rather than as a silent wait.
        self.pool_timeout = pool_timeout
        #: ``full`` or ``intents``: whether a call's outcome waits for its WAL flush.
        self.durability = parse_durability(redacted(url), options.get("durability"))
        #: Group transactions a process may have in flight at once (the rest of the pool serves
        #: reads and heartbeats).
        self.max_concurrent_writers = max(1, pool_max // 2)
        #: A restarted server, a cut connection, a pool with no connection to give: worth retrying
        #: (a broken connection is dropped by the pool, so the retry gets a fresh one).
        self.transient_errors: tuple[type[Exception], ...] = (
            psycopg.OperationalError,
            psycopg.InterfaceError,
            psycopg_pool.PoolTimeout,
        )
        #: PostgreSQL already flushes the WAL of concurrent commits together; grouping batches in
        #: the client on top measured slower here (BENCHMARKS.md), so it is off unless asked for.
        self.group_commit_default = False
        self._conninfo = conninfo
        named = "application_name" in pg_conninfo.conninfo_to_dict(conninfo)
        self._name: dict[str, Any] = {} if named else {"application_name": "effectflow"}
        # Connect once before the pool does, so an unreachable server fails here with libpq's own
        # message rather than as a pool timeout half a minute later.
        psycopg.connect(conninfo, **self._name).close()
        self._pool: psycopg_pool.ConnectionPool[Connection] = psycopg_pool.ConnectionPool(
            conninfo,
            min_size=1,
            max_size=pool_max,
            # Autocommit: a read or a one-statement write is one round trip; a batch opens its own
            # transaction.
            kwargs={**self._name, "autocommit": True},
            name="effectflow-ledger",
            timeout=pool_timeout,
            open=True,
        )
        self._listen_lock = threading.Lock()
        #: The connection of a thread's ``audit_snapshot``, which its reads go through.
        self._snapshot = threading.local()
        self._listener: Connection | None = None
        try:
            self.migrate()
        except BaseException:
            self._pool.close()
            raise

    def bound_waits(self, seconds: float) -> None:
        """A call waits for a pooled connection at most ``seconds`` (and never past
        ``pool_timeout``)."""
        self._pool.timeout = max(0.1, min(self.pool_timeout, seconds))

    # -- schema ---------------------------------------------------------------------------------

    def migrate(self) -> list[int]:
        """Apply the migrations this database has not seen; returns the versions applied."""
        applied: list[int] = []
        with self._transaction() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, "
                "name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)"
            )
            done = {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}
            known = migrations()[-1][0]
            if done and max(done) > known:
                import effectflow

                raise errors.LedgerFileError(
                    f"this PostgreSQL ledger is at schema version {max(done)}; this effectflow "
                    f"({effectflow.__version__}) knows versions up to {known}. Upgrade effectflow "
                    "to open it (pip install -U effectflow); nothing was changed"
                )
            for version, name, sql in migrations():
                if version in done:
                    continue
                conn.execute(sql)  # no parameters: psycopg sends the whole script at once
                if version in _AFTER_MIGRATION:
                    _AFTER_MIGRATION[version](conn)
                conn.execute(
                    "INSERT INTO schema_migrations (version, name, applied_at) "
                    "VALUES (%s, %s, extract(epoch FROM clock_timestamp()))",
                    (version, name),
                )
                applied.append(version)
        return applied

    def schema_version(self) -> int:
        """The newest migration applied to this database."""
        with self._pool.connection() as conn:
            row = conn.execute("SELECT max(version) FROM schema_migrations").fetchone()
        return int(row[0] or 0) if row else 0

    @contextmanager
    def _transaction(self) -> Iterator[Connection]:
        """A transaction on a pooled connection, one statement after the other."""
        with self._pool.connection() as conn, conn.transaction():
            yield conn

    @contextmanager
    def _batch(self, *, deferrable: bool = False) -> Iterator[Connection]:
        """A pipelined transaction: a statement whose result is not read travels with the next
        one that is, or with the COMMIT. Applying a batch costs two round trips (the fence, the
        commit) and one per operation binding, instead of one per statement.

        BEGIN and COMMIT are plain statements here because psycopg's transaction blocks sync the
        pipeline on their own; on an error the pool's connection block rolls back.
        """
        with self._pool.connection() as conn, _pipeline(conn):
            conn.execute("BEGIN")
            if deferrable and self.durability == "intents":
                # An asynchronous commit: PostgreSQL's WAL is one sequence, so the next
                # synchronous commit's flush makes this one durable too.
                conn.execute("SET LOCAL synchronous_commit TO off")
            yield conn
            conn.execute("COMMIT")

    def _statement(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """One statement in its own (implicit) transaction: one round trip (or in this thread's
        ``audit_snapshot``)."""
        snapshot: Connection | None = getattr(self._snapshot, "conn", None)
        if snapshot is not None:
            return _rows(snapshot, sql, params)
        with self._pool.connection() as conn:
            return _rows(conn, sql, params)

    # -- writes ---------------------------------------------------------------------------------

    def apply(self, batch: Batch, *, lease_ttl: float, now: float) -> dict[str, Any] | None:
        """Commit one batch in one transaction (see ``LedgerStore.apply``)."""
        with self._batch(deferrable=batch.deferrable) as conn:
            control, seal = self._apply_txn(conn, batch, lease_ttl=lease_ttl, now=now)
            self._seal_txn(conn, [seal] if seal else [])
            return control

    def apply_with(
        self,
        work: Callable[[LocalTransaction], T],
        finish: Callable[[T], Batch],
        *,
        lease_ttl: float,
        now: float,
    ) -> tuple[T, dict[str, Any] | None]:
        """A local transaction: the tool's writes and its checkpoint in one commit.

        A COMMIT that gets no answer from the server (the connection broke while committing) may
        have landed: it raises ``CommitInDoubt`` instead of the driver's error, never "rolled back".
        """
        batch: Batch | None = None
        written = False
        try:
            with self._transaction() as conn:
                # The tool's statements run one by one, as on any connection (it may read
                # rowcount).
                tx = LocalTransaction(
                    _ToolConnection(conn), backend="postgresql", paramstyle="format"
                )
                value = work(tx)
                batch = finish(value)
                with _pipeline(conn):
                    control, seal = self._apply_txn(conn, batch, lease_ttl=lease_ttl, now=now)
                    self._seal_txn(conn, [seal] if seal else [])
                written = True  # from here on, only the COMMIT can fail
        except Exception as exc:
            if batch is None or not written or _answered(exc):
                raise
            raise errors.CommitInDoubt(
                f"run {batch.run_id}: the COMMIT of a local transaction got no answer "
                f"({' '.join(str(exc).split())}); it may have committed",
                run_id=batch.run_id,
            ) from exc
        return value, control

    def checkpoint_committed(self, run_id: str, attempt_id: str) -> bool:
        """Read the checkpoint's attempt row on a new connection, after the run's row lock (see
        ``LedgerStore.checkpoint_committed``)."""
        with psycopg.connect(self._conninfo, connect_timeout=10, **self._name) as conn:
            try:
                # The checkpoint's fence updated the run's row: its lock is held until that
                # transaction ends, so once it is ours no COMMIT of it can still arrive.
                conn.execute(f"SET LOCAL lock_timeout = '{int(_SETTLE_LOCK_TIMEOUT * 1000)}ms'")
                conn.execute("SELECT 1 FROM runs WHERE run_id = %s FOR UPDATE", (run_id,))
            except psycopg.errors.LockNotAvailable as exc:
                raise errors.CommitInDoubt(
                    f"run {run_id}: a transaction holding the run stayed open for "
                    f"{_SETTLE_LOCK_TIMEOUT:g} s; the local transaction of attempt {attempt_id} "
                    "may still commit",
                    run_id=run_id,
                ) from exc
            row = conn.execute(
                "SELECT outcome FROM attempts WHERE run_id = %s AND attempt_id = %s",
                (run_id, attempt_id),
            ).fetchone()
            conn.rollback()
        return row is not None and row[0] == records.Outcome.COMMITTED.value

    def apply_many(
        self, batches: Sequence[Batch], *, lease_ttl: float, now: float
    ) -> list[Applied]:
        """Group commit: every batch in one transaction, each inside a savepoint so one refused
        batch does not sink the others."""
        results: list[Applied | None] = [None] * len(batches)
        # Runs are locked in run-id order (as heartbeats lock them), so two transactions sharing
        # runs cannot deadlock; the sort is stable, so batches of one run keep their order.
        order = sorted(range(len(batches)), key=lambda i: batches[i].run_id)
        seals: list[list[Any]] = []
        with self._batch(deferrable=all(b.deferrable for b in batches)) as conn:
            for i in order:
                conn.execute("SAVEPOINT batch")
                try:
                    control, seal = self._apply_txn(conn, batches[i], lease_ttl=lease_ttl, now=now)
                except (
                    errors.LeaseLost,
                    errors.IdempotencyConflict,
                    errors.RunNotFound,
                    errors.StaleState,
                ) as exc:
                    # A nested pipeline block syncs when it ends, so psycopg reads the ROLLBACK's
                    # result now: reading it, psycopg forgets the statements it prepared (and
                    # deallocates them). Read later, after the next batch's statements were queued
                    # under those names, they fail with "prepared statement does not exist".
                    with conn.pipeline():
                        conn.execute("ROLLBACK TO SAVEPOINT batch")
                    results[i] = Applied(error=exc)
                else:
                    results[i] = Applied(control=control)
                    if seal:
                        seals.append(seal)
                conn.execute("RELEASE SAVEPOINT batch")
            self._seal_txn(conn, seals)
        return [r for r in results if r is not None]

    def _seal_txn(self, conn: Connection, seals: list[list[Any]]) -> None:
        """Append the transaction's seals, each chained into its shard (see ``audit``). Last in the
        transaction, shards locked in one order: a transaction holding a shard waits for nothing
        but its COMMIT, so shards never deadlock with run rows or with each other."""
        if not seals:
            return
        shards = audit_chain.shards_of(seals)
        locked = _rows(conn, _LOCK_SHARDS, (shards,))
        heads = audit_chain.shard_heads_read(
            shards, [(r["shard"], r["n"], r["head"]) for r in locked]
        )
        rows, moved = audit_chain.chain_shards(seals, heads, self.audit_key)
        if audit_chain.first_uses(heads, shards):
            # The index row last (every transaction takes it after its shards): it serializes the
            # first uses, and each then reads the others' committed ones.
            _rows(
                conn, "SELECT n FROM audit_shards WHERE shard = %s FOR UPDATE", (audit_chain.INDEX,)
            )
            used = _rows(conn, "SELECT shard FROM audit_shards WHERE n > 0 AND shard <> %s",
                         (audit_chain.INDEX,))  # fmt: skip
            moved.append(
                audit_chain.index_row([*(r["shard"] for r in used), *shards], self.audit_key)
            )
        with conn.cursor() as cur:
            cur.executemany(_INSERT_SEAL, rows)
            cur.executemany(_UPDATE_SHARD, moved)

    def claim_runnable(
        self,
        *,
        owner: str,
        ttl: float,
        now: float,
        limit: int,
        dead_owners: Sequence[str] = (),
    ) -> list[records.RunRecord]:
        """Lease runnable runs; rows another claimer is taking are skipped, never waited for."""
        dead = list(dict.fromkeys(dead_owners))
        or_dead = " OR lease_owner = ANY(%s::text[])" if dead else ""
        rows = self._statement(
            "WITH picked AS (SELECT run_id FROM runs "
            "WHERE status IN ('running', 'cancelling') "
            f"AND (lease_expires_at IS NULL OR lease_expires_at < %s{or_dead}) "
            "ORDER BY created_at, insert_seq LIMIT %s FOR UPDATE SKIP LOCKED) "
            "UPDATE runs SET lease_owner = %s, lease_token = runs.lease_token + 1, "
            "lease_expires_at = %s FROM picked WHERE runs.run_id = picked.run_id "
            "RETURNING runs.*",
            (now, *([dead] if dead else []), limit, owner, now + ttl),
        )
        rows.sort(key=lambda r: (r["created_at"], r["insert_seq"]))
        return [rowmap.run(r) for r in rows]

    def heartbeat(self, leases: Sequence[tuple[str, int]], *, ttl: float, now: float) -> list[str]:
        """Extend held leases in one statement; report the lost ones.

        Rows are locked in run-id order, as group commits lock them, so a worker's heartbeat and
        its own commits never deadlock.
        """
        if not leases:
            return []
        held = {
            (row["run_id"], row["lease_token"])
            for row in self._statement(
                "WITH held AS (SELECT runs.run_id FROM runs "
                "JOIN unnest(%s::text[], %s::bigint[]) AS lease (run_id, token) "
                "ON runs.run_id = lease.run_id AND runs.lease_token = lease.token "
                'ORDER BY runs.run_id COLLATE "C" FOR UPDATE OF runs) '
                "UPDATE runs SET lease_expires_at = %s FROM held "
                "WHERE runs.run_id = held.run_id RETURNING runs.run_id, runs.lease_token",
                ([r for r, _ in leases], [t for _, t in leases], now + ttl),
            )
        }
        return [run_id for run_id, token in leases if (run_id, token) not in held]

    def wait_for_work(self, timeout: float) -> None:
        """Block until a transaction notifies that a run is waiting for a worker, or ``timeout``.

        The first call opens the listening connection; a notification sent while nobody waits is
        kept and wakes the next wait at once. One thread waits at a time; another returns after
        its timeout at the latest.
        """
        timeout = max(0.0, timeout)
        if not self._listen_lock.acquire(timeout=timeout):
            return
        try:
            if self._listener is None:
                listener = psycopg.connect(self._conninfo, autocommit=True, **self._name)
                try:
                    listener.execute(f"LISTEN {CHANNEL}")
                except BaseException:
                    listener.close()
                    raise
                self._listener = listener
            try:
                for _ in self._listener.notifies(timeout=timeout, stop_after=1):
                    pass
                # A burst (a batch of new runs) is one wake-up, not one per run.
                for _ in self._listener.notifies(timeout=0, stop_after=1000):
                    pass
            except psycopg.OperationalError:
                # The server went away: the next wait connects again; until then a worker that
                # looks for work finds out for itself.
                self._listener.close()
                self._listener = None
        finally:
            self._listen_lock.release()

    # -- the shared write path's hooks (``sql_core``) -------------------------------------------

    #: An unfenced batch locks its run's row (a fenced one has, by its UPDATE).
    _LOCK_RUN = " FOR UPDATE"

    def _one(self, conn: Connection, sql: str, params: Sequence[Any]) -> Row | None:
        """Run ``sql`` and read its first row: a round trip (the pipeline syncs)."""
        return _one(conn, _pg(sql), params)

    def _exec(self, conn: Connection, sql: str, params: Sequence[Any]) -> None:
        """Queue ``sql``: in the pipeline it travels with the next statement that is read."""
        conn.execute(_pg(sql), params)

    def _many(self, conn: Connection, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Queue ``sql`` once per row."""
        with conn.cursor() as cur:
            cur.executemany(_pg(sql), rows)

    def _wrote(self, conn: Connection, batch: Batch, changes: dict[str, Any]) -> None:
        """A run created for workers, or handed back to them, wakes the ones waiting."""
        if batch.new_run is not None or "status" in changes or "lease_owner" in changes:
            conn.execute(
                "SELECT pg_notify(%s, run_id) FROM runs WHERE run_id = %s "
                "AND status IN ('running', 'cancelling') AND lease_owner IS NULL",
                (CHANNEL, batch.run_id),
            )

    def claim(
        self, run_id: str, *, owner: str, expected_token: int, ttl: float, now: float
    ) -> records.RunRecord | None:
        """Take the lease by compare-and-swap on the token (see ``LedgerStore.claim``)."""
        rows = self._statement(
            "UPDATE runs SET lease_owner = %s, lease_token = lease_token + 1, "
            "lease_expires_at = %s WHERE run_id = %s AND lease_token = %s RETURNING *",
            (owner, now + ttl, run_id, expected_token),
        )
        return rowmap.run(rows[0]) if rows else None

    def release(self, run_id: str, *, token: int) -> None:
        """Give the lease up; a run still to execute is announced to waiting workers."""
        self._statement(
            "WITH released AS (UPDATE runs SET lease_owner = NULL, lease_expires_at = NULL "
            "WHERE run_id = %s AND lease_token = %s RETURNING run_id, status) "
            "SELECT pg_notify(%s, run_id) FROM released WHERE status IN ('running', 'cancelling')",
            (run_id, token, CHANNEL),
        )

    def purge_expired_keys(self, *, now: float) -> int:
        """Drop bindings past retention whose step is settled, each leaving a hashed purge record
        (``purged_keys``) that ``verify`` accepts as why a sealed binding is gone."""
        with self._transaction() as conn:
            purged = conn.execute(
                "DELETE FROM operations WHERE key_expires_at < %s AND NOT EXISTS ("
                "SELECT 1 FROM steps s WHERE s.run_id = operations.run_id "
                "AND s.step_id = operations.step_id AND s.status = ANY(%s::text[])) "
                "RETURNING tenant, logical_operation_id, run_id, key_expires_at",
                (now, _UNSETTLED),
            ).fetchall()
            records_ = audit_chain.tombstones([tuple(r) for r in purged], now, self.audit_key)
            if records_:
                with conn.cursor() as cur:
                    cur.executemany(_pg(audit_chain.INSERT_TOMBSTONE), records_)
            return len(purged)

    # -- reads (the rest are ``sql_core.SQLReads``) ----------------------------------------------

    #: Rows created at the same moment are ordered by their insertion.
    _TIE = "insert_seq"

    def _read(self, sql: str, params: Sequence[Any]) -> list[Any]:
        """Run a read-only statement (the reads of ``sql_core``): one round trip."""
        return self._statement(_pg(sql), params)

    @contextmanager
    def audit_snapshot(self) -> Iterator[None]:
        """This thread's reads see one moment of the ledger until the block ends (a read-only
        REPEATABLE READ transaction): ``verify`` on a live ledger reads a run's row and its seals
        as they were together, not a seal committed in between."""
        if getattr(self._snapshot, "conn", None) is not None:
            yield
            return
        with self._pool.connection() as conn:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            self._snapshot.conn = conn
            try:
                yield
            finally:
                self._snapshot.conn = None
                conn.execute("ROLLBACK")

    def audit_stream(
        self, sql: str, params: Sequence[Any], *, size: int = 5000
    ) -> Iterator[dict[str, Any]]:
        """The rows of a read-only query, fetched ``size`` at a time (a server-side cursor), in
        this thread's snapshot: what ``verify`` reads of every seal, in bounded memory."""
        with self.audit_snapshot():
            conn: Connection = self._snapshot.conn
            with conn.cursor(name="effectflow_audit_stream", row_factory=dict_row) as cur:
                cur.itersize = size
                cur.execute(sql.replace("?", "%s"), params)
                yield from cur

    def close(self) -> None:
        """Close the pool and the listening connection (waits for a ``wait_for_work`` in progress
        to return)."""
        self._pool.close()
        with self._listen_lock:
            if self._listener is not None:
                self._listener.close()
                self._listener = None

    def __repr__(self) -> str:
        info = pg_conninfo.conninfo_to_dict(self._conninfo)
        where = f"{info.get('host', '')}:{info.get('port', '')}/{info.get('dbname', '')}"
        return f"PostgresStore({where!r}, pool_max={self.pool_max})"


#: The JSON columns migration 8 turned from jsonb into TEXT.
_JSON_COLUMNS = {
    "runs": ("input_json", "output_json", "error_json", "control_json"),
    "steps": ("output_json", "error_json"),
    "attempts": ("error_json",),
    "effects": ("evidence_json",),
}


def _canonical_json_columns(conn: Connection) -> None:
    """After migration 8: the JSON text of earlier rows is jsonb's print (spaces, its own key
    order); rewrite it as the canonical print the write path makes and digests (same values). Read
    a thousand rows at a time (a server-side cursor): a large ledger is not held in memory."""
    for table, columns in _JSON_COLUMNS.items():
        assignments = ", ".join(f"{c} = %s" for c in columns)
        with conn.cursor(name=f"effectflow_v8_{table}") as read:
            read.itersize = 1000
            read.execute(f"SELECT ctid::text, {', '.join(columns)} FROM {table}")
            while rows := read.fetchmany(1000):
                fixed = []
                for ctid, *texts in rows:
                    canonical = [
                        None if t is None else digests.canonical_json(json.loads(t)) for t in texts
                    ]
                    if canonical != texts:
                        fixed.append((*canonical, ctid))
                if fixed:
                    with conn.cursor() as cur:
                        cur.executemany(
                            f"UPDATE {table} SET {assignments} WHERE ctid = %s::tid", fixed
                        )


#: Python that a migration needs after its SQL, in its transaction.
_AFTER_MIGRATION: dict[int, Callable[[Connection], None]] = {8: _canonical_json_columns}


def migrations() -> list[tuple[int, str, str]]:
    """The packaged migrations, ``(version, name, sql)`` in order."""
    folder = resources.files("effectflow.ledger").joinpath("migrations", "postgres")
    found = []
    for entry in folder.iterdir():
        name = entry.name
        if name.endswith(".sql"):
            version = int(name.split("_", 1)[0])
            found.append((version, name.removesuffix(".sql"), entry.read_text("utf-8")))
    return sorted(found)
