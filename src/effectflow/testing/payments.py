"""A simulated payments API (Stripe-like refunds) with time-limited idempotency keys.

What it models, because these are the behaviours a runtime gets wrong with money:

- A refund is created at most once per idempotency key *while the key is remembered* (Stripe
  keeps keys 24 hours). Within that window a retry with the same key and payload replays the
  original answer and moves no money; after it the key is forgotten and a retry refunds a second
  time. A runtime must therefore look up before it retries on an old key.
- The same key with a different payload is refused, never silently replayed. Keys are one
  namespace for every operation, as on Stripe: a cancel reusing a create's key is a different
  payload and is refused too.
- A refund can be cancelled only for a short while after it was created (``cancel_window``), so
  compensation has a deadline: after it the cancel is rejected with ``cancel_window_expired``
  and the money is gone for good.
- The total refunded per payment is capped, so a duplicated refund can be refused by the
  provider itself (``amount_too_large``), the way a real over-refund is.
- Only answers are remembered under a key, never errors: a request that was rejected leaves no
  trace under its key and may be retried with it. (Stripe also stores errors raised once an
  endpoint started executing; leaving them out keeps the simulation's key rules to one sentence.)
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable
from typing import Any, ClassVar

from effectflow.testing import _base, http_api

#: The most that can be refunded on one payment, counting refunds not cancelled.
REFUNDABLE_PER_PAYMENT = 1_000_000

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS payments_refunds (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        payment_id TEXT NOT NULL,
        amount INTEGER NOT NULL,
        metadata TEXT NOT NULL,
        idempotency_key TEXT NOT NULL,
        status TEXT NOT NULL,
        created_ts REAL NOT NULL,
        canceled_ts REAL
    )""",
    "CREATE INDEX IF NOT EXISTS payments_refunds_by_payment ON payments_refunds (payment_id)",
    # One row per key, shared by every operation; a key reused after its retention expired
    # points at the newer request. ``response`` is the answer a replay returns verbatim.
    """CREATE TABLE IF NOT EXISTS payments_keys (
        idempotency_key TEXT PRIMARY KEY,
        operation TEXT NOT NULL,
        seq INTEGER NOT NULL,
        payload_digest TEXT NOT NULL,
        response TEXT NOT NULL,
        created_ts REAL NOT NULL
    )""",
)

_REFUND_COLUMNS = (
    "seq, payment_id, amount, metadata, idempotency_key, status, created_ts, canceled_ts"
)


