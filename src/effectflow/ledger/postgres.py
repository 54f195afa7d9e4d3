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
COMMIT, and the migrations. Its statements are the named queries of
``ledger/queries/postgres.sql``; only transaction control (``BEGIN``, ``SAVEPOINT``, ``LISTEN``)
and migration 8's rewrite of every JSON column are written here.

**One round trip a batch** (issue 18). A batch is composed in this process on the run's head and
its shard's head as this process's last write left them (its events chained and its seal hashed
with the audit key, which never leaves the process), and sent as one statement:
``pg_temp.effectflow_apply`` (``queries/postgres_apply.sql``), which each pooled connection creates
in its temporary schema, so no migration ties a ledger to it. The function locks the run's row and
writes only if the lease token is current and both heads are the ones the batch was composed on;
a head that moved comes back instead, and the batch is composed on it and sent again (another
worker sealed in the shard, a person wrote to the run). A batch the function cannot take (an
expectation, a decision or an approval to check, the first seal of a shard, a refusal) is applied
statement by statement as before, which says what was refused.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import json
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from importlib import resources
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlparse, urlunparse

import psycopg
import psycopg_pool
from psycopg import conninfo as pg_conninfo
from psycopg import generators, pq
from psycopg.abc import PQGen
from psycopg.rows import TupleRow, dict_row

from effectflow import digests, errors
from effectflow.ledger import audit as audit_chain
from effectflow.ledger import queries, records, rowmap, upgrades
from effectflow.ledger.edge import ToolRaised, driver_cause, driver_errors
from effectflow.ledger.local import LocalTransaction
from effectflow.ledger.sql_core import CHANNEL, Composed, SQLCore
from effectflow.ledger.sql_reads import SQLReads
from effectflow.ledger.store import (
    Applied,
    Batch,
    parse_durability,
)

T = TypeVar("T")
Row = dict[str, Any]
Connection = psycopg.Connection[TupleRow]

#: The advisory lock migrations run under, so processes starting at once apply each one once.
_MIGRATION_LOCK = int.from_bytes(b"effmigr8", "big") >> 1
#: How long settling a lost COMMIT waits for the run's row lock (``checkpoint_committed``).
_SETTLE_LOCK_TIMEOUT = 5.0
#: SQLSTATE classes of errors that do not answer a COMMIT: connection exceptions, and operator
#: intervention (a backend told to terminate may do so right after its commit record is written).
_NO_ANSWER_CLASSES = ("08", "57")
#: Driver errors that say the server was away rather than that it refused a statement.
_TRANSIENT: tuple[type[Exception], ...] = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    psycopg_pool.PoolTimeout,
)
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
    """A statement written with ``?`` placeholders (``audit``'s reads), in psycopg's ``%s``."""
    return sql.replace("?", "%s")


#: The PostgreSQL ledger's named statements.
SQL = queries.statements("postgres")

#: The run's head: the columns a batch is composed on (``fence_run``'s RETURNING list).
_HEAD = (
    "audit_head", "audit_count", "seal_head", "seal_count", "control_json", "status",
    "output_json", "error_json", "next_action", "generation", "workflow_version", "workflow_code",
)  # fmt: skip
#: Times a batch is composed again on the head the function found before it is applied statement
#: by statement instead (another writer keeps moving the run or its shard).
_ONE_TRIP_TRIES = 3
#: Runs (and shards) whose head a store remembers from its own last write.
_HEADS_KEPT = 4096
#: SQLSTATEs the one-round-trip function refuses a batch with once it has written (the transaction
#: is rolled back; the batch is applied statement by statement, which says what was refused).
_ONE_TRIP_REFUSED = ("EF409", "EF412")
_MARK_RE = re.compile(r"@(?P<name>[a-z_]+)\((?P<param>p_[a-z_]+)\)")
_VALUES_RE = re.compile(r"VALUES\s*\([^)]*\)")


