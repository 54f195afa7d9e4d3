"""A simulated transactional-mail API (Postmark/SendGrid-like) with Stripe-style idempotency keys.

What it models, because these are the behaviours a runtime gets wrong:

- Sending is *asynchronous*: the API answers ``accepted`` and the message becomes ``sent`` and
  then ``delivered`` later, so "the call returned" is not "the email arrived".
- Idempotency keys are remembered for a limited time (Stripe keeps them 24 hours). Within that
  window a retry with the same key and payload replays the original answer; after it the key
  is forgotten and a retry sends a second email. That is real, and a runtime must not retry
  blindly on an old key.
- The same key with a different payload is refused, never silently replayed.
- Messages can be looked up by key or by id, and searched by metadata, which is how a
  reconciler finds out whether an unknown send happened.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable
from typing import Any, ClassVar

from effectflow.testing import _base, http_api

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS mail_messages (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        to_addr TEXT NOT NULL,
        subject TEXT NOT NULL,
        body TEXT NOT NULL,
        payload_digest TEXT NOT NULL,
        idempotency_key TEXT,
        metadata TEXT NOT NULL,
        accepted_ts REAL NOT NULL
    )""",
    # One row per key; a key reused after its retention expired points at the newer message.
    """CREATE TABLE IF NOT EXISTS mail_keys (
        idempotency_key TEXT PRIMARY KEY,
        seq INTEGER NOT NULL,
        payload_digest TEXT NOT NULL,
        created_ts REAL NOT NULL
    )""",
)

_MESSAGE_COLUMNS = "seq, to_addr, subject, body, idempotency_key, metadata, accepted_ts"


