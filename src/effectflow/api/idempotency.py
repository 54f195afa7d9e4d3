"""Idempotent actions: an ``Idempotency-Key`` names one request; its replay gets the first answer.

The key → response table lives in a small SQLite file the API owns (the ledger's schema belongs to
the ledger package, whose migrations the API does not extend). By default the file sits next to a
SQLite ledger (``<ledger>.api-requests.db``); for a PostgreSQL ledger it is a local file, so keys
are shared by the API processes of one host, not across hosts.

That limit is narrower than it looks, because the ledger is idempotent on its own: a resolve carries
a ``decision_id`` and an approval an ``approval_id`` derived from the key (unless the client gives
its own), which the ledger pins; cancel, compensate and resume of a run already so return the run as
it is. So a replay that misses this table (another host, or a crash between the action and the
write of its answer) never makes a second decision or a second effect; it may answer with the
current state instead of the byte-identical first answer.

Rows: ``pending`` while the first request runs (a concurrent duplicate answers 409
``request_in_progress``; a pending row older than ``pending_ttl`` is taken over, its process having
died), then ``done`` with the status, media type and body. Answers of 5xx are not kept: the key is
released so the client may retry. Rows are dropped after ``retention`` seconds.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

_SCHEMA = """
CREATE TABLE IF NOT EXISTS api_requests (
    tenant TEXT NOT NULL,
    key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    state TEXT NOT NULL,
    status INTEGER,
    media_type TEXT,
    body BLOB,
    created_at REAL NOT NULL,
    PRIMARY KEY (tenant, key)
)
"""


@dataclasses.dataclass(frozen=True)
class Stored:
    """A response kept for replay."""

    #: The HTTP status.
    status: int
    #: Its media type.
    media_type: str
    #: The body, byte for byte.
    body: bytes


@dataclasses.dataclass(frozen=True)
class Claim:
    """What ``begin`` found: exactly one of the flags is set, or ``stored`` is."""

    #: This request owns the key now: run the action, then ``finish`` or ``release``.
    fresh: bool = False
    #: The key was used for another request (other method, path or body).
    mismatch: bool = False
    #: The same request is being processed right now.
    in_progress: bool = False
    #: The answer to replay.
    stored: Stored | None = None


class RequestKeys:
    """The key → response table in one SQLite file. Thread-safe: one connection behind a lock."""

    def __init__(
        self,
        path: str,
        *,
        retention: float = 24 * 3600.0,
        pending_ttl: float = 600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        #: The file.
        self.path = path
        #: How long a finished request's answer is kept for replay (seconds).
        self.retention = retention
        #: After how long a ``pending`` row is presumed abandoned by a dead process.
        self.pending_ttl = pending_ttl
        self.clock = clock
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(
            path, isolation_level=None, check_same_thread=False, timeout=30.0
        )
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA busy_timeout=30000")
        self._conn.execute(_SCHEMA)
        self._last_purge = 0.0

    def begin(self, tenant: str, key: str, fingerprint: str) -> Claim:
        """Claim the key for a request, or say why not (replay, mismatch, in progress)."""
        now = self.clock()
        with self._lock:
            self._purge(now)
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                row = self._conn.execute(
                    "SELECT fingerprint, state, status, media_type, body, created_at "
                    "FROM api_requests WHERE tenant = ? AND key = ?",
                    (tenant, key),
                ).fetchone()
                if row is not None:
                    found, state, status, media_type, body, created_at = row
                    if found != fingerprint:
                        return Claim(mismatch=True)
                    if state == "done":
                        return Claim(stored=Stored(int(status), str(media_type), bytes(body)))
                    if created_at > now - self.pending_ttl:
                        return Claim(in_progress=True)
                self._conn.execute(
                    "INSERT OR REPLACE INTO api_requests (tenant, key, fingerprint, state, "
                    "created_at) VALUES (?, ?, ?, 'pending', ?)",
                    (tenant, key, fingerprint, now),
                )
                return Claim(fresh=True)
            finally:
                self._conn.execute("COMMIT")

    def finish(self, tenant: str, key: str, answer: Stored) -> None:
        """Keep the answer of the request that claimed the key."""
        with self._lock:
            self._conn.execute(
                "UPDATE api_requests SET state = 'done', status = ?, media_type = ?, body = ? "
                "WHERE tenant = ? AND key = ?",
                (answer.status, answer.media_type, answer.body, tenant, key),
            )

    def release(self, tenant: str, key: str) -> None:
        """Forget a claim whose request failed on the server's side: the client may retry."""
        with self._lock:
            self._conn.execute(
                "DELETE FROM api_requests WHERE tenant = ? AND key = ? AND state = 'pending'",
                (tenant, key),
            )

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            self._conn.close()

    def _purge(self, now: float) -> None:
        if now - self._last_purge < 60.0:
            return
        self._last_purge = now
        self._conn.execute(
            "DELETE FROM api_requests WHERE state = 'done' AND created_at < ?",
            (now - self.retention,),
        )


def default_path(db_url: str) -> str:
    """Where the table lives for a ledger URL: beside a SQLite ledger, else in the working
    directory."""
    from effectflow.ledger import sqlite

    if "://" in db_url and urlparse(db_url).scheme in ("postgres", "postgresql"):
        return "effectflow-api-requests.db"

    path, _ = sqlite.parse_url(db_url)
    if path == ":memory:":
        return ":memory:"
    return f"{path}.api-requests.db"