def _from_json(name: str, param: str) -> str:
    """Named query ``name`` with its VALUES read from the JSON rows in ``param`` (an array of
    objects by column), in their order, and without its RETURNING list (a function's statement
    has nowhere to return to: FOUND and ROW_COUNT say what it wrote)."""
    sql = SQL[name].split(" RETURNING ")[0].split("\nRETURNING ")[0]
    found = re.search(r"INSERT INTO (\w+) \(([^)]*)\)", sql)
    if found is None or not _VALUES_RE.search(sql):
        raise queries.QueryFileError(f"ledger/queries/postgres.sql: {name!r} is not an INSERT")
    table, columns = found.group(1), " ".join(found.group(2).split())
    rows = (
        f"SELECT {columns} FROM json_populate_recordset(NULL::{table}, {param}) "
        "WITH ORDINALITY AS batch_rows ORDER BY batch_rows.ordinality"
    )
    return _VALUES_RE.sub(lambda _: rows, sql, count=1) + ";"


@functools.cache
def apply_function() -> str:
    """The ``CREATE FUNCTION`` of the one-round-trip batch (``queries/postgres_apply.sql``, its
    ``@name(param)`` marks made the named queries' statements over the batch's JSON rows)."""
    text = resources.files("effectflow.ledger").joinpath("queries", "postgres_apply.sql")
    template = text.read_text("utf-8")
    return _MARK_RE.sub(lambda m: _from_json(m["name"], m["param"]), template)


#: The statuses of a run being executed: a batch that leaves them ends or pauses the run.
_EXECUTING = frozenset({records.RunStatus.RUNNING, records.RunStatus.CANCELLING})

#: The name each pooled connection prepares ``apply_batch`` under (``PostgresStore._configure``).
APPLY_STATEMENT = b"effectflow_apply"
#: The SQLSTATE of a prepared statement the session does not have (``invalid_sql_statement_name``).
_NO_SUCH_STATEMENT = b"26000"


def _wire(params: Sequence[Any]) -> list[bytes | None]:
    """The function's arguments as libpq's text parameters (the server casts each to the type
    of its argument, as it would a literal)."""
    return [
        None
        if value is None
        else value.encode()
        if isinstance(value, str)
        else (b"t" if value else b"f")
        if isinstance(value, bool)
        else str(value).encode()
        for value in params
    ]


def prepare_apply(conn: Connection) -> None:
    """Prepare ``apply_batch`` on ``conn`` as ``APPLY_STATEMENT``."""
    prepared = conn.wait(_prepare(conn.pgconn))
    if prepared.status != pq.ExecStatus.COMMAND_OK:
        raise psycopg.errors.error_from_result(prepared, encoding=conn.info.encoding)


def _prepare(pgconn: pq.abc.PGconn) -> PQGen[pq.abc.PGresult]:
    pgconn.send_prepare(APPLY_STATEMENT, SQL["apply_batch"].encode())
    results: list[pq.abc.PGresult] = yield from generators.execute(pgconn)
    return results[-1]


def call_apply(conn: Connection, params: Sequence[Any]) -> Any:
    """Execute the connection's prepared ``apply_batch`` with ``params``: the function's answer,
    read as JSON (None: written and committed).

    A batch is sent straight through libpq (the statement's name and its arguments' bytes), not
    through a cursor: a cursor converts the query, looks up a dumper for every argument and a
    loader for the answer each time, which cost more client CPU than the rest of the call. The
    wait is psycopg's own (``Connection.wait``): Ctrl-C cancels the statement on the server, and
    a connection that breaks raises ``OperationalError`` as any statement's would.

    psycopg deallocates every prepared statement of a session after a ``ROLLBACK`` (or a
    ``DROP``) once it has prepared statements of its own there: a statement found missing is
    prepared again and the batch sent again (the first try wrote nothing: it never ran).
    """
    wire = _wire(params)
    result = conn.wait(_execute(conn.pgconn, wire))
    if (
        result.status == pq.ExecStatus.FATAL_ERROR
        and result.error_field(pq.DiagnosticField.SQLSTATE) == _NO_SUCH_STATEMENT
    ):
        prepare_apply(conn)
        result = conn.wait(_execute(conn.pgconn, wire))
    if result.status != pq.ExecStatus.TUPLES_OK:
        raise psycopg.errors.error_from_result(result, encoding=conn.info.encoding)
    value = result.get_value(0, 0)
    return None if value is None else json.loads(value)


def _execute(pgconn: pq.abc.PGconn, wire: list[bytes | None]) -> PQGen[pq.abc.PGresult]:
    pgconn.send_query_prepared(APPLY_STATEMENT, wire)
    results: list[pq.abc.PGresult] = yield from generators.execute(pgconn)
    return results[-1]