class PaymentsProvider(_base.SqliteProvider):
    """A refunds API whose state lives in its own SQLite file (see the module docstring).

    Args:
        path: The provider's SQLite file; several objects and processes may share it.
        clock: Epoch seconds; inject a fake to move time for key retention and cancel windows.
        key_retention: Seconds an idempotency key is remembered (default 24 h, as Stripe).
        cancel_window: Seconds after creation during which a refund can still be cancelled.
    """

    KIND: ClassVar[str] = "payments"
    OPERATIONS: ClassVar[frozenset[str]] = frozenset({"create_refund", "cancel_refund"})
    SCHEMA: ClassVar[tuple[str, ...]] = _SCHEMA

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Callable[[], float] = time.time,
        key_retention: float = 86400.0,
        cancel_window: float = 600.0,
    ) -> None:
        if key_retention <= 0:
            raise ValueError("key_retention must be positive")
        if cancel_window < 0:
            raise ValueError("cancel_window must not be negative")
        self.key_retention = key_retention
        self.cancel_window = cancel_window
        super().__init__(path, clock=clock)

    # -- writes ----------------------------------------------------------------------------------

    def create_refund(
        self,
        payment_id: str,
        amount: int,
        *,
        idempotency_key: str,
        metadata: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Refund ``amount`` (minor units) of a payment, at most once per remembered key.

        Returns:
            ``{"refund_id", "payment_id", "amount", "status": "succeeded", "created_at",
            "replayed"}``. A replay (same key and payload within retention) returns the original
            answer with ``replayed=True`` and refunds nothing, even if the refund was cancelled
            since: the key answers for the request, not for the refund's current state.

        Raises:
            ProviderRejected: Empty key (``invalid_idempotency_key``, 400), amount not a
                positive int (``invalid_amount``, 400), payment id not starting with ``pay_``
                (``no_such_payment``, 404), or refunds beyond :data:`REFUNDABLE_PER_PAYMENT`
                (``amount_too_large``, 400). Nothing written.
            IdempotencyKeyReused: The key was used with a different payload; nothing written.
            ProviderUnavailable: Injected ``fail_before_commit``.
            ProviderTimeout: Injected ``lose_response`` (refunded) or ``timeout_before_commit``.
        """
        meta = dict(metadata or {})
        payload_digest = _base.digest(
            {"op": "create_refund", "payment_id": payment_id, "amount": amount, "metadata": meta}
        )

        def effect(conn: sqlite3.Connection, now: float) -> tuple[dict[str, Any], str]:
            _require_key(idempotency_key)
            # bool is an int to Python but not an amount to any payments API.
            if type(amount) is not int or amount <= 0:
                raise _base.ProviderRejected(
                    f"amount must be a positive integer, got {amount!r}",
                    code="invalid_amount",
                    status=400,
                )
            if not payment_id.startswith("pay_"):
                raise _base.ProviderRejected(
                    f"no such payment: {payment_id!r}", code="no_such_payment", status=404
                )
            replay = self._replay_txn(conn, idempotency_key, payload_digest, now)
            if replay is not None:
                return replay, "replayed"
            (refunded,) = conn.execute(
                "SELECT COALESCE(SUM(amount), 0) FROM payments_refunds"
                " WHERE payment_id = ? AND status = 'succeeded'",
                (payment_id,),
            ).fetchone()
            if int(refunded) + amount > REFUNDABLE_PER_PAYMENT:
                raise _base.ProviderRejected(
                    f"refund of {amount} exceeds what remains refundable on {payment_id}"
                    f" ({REFUNDABLE_PER_PAYMENT - int(refunded)})",
                    code="amount_too_large",
                    status=400,
                )
            seq = conn.execute(
                "INSERT INTO payments_refunds (payment_id, amount, metadata, idempotency_key,"
                " status, created_ts) VALUES (?, ?, ?, ?, 'succeeded', ?)",
                (payment_id, amount, json.dumps(meta), idempotency_key, now),
            ).lastrowid
            assert seq is not None
            response = {
                "refund_id": f"re_{seq}",
                "payment_id": payment_id,
                "amount": amount,
                "status": "succeeded",
                "created_at": _base.iso(now),
            }
            self._remember_txn(
                conn, idempotency_key, "create_refund", seq, payload_digest, response, now
            )
            return {**response, "replayed": False}, "ok"

        return self._call("create_refund", idempotency_key, effect)

    def cancel_refund(self, refund_id: str, *, idempotency_key: str) -> dict[str, Any]:
        """Cancel a refund while its cancel window is open: the compensation for a refund.

        Returns:
            ``{"refund_id", "payment_id", "amount", "status": "canceled", "created_at",
            "canceled_at", "replayed"}``; a replay (same key and refund within retention)
            returns the original answer with ``replayed=True``.

        Raises:
            ProviderRejected: Empty key (``invalid_idempotency_key``, 400), unknown refund
                (``no_such_refund``, 404), a refund already cancelled under another key
                (``refund_already_canceled``, 409), or more than ``cancel_window`` seconds
                after creation (``cancel_window_expired``, 409). Nothing written.
            IdempotencyKeyReused: The key was used with a different payload (another refund,
                or a create); nothing written.
            ProviderUnavailable: Injected ``fail_before_commit``.
            ProviderTimeout: Injected ``lose_response`` (cancelled) or ``timeout_before_commit``.
        """
        payload_digest = _base.digest({"op": "cancel_refund", "refund_id": refund_id})

        def effect(conn: sqlite3.Connection, now: float) -> tuple[dict[str, Any], str]:
            _require_key(idempotency_key)
            replay = self._replay_txn(conn, idempotency_key, payload_digest, now)
            if replay is not None:
                return replay, "replayed"
            seq = _base.parse_id("re", refund_id)
            row = (
                None
                if seq is None
                else conn.execute(
                    f"SELECT {_REFUND_COLUMNS} FROM payments_refunds WHERE seq = ?", (seq,)
                ).fetchone()
            )
            if seq is None or row is None:
                raise _base.ProviderRejected(
                    f"no such refund: {refund_id!r}", code="no_such_refund", status=404
                )
            refund = _refund(row)
            if refund["status"] == "canceled":
                raise _base.ProviderRejected(
                    f"refund {refund_id} is already canceled",
                    code="refund_already_canceled",
                    status=409,
                )
            if now - float(row[6]) > self.cancel_window:
                raise _base.ProviderRejected(
                    f"refund {refund_id} can no longer be canceled"
                    f" ({self.cancel_window:g}s after creation)",
                    code="cancel_window_expired",
                    status=409,
                )
            conn.execute(
                "UPDATE payments_refunds SET status = 'canceled', canceled_ts = ? WHERE seq = ?",
                (now, seq),
            )
            response = {
                "refund_id": refund_id,
                "payment_id": refund["payment_id"],
                "amount": refund["amount"],
                "status": "canceled",
                "created_at": refund["created_at"],
                "canceled_at": _base.iso(now),
            }
            self._remember_txn(
                conn, idempotency_key, "cancel_refund", seq, payload_digest, response, now
            )
            return {**response, "replayed": False}, "ok"

        return self._call("cancel_refund", idempotency_key, effect)

    def _replay_txn(
        self, conn: sqlite3.Connection, key: str, payload_digest: str, now: float
    ) -> dict[str, Any] | None:
        """The stored answer for ``key`` if it is remembered with this payload, else None.

        Raises:
            IdempotencyKeyReused: The key is remembered with a different payload.
        """
        row = conn.execute(
            "SELECT payload_digest, response, created_ts FROM payments_keys"
            " WHERE idempotency_key = ?",
            (key,),
        ).fetchone()
        if row is None or now - float(row[2]) > self.key_retention:
            return None
        if row[0] != payload_digest:
            raise _base.IdempotencyKeyReused(key)
        return {**json.loads(row[1]), "replayed": True}

    @staticmethod
    def _remember_txn(
        conn: sqlite3.Connection,
        key: str,
        operation: str,
        seq: int,
        payload_digest: str,
        response: dict[str, Any],
        now: float,
    ) -> None:
        conn.execute(
            "INSERT OR REPLACE INTO payments_keys"
            " (idempotency_key, operation, seq, payload_digest, response, created_ts)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (key, operation, seq, payload_digest, json.dumps(response), now),
        )

    # -- lookups ---------------------------------------------------------------------------------

    def get_refund_by_idempotency_key(self, idempotency_key: str) -> dict[str, Any] | None:
        """The refund created under ``idempotency_key`` while the key is remembered, else None.

        This is the lookup a reconciler uses after a timeout: it answers "did my refund happen,
        and is it still standing?". Only a create's key finds a refund; a cancel's key does not,
        because the cancel did not create it. After the key's retention it answers None even
        though the refund exists, exactly when a blind retry would refund twice.

        Returns:
            The refund (see :meth:`refunds`) in its current state, or None.
        """
        now = self._now()
        with self._locked() as conn:
            key_row = conn.execute(
                "SELECT seq, created_ts FROM payments_keys"
                " WHERE idempotency_key = ? AND operation = 'create_refund'",
                (idempotency_key,),
            ).fetchone()
            if key_row is None or now - float(key_row[1]) > self.key_retention:
                return None
            row = conn.execute(
                f"SELECT {_REFUND_COLUMNS} FROM payments_refunds WHERE seq = ?", (key_row[0],)
            ).fetchone()
        return None if row is None else _refund(row)

    def get_refund(self, refund_id: str) -> dict[str, Any] | None:
        """The refund with this id in its current state (see :meth:`refunds`), or None."""
        seq = _base.parse_id("re", refund_id)
        if seq is None:
            return None
        with self._locked() as conn:
            row = conn.execute(
                f"SELECT {_REFUND_COLUMNS} FROM payments_refunds WHERE seq = ?", (seq,)
            ).fetchone()
        return None if row is None else _refund(row)

    def refunds(self, *, payment_id: str | None = None) -> list[dict[str, Any]]:
        """Every refund ever created, oldest first, cancelled ones included: the truth a test checks.

        Each refund has ``refund_id``, ``payment_id``, ``amount``, ``status`` (``"succeeded"``
        or ``"canceled"``), ``created_at``, ``canceled_at`` once cancelled, ``idempotency_key``
        (the key it was created under) and ``metadata``.
        """
        sql = f"SELECT {_REFUND_COLUMNS} FROM payments_refunds"
        params: tuple[str, ...] = ()
        if payment_id is not None:
            sql += " WHERE payment_id = ?"
            params = (payment_id,)
        with self._locked() as conn:
            rows = conn.execute(sql + " ORDER BY seq", params).fetchall()
        return [_refund(row) for row in rows]

    def count_refunds(self, payment_id: str | None = None, *, status: str | None = None) -> int:
        """How many refunds were created (for one payment, in one status): duplicates show here.

        Cancelled refunds count unless ``status="succeeded"`` is asked for, because a refund
        created twice and cancelled once is still a bug in the caller.
        """
        return count_refunds(self.refunds(payment_id=payment_id), status=status)


def count_refunds(refunds: list[dict[str, Any]], *, status: str | None = None) -> int:
    """How many of ``refunds`` are in ``status`` (all of them for None): the count behind
    :meth:`PaymentsProvider.count_refunds` and its HTTP client's."""
    return sum(1 for refund in refunds if status is None or refund["status"] == status)


def _require_key(idempotency_key: str) -> None:
    if not idempotency_key:
        raise _base.ProviderRejected(
            "an idempotency key is required", code="invalid_idempotency_key", status=400
        )


def _refund(row: tuple[Any, ...]) -> dict[str, Any]:
    seq, payment_id, amount, metadata, key, status, created_ts, canceled_ts = row
    refund: dict[str, Any] = {
        "refund_id": f"re_{int(seq)}",
        "payment_id": str(payment_id),
        "amount": int(amount),
        "status": str(status),
        "created_at": _base.iso(float(created_ts)),
    }
    if canceled_ts is not None:
        refund["canceled_at"] = _base.iso(float(canceled_ts))
    refund["idempotency_key"] = str(key)
    refund["metadata"] = dict(json.loads(metadata))
    return refund


class PaymentsApi(http_api.Table):
    """The refunds API over HTTP (``effectflow.testing.service`` routes, ``HttpPayments``
    methods). ``GET /payments/refunds`` answers a lookup by key (zero or one refund) when it is
    given ``idempotency_key``, else the list (of one payment's refunds, with ``payment_id``)."""

    KIND = PaymentsProvider.KIND
    create_refund = http_api.post(
        "/payments/refunds",
        PaymentsProvider.create_refund,
        body={
            "payment_id": http_api.TEXT,
            "amount": http_api.AS_SENT,
            "metadata": http_api.TEXT_MAP,
        },
        headers={"idempotency_key": "Idempotency-Key"},
        key="idempotency_key",
    )
    get_refund_by_idempotency_key = http_api.get(
        "/payments/refunds",
        PaymentsProvider.get_refund_by_idempotency_key,
        query=("idempotency_key",),
        answer=http_api.Answer.ZERO_OR_ONE,
        selected_by="idempotency_key",
    )
    refunds = http_api.get(
        "/payments/refunds",
        PaymentsProvider.refunds,
        query=("payment_id",),
        answer=http_api.Answer.LIST,
    )
    cancel_refund = http_api.post(
        "/payments/refunds/{refund_id}/cancel",
        PaymentsProvider.cancel_refund,
        headers={"idempotency_key": "Idempotency-Key"},
        key="idempotency_key",
    )
    get_refund = http_api.get(
        "/payments/refunds/{refund_id}", PaymentsProvider.get_refund, answer=http_api.Answer.FOUND
    )
