"""Shared machinery of the simulated providers: errors, durable fault rules, the call log.

The simulated providers stand for "the outside world". Their state lives in their own SQLite
file, never in the runtime's ledger, so that a test can kill the calling process at any instant
and afterwards read the provider's file as the truth of what happened. For the same reason this
package imports nothing from effectflow outside ``effectflow.testing``.

Exception tree::

    Exception
    ├── ProviderError               .code (stable snake_case), .status (HTTP-like)
    │   ├── ProviderUnavailable     503, nothing committed
    │   ├── ProviderRejected        4xx validation failure, nothing committed
    │   └── IdempotencyKeyReused    422, same key with a different payload, nothing committed
    └── TimeoutError
        └── ProviderTimeout         no answer in time: the provider MAY have committed
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal, Self, get_args

FaultKind = Literal["lose_response", "fail_before_commit", "timeout_before_commit", "reject"]
"""What an injected fault does to one call.

- ``lose_response``: the effect commits, then the caller gets :class:`ProviderTimeout` (the
  response was lost on the way back, as when a load balancer drops a slow connection).
- ``fail_before_commit``: :class:`ProviderUnavailable`, nothing committed (a 503 at the edge).
- ``timeout_before_commit``: :class:`ProviderTimeout` and nothing committed; the caller cannot
  tell this from ``lose_response``, which is the whole point.
- ``reject``: :class:`ProviderRejected`, nothing committed.
"""

FAULT_KINDS: frozenset[str] = frozenset(get_args(FaultKind))

#: How long a call waits for another process's write transaction before giving up.
BUSY_TIMEOUT_S = 10.0


class ProviderError(Exception):
    """A definite answer from the provider saying the call did not take effect.

    Attributes:
        code: Stable snake_case error code, the kind a real API puts in its error body.
        status: The HTTP status a real API would have answered with.
    """

    def __init__(self, message: str, *, code: str, status: int) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


class ProviderUnavailable(ProviderError):
    """The provider refused the call before doing anything (a 503): safe to retry."""

    def __init__(self, message: str = "provider unavailable", *, operation: str = "") -> None:
        super().__init__(message, code="unavailable", status=503)
        self.operation = operation


class ProviderRejected(ProviderError):
    """The provider validated the request and said no; nothing was committed."""

    def __init__(self, message: str, *, code: str, status: int = 422) -> None:
        super().__init__(message, code=code, status=status)


class IdempotencyKeyReused(ProviderError):
    """The key was already used for a different payload (Stripe answers this with a 4xx).

    Real providers refuse rather than replay, because replaying the first response would hide a
    bug in how the caller derives keys.
    """

    def __init__(self, idempotency_key: str) -> None:
        super().__init__(
            f"idempotency key {idempotency_key!r} was already used with a different payload",
            code="idempotency_key_reused",
            status=422,
        )
        self.idempotency_key = idempotency_key


class DeadlineExceeded(ProviderError):
    """The request arrived after the deadline its caller gave it; nothing was committed.

    Deadline propagation (as gRPC does) is what lets a caller that gave up on a call - or a worker
    that lost its lease - know that the call can no longer land later: the provider refuses it.
    """

    def __init__(self, operation: str, deadline: float) -> None:
        super().__init__(
            f"{operation}: arrived after its deadline ({iso(deadline)}); nothing was done",
            code="deadline_exceeded",
            status=504,
        )
        self.operation = operation
        self.deadline = deadline


#: The deadline (epoch seconds) of the calls made in this context; None = no deadline.
REQUEST_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "effectflow_request_deadline", default=None
)


@contextmanager
def deadline(at: float | None) -> Iterator[None]:
    """Give the provider calls made inside the block a deadline: a call the provider handles after
    it is refused with :class:`DeadlineExceeded` and commits nothing (HTTP clients send it as the
    ``X-Request-Deadline`` header)."""
    token = REQUEST_DEADLINE.set(at)
    try:
        yield
    finally:
        REQUEST_DEADLINE.reset(token)


class ProviderTimeout(TimeoutError):
    """The caller got no answer in time. The provider may or may not have committed.

    Deliberately not a :class:`ProviderError`: a ProviderError is a definite "did not happen",
    a timeout is "unknown", and code that lumps the two together is the bug this library exists
    to prevent.
    """

    code = "timeout"

    def __init__(self, operation: str, *, key: str | None = None) -> None:
        super().__init__(f"{operation}: no response from provider (outcome unknown)")
        self.operation = operation
        self.key = key


def iso(ts: float) -> str:
    """Render an epoch timestamp as an ISO-8601 UTC string, as APIs return them."""
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="microseconds")


def digest(payload: dict[str, Any]) -> str:
    """The sha256 of a payload's canonical JSON: what providers compare under one key."""
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def parse_id(prefix: str, value: str) -> int | None:
    """Turn ``msg_12`` into 12, or None when the id is not one of ours."""
    head, sep, tail = value.partition("_")
    if not sep or head != prefix or not tail.isdigit():
        return None
    return int(tail)