class MailProvider(_base.SqliteProvider):
    """A mail API whose state lives in its own SQLite file (see the module docstring).

    Args:
        path: The provider's SQLite file; several objects and processes may share it.
        clock: Epoch seconds; inject a fake to move time for status and key retention.
        sent_after: Seconds after acceptance when a message counts as ``sent``.
        delivered_after: Seconds after acceptance when it counts as ``delivered``.
        key_retention: Seconds an idempotency key is remembered (default 24 h, as Stripe).
    """

    KIND: ClassVar[str] = "mail"
    OPERATIONS: ClassVar[frozenset[str]] = frozenset({"send"})
    SCHEMA: ClassVar[tuple[str, ...]] = _SCHEMA

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Callable[[], float] = time.time,
        sent_after: float = 0.3,
        delivered_after: float = 0.8,
        key_retention: float = 86400.0,
    ) -> None:
        if not 0 <= sent_after <= delivered_after:
            raise ValueError("need 0 <= sent_after <= delivered_after")
        if key_retention <= 0:
            raise ValueError("key_retention must be positive")
        self.sent_after = sent_after
        self.delivered_after = delivered_after
        self.key_retention = key_retention
        super().__init__(path, clock=clock)

    def send(
        self,
        to: str,
        subject: str,
        body: str,
        *,
        idempotency_key: str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Accept a message for delivery.

        Returns:
            ``{"provider_message_id", "status": "accepted", "accepted_at", "replayed"}``. A
            replay (same key and payload within retention) returns the original answer with
            ``replayed=True`` and sends nothing.

        Raises:
            ProviderRejected: ``to`` is not an address (code ``invalid_address``).
            IdempotencyKeyReused: The key was used with a different payload; nothing written.
            ProviderUnavailable: Injected ``fail_before_commit``.
            ProviderTimeout: Injected ``lose_response`` (sent) or ``timeout_before_commit``.
        """
        meta = dict(metadata or {})
        payload_digest = _base.digest({"to": to, "subject": subject, "body": body})

        def effect(conn: sqlite3.Connection, now: float) -> tuple[dict[str, Any], str]:
            if "@" not in to:
                raise _base.ProviderRejected(
                    f"{to!r} is not an email address", code="invalid_address"
                )
            if idempotency_key is not None:
                row = conn.execute(
                    "SELECT seq, payload_digest, created_ts FROM mail_keys"
                    " WHERE idempotency_key = ?",
                    (idempotency_key,),
                ).fetchone()
                if row is not None and now - float(row[2]) <= self.key_retention:
                    if row[1] != payload_digest:
                        raise _base.IdempotencyKeyReused(idempotency_key)
                    original = self._accepted_ts_txn(conn, int(row[0]))
                    return _send_response(int(row[0]), original, replayed=True), "replayed"
            seq = conn.execute(
                "INSERT INTO mail_messages (to_addr, subject, body, payload_digest,"
                " idempotency_key, metadata, accepted_ts) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (to, subject, body, payload_digest, idempotency_key, json.dumps(meta), now),
            ).lastrowid
            assert seq is not None
            if idempotency_key is not None:
                conn.execute(
                    "INSERT OR REPLACE INTO mail_keys"
                    " (idempotency_key, seq, payload_digest, created_ts) VALUES (?, ?, ?, ?)",
                    (idempotency_key, seq, payload_digest, now),
                )
            return _send_response(seq, now, replayed=False), "ok"

        return self._call("send", idempotency_key, effect)

    @staticmethod
    def _accepted_ts_txn(conn: sqlite3.Connection, seq: int) -> float:
        row = conn.execute("SELECT accepted_ts FROM mail_messages WHERE seq = ?", (seq,)).fetchone()
        return float(row[0])

    def status(
        self, *, idempotency_key: str | None = None, message_id: str | None = None
    ) -> dict[str, Any] | None:
        """Look a message up by idempotency key (within retention) or by provider id.

        This is the lookup a reconciler uses after a timeout: it answers "did my send happen,
        and how far has it got?".

        Returns:
            The message (see :meth:`messages`) with its current ``status``, or None.

        Raises:
            ValueError: Not exactly one of ``idempotency_key`` and ``message_id`` given.
        """
        if (idempotency_key is None) == (message_id is None):
            raise ValueError("give exactly one of idempotency_key and message_id")
        now = self._now()
        with self._locked() as conn:
            if idempotency_key is not None:
                key_row = conn.execute(
                    "SELECT seq, created_ts FROM mail_keys WHERE idempotency_key = ?",
                    (idempotency_key,),
                ).fetchone()
                if key_row is None or now - float(key_row[1]) > self.key_retention:
                    return None
                seq: int | None = int(key_row[0])
            else:
                assert message_id is not None
                seq = _base.parse_id("msg", message_id)
            if seq is None:
                return None
            row = conn.execute(
                f"SELECT {_MESSAGE_COLUMNS} FROM mail_messages WHERE seq = ?", (seq,)
            ).fetchone()
        return None if row is None else self._message(row, now)

    def find(self, /, **metadata: str) -> list[dict[str, Any]]:
        """Messages whose metadata contains every given pair, oldest first.

        Real mail APIs let you search by custom metadata; a caller that tags each send with its
        operation id can find it again even without a key.
        """
        return [m for m in self.messages() if metadata.items() <= m["metadata"].items()]

    def messages(self, *, to: str | None = None) -> list[dict[str, Any]]:
        """Every message ever accepted, oldest first: the truth a test checks.

        Each message has ``provider_message_id``, ``to``, ``subject``, ``body``, ``status``,
        ``accepted_at`` and, once reached, ``sent_at`` and ``delivered_at``, plus
        ``idempotency_key`` and ``metadata``.
        """
        now = self._now()
        sql = f"SELECT {_MESSAGE_COLUMNS} FROM mail_messages"
        params: tuple[str, ...] = ()
        if to is not None:
            sql += " WHERE to_addr = ?"
            params = (to,)
        with self._locked() as conn:
            rows = conn.execute(sql + " ORDER BY seq", params).fetchall()
        return [self._message(row, now) for row in rows]

    def _message(self, row: tuple[Any, ...], now: float) -> dict[str, Any]:
        seq, to_addr, subject, body, key, metadata, accepted_ts = row
        accepted = float(accepted_ts)
        message: dict[str, Any] = {
            "provider_message_id": f"msg_{int(seq)}",
            "to": str(to_addr),
            "subject": str(subject),
            "body": str(body),
            "status": "accepted",
            "accepted_at": _base.iso(accepted),
        }
        if now >= accepted + self.sent_after:
            message["status"] = "sent"
            message["sent_at"] = _base.iso(accepted + self.sent_after)
        if now >= accepted + self.delivered_after:
            message["status"] = "delivered"
            message["delivered_at"] = _base.iso(accepted + self.delivered_after)
        message["idempotency_key"] = key
        message["metadata"] = dict(json.loads(metadata))
        return message


def _send_response(seq: int, accepted_ts: float, *, replayed: bool) -> dict[str, Any]:
    return {
        "provider_message_id": f"msg_{seq}",
        "status": "accepted",
        "accepted_at": _base.iso(accepted_ts),
        "replayed": replayed,
    }


class MailApi(http_api.Table):
    """The mail API over HTTP (``effectflow.testing.service`` routes, ``HttpMail`` methods)."""

    KIND = MailProvider.KIND
    send = http_api.post(
        "/mail/send",
        MailProvider.send,
        body={
            "to": http_api.TEXT,
            "subject": http_api.TEXT,
            "body": http_api.TEXT,
            "metadata": http_api.TEXT_MAP,
        },
        headers={"idempotency_key": "Idempotency-Key"},
        key="idempotency_key",
    )
    status = http_api.get(
        "/mail/status",
        MailProvider.status,
        query=("idempotency_key", "message_id"),
        answer=http_api.Answer.FOUND,
    )
    messages = http_api.get(
        "/mail/messages", MailProvider.messages, query=("to",), answer=http_api.Answer.LIST
    )
    #: ``GET /mail/find?<metadata key>=<value>...``: every query parameter is a metadata pair.
    find = http_api.get(
        "/mail/find", MailProvider.find, query=("metadata",), answer=http_api.Answer.LIST
    )