#: The JSON the function's arguments are printed in: compact, UTF-8 kept as is, one C encoder made
#: once. NaN prints as ``NaN``, which the server refuses: the batch then goes statement by
#: statement and is refused there as it always was.
_json = digests.json_printer(sort_keys=False)


def _objects(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str | None:
    """Rows as the JSON array of objects by column the function reads (None: no rows)."""
    if not rows:
        return None
    return _json([dict(zip(columns, row, strict=True)) for row in rows])


def _plain(head: dict[str, Any]) -> dict[str, Any]:
    """A head as the server gives it back: an enum as its text (its JSON is the same)."""
    return {k: v.value if isinstance(v, enum.Enum) else v for k, v in head.items()}


_STEP_COLUMNS = [rowmap.column(f) for f in rowmap.STEP_FIELDS]
_EFFECT_COLUMNS = [rowmap.column(f) for f in rowmap.EFFECT_FIELDS]
_ATTEMPT_COLUMNS = [rowmap.column(f) for f in rowmap.ATTEMPT_FIELDS]
_AUDIT_COLUMNS = (
    "run_id", "step_id", "effect_id", "kind", "actor", "detail_json", "at", "prev_hash", "hash",
)  # fmt: skip
_SEAL_COLUMNS = (
    "run_id", "n", "rows_json", "audit_head", "audit_count", "at", "prev_hash", "hash", "shard",
    "shard_seq",
)  # fmt: skip
_NEW_RUN_COLUMNS = [*rowmap.RUN_COLUMNS, "audit_head", "audit_count"]


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


def _answered(exc: BaseException) -> bool:
    """Whether an error raised by a COMMIT is the server's answer to it (then nothing committed),
    rather than the connection going away with the answer unread."""
    exc = driver_cause(exc)
    state = exc.sqlstate if isinstance(exc, psycopg.Error) else None
    return state is not None and not state.startswith(_NO_ANSWER_CLASSES)


def _one(conn: Connection, sql: str, params: Sequence[Any] = ()) -> Row | None:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(sql, params)
        return cur.fetchone()


def _rows(conn: Connection, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> list[Row]:
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

    DIALECT = "postgres"
    SQL = SQL
    _MARK = "%s"

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
        #: PostgreSQL already flushes the WAL of concurrent commits together; grouping batches in
        #: the client on top measured slower here (BENCHMARKS.md), so it is off unless asked for.
        self.group_commit_default = False
        self._conninfo = conninfo
        named = "application_name" in pg_conninfo.conninfo_to_dict(conninfo)
        self._name: dict[str, Any] = {} if named else {"application_name": "effectflow"}
        # Connect once before the pool does, so an unreachable server fails here with libpq's own
        # message rather than as a pool timeout half a minute later.
        with self._edge():
            psycopg.connect(conninfo, **self._name).close()
        #: Whether a batch may go in one round trip (``_apply_one_trip``): False once a connection
        #: could not create the function (a role without TEMP on the database).
        self.one_trip = True
        #: The head of each run, and of each shard, as this process's last write left it: what a
        #: batch is composed on before it is sent (the function compares under the row's lock).
        self._heads: dict[str, dict[str, Any]] = {}
        self._shard_heads: dict[int, tuple[int, str]] = {}
        #: How batches went: ``one_trip`` (applied by the function), ``moved`` (composed again on
        #: the head it found), ``by_statement`` (applied statement by statement).
        self.trips: dict[str, int] = {"one_trip": 0, "moved": 0, "by_statement": 0}
        self._pool: psycopg_pool.ConnectionPool[Connection] = psycopg_pool.ConnectionPool(
            conninfo,
            min_size=1,
            max_size=pool_max,
            # Autocommit: a read or a one-statement write is one round trip; a batch opens its own
            # transaction.
            kwargs={**self._name, "autocommit": True},
            name="effectflow-ledger",
            timeout=pool_timeout,
            configure=self._configure,
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

    def _configure(self, conn: Connection) -> None:
        """A new pooled connection creates the one-round-trip function in its temporary schema
        (``apply_function``). A server that refuses it (a role without TEMP on the database, a
        read-only server) leaves this store's batches statement by statement, as before the
        function; a connection that breaks meanwhile fails as any other (the pool makes another).
        """
        if not self.one_trip:
            return
        try:
            conn.execute(apply_function())
            prepare_apply(conn)
        except psycopg.Error as exc:
            if not _answered(exc):
                raise
            self.one_trip = False

    def _edge(self) -> contextlib.AbstractContextManager[None]:
        """Where psycopg's exceptions become the ledger's: a restarted server, a cut connection, a
        pool with no connection to give are ``LedgerUnavailable``, worth retrying (the pool drops a
        broken connection, so a retry gets a fresh one); any other is ``LedgerError``."""
        return driver_errors(redacted(self.url), _TRANSIENT, psycopg.Error)

    def bound_waits(self, seconds: float) -> None:
        """A call waits for a pooled connection at most ``seconds`` (and never past
        ``pool_timeout``)."""
        self._pool.timeout = max(0.1, min(self.pool_timeout, seconds))

    # -- schema ---------------------------------------------------------------------------------

    def _migrations(self) -> list[tuple[int, str, str]]:
        return migrations()

    def _lock_migrations(self, conn: Connection) -> None:
        """An advisory lock for the transaction: processes starting at once wait for it."""
        conn.execute(SQL["migration_lock"], (_MIGRATION_LOCK,))

    def _run_script(self, conn: Connection, sql: str) -> None:
        """The whole script at once (no parameters: psycopg sends it as it is); a script of
        comments only (version 9's work is Python) sends nothing."""
        if upgrades.has_statements(sql):
            conn.execute(sql)

    def _describe(self) -> str:
        return "this PostgreSQL ledger"

    def _after_migration(self, conn: Connection, version: int) -> None:
        """PostgreSQL's own Python steps (version 8: jsonb's print as canonical text), then the
        shared ones."""
        if version in upgrades.POSTGRES_AFTER:
            upgrades.POSTGRES_AFTER[version](conn)
        super()._after_migration(conn, version)

    def schema_version(self) -> int:
        """The newest migration applied to this database."""
        rows = self._statement(SQL["schema_version"])
        return int(rows[0]["max"] or 0) if rows else 0

    @contextmanager
    def _transaction(self) -> Iterator[Connection]:
        """A transaction on a pooled connection, one statement after the other."""
        with self._edge(), self._pool.connection() as conn, conn.transaction():
            yield conn

    @contextmanager
    def _batch(self, *, deferrable: bool = False, rides: bool = False) -> Iterator[Connection]:
        """A pipelined transaction: a statement whose result is not read travels with the next
        one that is, or with the COMMIT. Applying a batch costs two round trips (the fence, the
        commit) and one per operation binding, instead of one per statement.

        BEGIN and COMMIT are plain statements here because psycopg's transaction blocks sync the
        pipeline on their own; on an error the pool's connection block rolls back.
        """
        with self._edge(), self._pool.connection() as conn, _pipeline(conn):
            conn.execute("BEGIN")
            if rides or (deferrable and self.durability == "intents"):
                conn.execute(SQL["async_commit"])
            yield conn
            conn.execute("COMMIT")

    def _statement(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> list[Row]:
        """One statement in its own (implicit) transaction: one round trip (or in this thread's
        ``audit_snapshot``)."""
        snapshot: Connection | None = getattr(self._snapshot, "conn", None)
        with self._edge():
            if snapshot is not None:
                return _rows(snapshot, sql, params)
            with self._pool.connection() as conn:
                return _rows(conn, sql, params)

    # -- writes ---------------------------------------------------------------------------------

    def apply(self, batch: Batch, *, lease_ttl: float, now: float) -> dict[str, Any] | None:
        """Commit one batch in one transaction, in one round trip when it can
        (``_apply_one_trip``); otherwise statement by statement (``SQLCore.apply``)."""
        if self.one_trip and not (batch.expectations or batch.decisions or batch.approvals):
            done = self._apply_one_trip(batch, lease_ttl=lease_ttl, now=now)
            if done is not None:
                return done[0]
        self.trips["by_statement"] += 1
        self._heads.pop(batch.run_id, None)
        return super().apply(batch, lease_ttl=lease_ttl, now=now)

    def apply_many(
        self, batches: Sequence[Batch], *, lease_ttl: float, now: float
    ) -> list[Applied]:
        """Group commit (``SQLCore.apply_many``); the heads remembered for its runs are dropped."""
        for batch in batches:
            self._heads.pop(batch.run_id, None)
        return super().apply_many(batches, lease_ttl=lease_ttl, now=now)

    def _apply_one_trip(
        self, batch: Batch, *, lease_ttl: float, now: float
    ) -> tuple[dict[str, Any] | None] | None:
        """The batch composed on the run's head this process expects, and sent whole: one
        statement, the function (``queries/postgres_apply.sql``), in a transaction of its own.

        The function locks the run's row and checks the lease token and the heads the batch was
        composed on before it writes. A head that moved comes back instead (nothing written), and
        the batch is composed on it and sent again. Returns the run's control request (in a
        1-tuple), or None: apply it statement by statement (the head keeps moving, the batch opens
        a shard's chain, or it was refused: the statements say why, as they always have).
        """
        run_id = batch.run_id
        shard = audit_chain.shard_of(run_id)
        head = self._new_head(batch) if batch.new_run is not None else self._heads.get(run_id)
        shard_head = self._shard_heads.get(shard)
        with self._edge():
            # The pool's own checkout, without ``connection()``'s ``with conn`` (whose COMMIT of
            # an autocommit connection is a no-op that still costs a wait): an error leaves the
            # connection idle or broken, and ``putconn`` drops a broken one.
            conn = self._pool.getconn()
            try:
                return self._one_trip_on(conn, batch, head, shard, shard_head, lease_ttl, now)
            finally:
                self._pool.putconn(conn)

    def _one_trip_on(
        self,
        conn: Connection,
        batch: Batch,
        head: dict[str, Any] | None,
        shard: int,
        shard_head: tuple[int, str] | None,
        lease_ttl: float,
        now: float,
    ) -> tuple[dict[str, Any] | None] | None:
        """``_apply_one_trip`` on a connection of the pool's."""
        run_id = batch.run_id
        composed: Composed | None = None
        composed_on: dict[str, Any] | None = None
        for _ in range(_ONE_TRIP_TRIES):
            if head is not None and head != composed_on:
                composed, composed_on = self._compose(batch, head, now=now), head
            params, shard_after = self._one_trip_params(
                batch, head, composed, shard, shard_head, lease_ttl=lease_ttl, now=now
            )
            try:
                # One statement in its own transaction (the connection is in autocommit): it
                # commits when the function returns, and writes nothing if it raises.
                answer = call_apply(conn, params)
            except psycopg.Error as exc:
                if not _answered(exc):
                    raise  # the connection went away: as a COMMIT that got no answer
                if isinstance(exc, psycopg.errors.UndefinedFunction):
                    # The session lost its function (a pooler in front of the server hands
                    # sessions around): no more one-trip batches from this store.
                    self.one_trip = False
                return None
            if answer is None and head is not None and composed is not None:
                self.trips["one_trip"] += 1
                self._remember(run_id, head, composed, shard, shard_after)
                return (composed.control,)
            if answer is None or "moved" not in answer:
                return None  # refused (the lease, the run's id): the statements say so
            self.trips["moved"] += 1
            if answer["moved"] is None and batch.new_run is None:
                return None  # no such run: the statements say so (RunNotFound)
            if answer["moved"] is not None:
                head = answer["moved"]  # (a new run keeps the head its insert gives it)
            found = answer["shard"]
            shard_head = None if found is None else (int(found[0]), str(found[1]))
            if shard_head is None or shard_head[0] == 0:
                return None  # the shard's first seal also moves the index row
        return None

    def _new_head(self, batch: Batch) -> dict[str, Any]:
        """The head a new run's row has once inserted (``insert_run``'s RETURNING list)."""
        assert batch.new_run is not None
        row = rowmap.row_values(batch.new_run, rowmap.RUN_FIELDS)
        values = dict(zip(rowmap.RUN_COLUMNS, row, strict=True))
        values.update(
            audit_head=audit_chain.genesis(batch.run_id),
            audit_count=0,
            seal_head=None,
            seal_count=0,
        )
        return _plain({k: values[k] for k in _HEAD})

    def _one_trip_params(
        self,
        batch: Batch,
        head: dict[str, Any] | None,
        composed: Composed | None,
        shard: int,
        shard_head: tuple[int, str] | None,
        *,
        lease_ttl: float,
        now: float,
    ) -> tuple[list[Any], tuple[int, str] | None]:
        """The function's arguments (``apply_batch``; without a head, only what finds it), and the
        shard's head once the batch's seal is chained into it."""
        fenced = batch.lease_token is not None
        if head is None or composed is None:
            return [
                batch.run_id,
                batch.lease_token,
                *([None] * 9),
                shard,
                *([None] * 4),
                False,
            ], None
        new_run = None
        if batch.new_run is not None:
            values = rowmap.row_values(batch.new_run, rowmap.RUN_FIELDS)
            new_run = _objects(_NEW_RUN_COLUMNS, [[*values, audit_chain.genesis(batch.run_id), 0]])
        operations = _objects(
            rowmap.OPERATION_FIELDS,
            [rowmap.row_values(op, rowmap.OPERATION_FIELDS) for op in batch.operations],
        )
        changes = {rowmap.column(k): rowmap.value(k, v) for k, v in composed.changes.items()}
        if fenced and batch.renews_lease and "lease_expires_at" not in changes:
            # The function moves the lease forward only (``GREATEST``): a heartbeat that read a
            # later clock may have renewed it already. A batch's own change to it is kept as is.
            changes = {"lease_renewed_to": now + lease_ttl, **changes}
        seal = shard_n = shard_prev = shard_new = None
        shard_after = None
        if composed.seal is not None and shard_head is not None:
            rows, moved = audit_chain.chain_shards(
                [composed.seal], {shard: shard_head}, self.audit_key
            )
            seal = _objects(_SEAL_COLUMNS, rows)
            shard_n, shard_prev, shard_new = shard_head[0], shard_head[1], moved[0][1]
            shard_after = (moved[0][0], moved[0][1])
        elif composed.seal is not None:
            seal = "[]"  # the shard's head is not known: the function answers with it
        notify = batch.new_run is not None or "status" in changes or "lease_owner" in changes
        params: list[Any] = [
            batch.run_id,
            batch.lease_token,
            _json(head),
            new_run,
            operations,
            _objects(_STEP_COLUMNS, composed.written.get("steps", ())),
            _objects(_EFFECT_COLUMNS, composed.written.get("effects", ())),
            _objects(_ATTEMPT_COLUMNS, composed.written.get("attempts", ())),
            _objects(_AUDIT_COLUMNS, composed.events),
            _json(changes) if changes else None,
            seal,
            shard,
            shard_n,
            shard_prev,
            shard_new,
            CHANNEL if notify else None,
            batch.rides or (batch.deferrable and self.durability == "intents"),
        ]
        return params, shard_after

    def _remember(
        self,
        run_id: str,
        head: dict[str, Any],
        composed: Composed,
        shard: int,
        shard_after: tuple[int, str] | None,
    ) -> None:
        """The run's head (and its shard's) as the batch just committed left them; a run that
        the batch ended or paused is forgotten (it is rarely written again, and its head would
        hold up to ``_HEADS_KEPT`` finished runs in memory: a later write of it costs one more
        trip, to learn the head)."""
        if shard_after is not None:
            self._remember_shard(shard, shard_after)
        status = composed.changes.get("status")
        if status is not None and status not in _EXECUTING:
            self._heads.pop(run_id, None)
            return
        after = dict(head)
        for field, value in composed.changes.items():
            column = rowmap.column(field)
            if column in after:
                after[column] = rowmap.value(field, value)
        if len(self._heads) >= _HEADS_KEPT:
            # The oldest goes (another thread may be changing the dict: then nothing does).
            with contextlib.suppress(StopIteration, RuntimeError):
                self._heads.pop(next(iter(self._heads)), None)
        self._heads[run_id] = _plain(after)

    def _remember_shard(self, shard: int, head: tuple[int, str]) -> None:
        """A shard's head after a write of this process (never an older one over a newer)."""
        known = self._shard_heads.get(shard)
        if known is None or known[0] < head[0]:
            self._shard_heads[shard] = head

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
                try:
                    value = work(tx)
                except Exception as exc:
                    raise ToolRaised(exc) from exc  # the tool's own, not the ledger's
                batch = finish(value)
                with _pipeline(conn):
                    control, seal = self._apply_txn(conn, batch, lease_ttl=lease_ttl, now=now)
                    self._seal_txn(conn, [seal] if seal else [])
                written = True  # from here on, only the COMMIT can fail
        except Exception as exc:
            if batch is None or not written:
                raise
            cause = driver_cause(exc)
            if _answered(exc):
                # The server refused the COMMIT (a deferred constraint of the tool's own writes):
                # nothing committed, and the refusal is the transaction's, as the tool's errors are.
                raise cause from cause.__cause__
            raise errors.CommitInDoubt(
                f"run {batch.run_id}: the COMMIT of a local transaction got no answer "
                f"({' '.join(str(cause).split())}); it may have committed",
                run_id=batch.run_id,
            ) from cause
        return value, control

    def checkpoint_committed(self, run_id: str, attempt_id: str) -> bool:
        """Read the checkpoint's attempt row on a new connection, after the run's row lock (see
        ``LedgerStore.checkpoint_committed``)."""
        with (
            self._edge(),
            psycopg.connect(self._conninfo, connect_timeout=10, **self._name) as conn,
        ):
            try:
                conn.execute(SQL["settle_lock_timeout"], (f"{int(_SETTLE_LOCK_TIMEOUT * 1000)}ms",))
                conn.execute(SQL["settle_lock_run"], (run_id,))
            except psycopg.errors.LockNotAvailable as exc:
                raise errors.CommitInDoubt(
                    f"run {run_id}: a transaction holding the run stayed open for "
                    f"{_SETTLE_LOCK_TIMEOUT:g} s; the local transaction of attempt {attempt_id} "
                    "may still commit",
                    run_id=run_id,
                ) from exc
            row = conn.execute(SQL["checkpoint_outcome"], (run_id, attempt_id)).fetchone()
            conn.rollback()
        return row is not None and row[0] == records.Outcome.COMMITTED.value

    def _seal_txn(self, conn: Connection, seals: list[list[Any]]) -> None:
        """Append the transaction's seals, each chained into its shard (see ``audit``). Last in the
        transaction, shards locked in one order: a transaction holding a shard waits for nothing
        but its COMMIT, so shards never deadlock with run rows or with each other."""
        if not seals:
            return
        shards = audit_chain.shards_of(seals)
        locked = _rows(conn, SQL["read_shards"], (shards,))
        heads = audit_chain.shard_heads_read(
            shards, [(r["shard"], r["n"], r["head"]) for r in locked]
        )
        rows, moved = audit_chain.chain_shards(seals, heads, self.audit_key)
        for n, head, shard in moved:
            # What the next batch of one of these runs is composed on (if this one commits; if
            # not, the function finds the shard's head and says so).
            self._remember_shard(shard, (n, head))
        if audit_chain.first_uses(heads, shards):
            _rows(conn, SQL["lock_index"], (audit_chain.INDEX,))
            used = _rows(conn, SQL["used_shards"], (audit_chain.INDEX,))
            moved.append(
                audit_chain.index_row([*(r["shard"] for r in used), *shards], self.audit_key)
            )
        with conn.cursor() as cur:
            cur.executemany(SQL["insert_seal"], rows)
            cur.executemany(SQL["update_shard"], moved)

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
                SQL["heartbeat"], ([r for r, _ in leases], [t for _, t in leases], now + ttl)
            )
        }
        return [run_id for run_id, token in leases if (run_id, token) not in held]

    def wait_for_work(self, timeout: float) -> bool:
        """Block until a transaction notifies that a run is waiting for a worker, or ``timeout``.

        The first call opens the listening connection; a notification sent while nobody waits is
        kept and wakes the next wait at once. One thread waits at a time; another returns after
        its timeout at the latest. True when a notification came (or the listening connection
        broke: look for work), False after a quiet ``timeout``.
        """
        timeout = max(0.0, timeout)
        if not self._listen_lock.acquire(timeout=timeout):
            return False
        try:
            if self._listener is None:
                with self._edge():
                    listener = psycopg.connect(self._conninfo, autocommit=True, **self._name)
                    try:
                        listener.execute(f"LISTEN {CHANNEL}")
                    except BaseException:
                        listener.close()
                        raise
                self._listener = listener
            try:
                woke = False
                for _ in self._listener.notifies(timeout=timeout, stop_after=1):
                    woke = True
                # A burst (a batch of new runs) is one wake-up, not one per run.
                for _ in self._listener.notifies(timeout=0, stop_after=1000):
                    pass
                return woke
            except psycopg.OperationalError:
                # The server went away: the next wait connects again; until then a worker that
                # looks for work finds out for itself.
                self._listener.close()
                self._listener = None
                return True
        finally:
            self._listen_lock.release()

    # -- the shared write path's hooks (``sql_core``) -------------------------------------------

    def _one(self, conn: Connection, sql: str, params: Sequence[Any]) -> Row | None:
        """Run ``sql`` and read its first row: a round trip (the pipeline syncs)."""
        return _one(conn, sql, params)

    def _exec(self, conn: Connection, sql: str, params: Sequence[Any]) -> None:
        """Queue ``sql``: in the pipeline it travels with the next statement that is read."""
        conn.execute(sql, params)

    def _many(self, conn: Connection, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Queue ``sql`` once per row."""
        with conn.cursor() as cur:
            cur.executemany(sql, rows)

    def _rows(self, conn: Connection, sql: str, params: Sequence[Any]) -> list[Row]:
        """Run ``sql`` and read all its rows."""
        return _rows(conn, sql, params)

    #: Runs are locked in run-id order (as heartbeats lock them), so two group transactions
    #: sharing runs cannot deadlock.
    _ORDER_BY_RUN = True
    #: Runs created at the same moment are claimed in their insertion order.
    _TIE_COLUMNS = ("insert_seq",)

    def _batch_txn(
        self, *, deferrable: bool = False
    ) -> contextlib.AbstractContextManager[Connection]:
        """A pipelined transaction (see ``_batch``)."""
        return self._batch(deferrable=deferrable)

    def _riding_txn(self) -> contextlib.AbstractContextManager[Connection]:
        """A run's start that rides its next flushed commit (``Batch.rides``): committed
        asynchronously, as ``durability=intents`` commits an outcome. The server's WAL is one
        sequence, so the run's next synchronous commit (an intent before any call, a pause, its
        end) flushes the start with it."""
        return self._batch(rides=True)

    def _plain_txn(self) -> contextlib.AbstractContextManager[Connection]:
        """A transaction whose statements run one by one."""
        return self._transaction()

    def _write_rows(self, sql: str, params: Sequence[Any] | Mapping[str, Any]) -> list[Row]:
        """One statement in its own (implicit) transaction: one round trip."""
        return self._statement(sql, params)

    def _in_named(
        self, column: str, name: str, values: Sequence[Any]
    ) -> tuple[str, dict[str, Any]]:
        """``column = ANY(%(name)s)``: one array parameter."""
        return f"{column} = ANY(%({name})s::text[])", {name: list(values)}

    def _rollback_savepoint(self, conn: Connection) -> None:
        """Undo one refused batch of a group. A nested pipeline block syncs when it ends, so
        psycopg reads the ROLLBACK's result now: reading it, psycopg forgets the statements it
        prepared (and deallocates them). Read later, after the next batch's statements were queued
        under those names, they would fail with "prepared statement does not exist"."""
        with conn.pipeline():
            conn.execute("ROLLBACK TO SAVEPOINT batch")

    def _wrote(self, conn: Connection, batch: Batch, changes: dict[str, Any]) -> None:
        """A run created for workers, or handed back to them, wakes the ones waiting."""
        if batch.new_run is not None or "status" in changes or "lease_owner" in changes:
            conn.execute(SQL["notify_runnable"], (CHANNEL, batch.run_id))

    # -- reads (the rest are ``sql_reads.SQLReads``) ---------------------------------------------

    def _read(self, sql: str, params: Sequence[Any]) -> list[Any]:
        """Run a read-only statement (the reads of ``sql_core``): one round trip."""
        return self._statement(sql, params)

    def _in(self, column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
        """``column = ANY(%s)``: one array parameter, one statement text for any length."""
        return f"{column} = ANY(%s::text[])", [list(values)]

    def _qmark(self, sql: str) -> str:
        """``audit``'s ``?`` placeholders as psycopg's ``%s``."""
        return _pg(sql)

    @contextmanager
    def audit_snapshot(self) -> Iterator[None]:
        """This thread's reads see one moment of the ledger until the block ends (a read-only
        REPEATABLE READ transaction): ``verify`` on a live ledger reads a run's row and its seals
        as they were together, not a seal committed in between."""
        if getattr(self._snapshot, "conn", None) is not None:
            yield
            return
        with self._edge(), self._pool.connection() as conn:
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
        with self.audit_snapshot(), self._edge():
            conn: Connection = self._snapshot.conn
            with conn.cursor(name="effectflow_audit_stream", row_factory=dict_row) as cur:
                cur.itersize = size
                cur.execute(_pg(sql), params)
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


def migrations() -> list[tuple[int, str, str]]:
    """The packaged migrations, ``(version, name, sql)`` in order."""
    return upgrades.packaged("postgres")