Effect = Callable[[sqlite3.Connection, float], tuple[dict[str, Any], str]]
"""One operation's work inside the provider's transaction: ``(conn, now) -> (response, outcome)``.

``outcome`` goes to the call log (``"ok"``, ``"replayed"``); a :class:`ProviderError` raised
from it is rolled back to a savepoint and logged with its code.
"""

_COMMON_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS provider_faults (
        rule_id INTEGER PRIMARY KEY AUTOINCREMENT,
        provider TEXT NOT NULL,
        operation TEXT NOT NULL,
        fault TEXT NOT NULL,
        skip_remaining INTEGER NOT NULL,
        times_remaining INTEGER NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS provider_calls (
        call_id INTEGER PRIMARY KEY AUTOINCREMENT,
        provider TEXT NOT NULL,
        operation TEXT NOT NULL,
        at_ts REAL NOT NULL,
        fault TEXT,
        call_key TEXT,
        outcome TEXT NOT NULL
    )""",
)


class SqliteProvider:
    """Base of every simulated provider: one SQLite file, one connection per object.

    Every write runs in ``BEGIN IMMEDIATE`` with ``synchronous=FULL`` in WAL mode, so once a
    call returns (or loses its response after committing) the effect survives a SIGKILL of the
    calling process, and several processes can share one file without consuming the same fault
    rule twice.
    """

    #: Short name stored with fault rules and calls, so providers can share one file.
    KIND: ClassVar[str] = ""
    #: Method names that take part in fault injection and the call log.
    OPERATIONS: ClassVar[frozenset[str]] = frozenset()
    #: The provider's own tables, created if missing.
    SCHEMA: ClassVar[tuple[str, ...]] = ()

    def __init__(self, path: str | os.PathLike[str], *, clock: Callable[[], float]) -> None:
        self.path = os.fspath(path)
        self._clock = clock
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        conn = sqlite3.connect(
            self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        try:
            self._configure(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def _configure(self, conn: sqlite3.Connection) -> None:
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        # Switching to WAL needs a moment of exclusive access and may answer SQLITE_BUSY without
        # consulting the busy handler when another process is opening the file at the same time.
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            try:
                conn.execute("PRAGMA journal_mode = WAL")
                break
            except sqlite3.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        conn.execute("PRAGMA synchronous = FULL")
        with self._transaction(conn):
            for statement in (*_COMMON_SCHEMA, *self.SCHEMA):
                conn.execute(statement)

    @staticmethod
    @contextmanager
    def _transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    @contextmanager
    def _locked(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._conn is None:
                raise RuntimeError(f"{type(self).__name__} is closed")
            yield self._conn

    def _now(self) -> float:
        return float(self._clock())

    # -- the call path -------------------------------------------------------------------------

    def _call(self, operation: str, key: str | None, effect: Effect) -> dict[str, Any]:
        """Run one operation: consume a fault rule, do the effect, log the call, all atomically.

        The fault rule, the effect and the call-log row commit in one transaction, so a rule is
        consumed exactly once even when several processes call the same file at once.
        """
        due = REQUEST_DEADLINE.get()
        with self._locked() as conn:
            now = self._now()
            response: dict[str, Any] | None = None
            error: ProviderError | None = None
            with self._transaction(conn):
                if due is not None and now > due:
                    self._log_call_txn(conn, operation, now, None, key, "deadline_exceeded")
                    fault: FaultKind | None = None
                    error = DeadlineExceeded(operation, due)
                    outcome = "deadline_exceeded"
                else:
                    fault = self._take_fault_txn(conn, operation)
                    if fault is None or fault == "lose_response":
                        conn.execute("SAVEPOINT effect")
                        try:
                            response, outcome = effect(conn, now)
                        except ProviderError as exc:
                            conn.execute("ROLLBACK TO effect")
                            error, outcome = exc, exc.code
                        conn.execute("RELEASE effect")
                    else:
                        outcome = "not_committed"
                    self._log_call_txn(conn, operation, now, fault, key, outcome)
        if fault == "lose_response":
            # Whatever the provider answered, success or error, never reaches the caller.
            raise ProviderTimeout(operation, key=key) from error
        if fault == "timeout_before_commit":
            raise ProviderTimeout(operation, key=key)
        if fault == "fail_before_commit":
            raise ProviderUnavailable(f"{operation}: provider unavailable", operation=operation)
        if fault == "reject":
            raise ProviderRejected(f"{operation}: rejected by provider", code="rejected")
        if error is not None:
            raise error
        assert response is not None
        return response

    def _take_fault_txn(self, conn: sqlite3.Connection, operation: str) -> FaultKind | None:
        """Count this call against every pending rule and return the fault to apply, if any.

        Rules apply oldest first. A rule still skipping (``after``) counts the call as skipped
        even when an older rule's fault applies to it: ``after`` counts calls, not quiet calls.
        """
        rows = conn.execute(
            "SELECT rule_id, fault, skip_remaining FROM provider_faults"
            " WHERE provider = ? AND operation = ? AND times_remaining > 0 ORDER BY rule_id",
            (self.KIND, operation),
        ).fetchall()
        applied: FaultKind | None = None
        for rule_id, fault, skip_remaining in rows:
            if int(skip_remaining) > 0:
                conn.execute(
                    "UPDATE provider_faults SET skip_remaining = skip_remaining - 1"
                    " WHERE rule_id = ?",
                    (rule_id,),
                )
            elif applied is None:
                applied = _as_fault(str(fault))
                conn.execute(
                    "UPDATE provider_faults SET times_remaining = times_remaining - 1"
                    " WHERE rule_id = ?",
                    (rule_id,),
                )
        conn.execute("DELETE FROM provider_faults WHERE times_remaining <= 0")
        return applied

    def _log_call_txn(
        self,
        conn: sqlite3.Connection,
        operation: str,
        now: float,
        fault: FaultKind | None,
        key: str | None,
        outcome: str,
    ) -> None:
        conn.execute(
            "INSERT INTO provider_calls (provider, operation, at_ts, fault, call_key, outcome)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (self.KIND, operation, now, fault, key, outcome),
        )

    # -- fault rules and the call log ------------------------------------------------------------

    def inject(self, operation: str, fault: FaultKind, *, times: int = 1, after: int = 0) -> None:
        """Persist a fault rule in the provider's file.

        The rule lives in the file rather than in this object so that a fault configured by a
        test applies to calls made by a worker subprocess that opens the same file.

        Args:
            operation: The method name the rule applies to (``"send"``, ``"upsert_task"``...).
            fault: What happens to the matching calls.
            times: How many calls get the fault once the skipping is done.
            after: How many matching calls pass untouched first.

        Raises:
            ValueError: Unknown operation or fault, ``times < 1`` or ``after < 0``.
        """
        if operation not in self.OPERATIONS:
            known = ", ".join(sorted(self.OPERATIONS))
            raise ValueError(f"unknown operation {operation!r} (known: {known})")
        if fault not in FAULT_KINDS:
            raise ValueError(f"unknown fault {fault!r} (known: {', '.join(sorted(FAULT_KINDS))})")
        if times < 1 or after < 0:
            raise ValueError("times must be >= 1 and after >= 0")
        with self._locked() as conn, self._transaction(conn):
            conn.execute(
                "INSERT INTO provider_faults"
                " (provider, operation, fault, skip_remaining, times_remaining)"
                " VALUES (?, ?, ?, ?, ?)",
                (self.KIND, operation, fault, after, times),
            )

    def clear_faults(self) -> None:
        """Remove every pending fault rule of this provider kind from the file."""
        with self._locked() as conn, self._transaction(conn):
            conn.execute("DELETE FROM provider_faults WHERE provider = ?", (self.KIND,))

    def calls(self, operation: str | None = None) -> list[dict[str, Any]]:
        """Every call the provider received, oldest first, from any process.

        Each entry has ``call_id``, ``operation``, ``at`` (ISO-8601), ``fault`` (the injected
        fault applied, or None), ``key`` (the idempotency key or client tag, or None) and
        ``outcome`` (``"ok"``, ``"replayed"``, ``"not_committed"`` or an error code).
        """
        sql = (
            "SELECT call_id, operation, at_ts, fault, call_key, outcome FROM provider_calls"
            " WHERE provider = ?"
        )
        params: tuple[str, ...] = (self.KIND,)
        if operation is not None:
            sql += " AND operation = ?"
            params += (operation,)
        with self._locked() as conn:
            rows = conn.execute(sql + " ORDER BY call_id", params).fetchall()
        return [
            {
                "call_id": int(call_id),
                "operation": str(op),
                "at": iso(float(at_ts)),
                "fault": fault,
                "key": call_key,
                "outcome": str(outcome),
            }
            for call_id, op, at_ts, fault, call_key, outcome in rows
        ]

    def close(self) -> None:
        """Close the connection; calling it again is harmless."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _as_fault(value: str) -> FaultKind:
    if value == "lose_response":
        return "lose_response"
    if value == "fail_before_commit":
        return "fail_before_commit"
    if value == "timeout_before_commit":
        return "timeout_before_commit"
    if value == "reject":
        return "reject"
    raise ValueError(f"corrupt fault rule: {value!r}")
