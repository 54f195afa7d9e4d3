"""A simulated chat "post message" API (Slack ``chat.postMessage``-like).

It models the common, awkward case: the write is NOT idempotent, every call posts a new message,
and a retry after a lost response posts a duplicate. What the API does offer is search: the
caller can attach its own tag to each message and later ask whether a message with that tag
exists, which is the only safe way to decide whether an unknown post happened.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from typing import Any, ClassVar

from effectflow.testing import _base, http_api

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS notify_notifications (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        channel TEXT NOT NULL,
        text TEXT NOT NULL,
        client_tag TEXT,
        posted_ts REAL NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS notify_by_tag ON notify_notifications (client_tag)",
)

_COLUMNS = "seq, channel, text, client_tag, posted_ts"


class NotifyProvider(_base.SqliteProvider):
    """A chat API whose state lives in its own SQLite file (see the module docstring).

    Args:
        path: The provider's SQLite file; several objects and processes may share it.
        clock: Epoch seconds, injectable for deterministic timestamps.
    """

    KIND: ClassVar[str] = "notify"
    OPERATIONS: ClassVar[frozenset[str]] = frozenset({"post"})
    SCHEMA: ClassVar[tuple[str, ...]] = _SCHEMA

    def __init__(
        self, path: str | os.PathLike[str], *, clock: Callable[[], float] = time.time
    ) -> None:
        super().__init__(path, clock=clock)

    def post(self, channel: str, text: str, *, client_tag: str | None = None) -> dict[str, Any]:
        """Post a message. Every call posts a new one: there is no deduplication.

        Returns:
            ``{"notification_id", "channel", "text", "client_tag", "posted_at"}``.

        Raises:
            ProviderRejected: Empty channel (code ``channel_not_found``) or empty text
                (code ``no_text``), as Slack answers.
            ProviderUnavailable: Injected ``fail_before_commit``.
            ProviderTimeout: Injected ``lose_response`` (posted) or ``timeout_before_commit``.
        """

        def effect(conn: sqlite3.Connection, now: float) -> tuple[dict[str, Any], str]:
            if not channel:
                raise _base.ProviderRejected(
                    "channel not found", code="channel_not_found", status=404
                )
            if not text:
                raise _base.ProviderRejected("text is empty", code="no_text", status=400)
            seq = conn.execute(
                "INSERT INTO notify_notifications (channel, text, client_tag, posted_ts)"
                " VALUES (?, ?, ?, ?)",
                (channel, text, client_tag, now),
            ).lastrowid
            assert seq is not None
            return _notification((seq, channel, text, client_tag, now)), "ok"

        return self._call("post", client_tag, effect)

    def search(self, *, client_tag: str) -> list[dict[str, Any]]:
        """Every notification carrying ``client_tag``, oldest first (more than one is a dup)."""
        with self._locked() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM notify_notifications WHERE client_tag = ? ORDER BY seq",
                (client_tag,),
            ).fetchall()
        return [_notification(row) for row in rows]

    def notifications(self, *, channel: str | None = None) -> list[dict[str, Any]]:
        """Every notification ever posted, oldest first: the truth a test checks."""
        sql = f"SELECT {_COLUMNS} FROM notify_notifications"
        params: tuple[str, ...] = ()
        if channel is not None:
            sql += " WHERE channel = ?"
            params = (channel,)
        with self._locked() as conn:
            rows = conn.execute(sql + " ORDER BY seq", params).fetchall()
        return [_notification(row) for row in rows]


def _notification(row: tuple[Any, ...]) -> dict[str, Any]:
    seq, channel, text, client_tag, posted_ts = row
    return {
        "notification_id": f"ntf_{int(seq)}",
        "channel": str(channel),
        "text": str(text),
        "client_tag": client_tag,
        "posted_at": _base.iso(float(posted_ts)),
    }


class NotifyApi(http_api.Table):
    """The chat API over HTTP (``effectflow.testing.service`` routes, ``HttpNotify`` methods)."""

    KIND = NotifyProvider.KIND
    post = http_api.post(
        "/notify/post",
        NotifyProvider.post,
        body={
            "channel": http_api.TEXT,
            "text": http_api.TEXT,
            "client_tag": http_api.OPTIONAL_TEXT,
        },
        key="client_tag",
    )
    search = http_api.get(
        "/notify/search",
        NotifyProvider.search,
        query=("client_tag",),
        answer=http_api.Answer.LIST,
    )
    notifications = http_api.get(
        "/notify/notifications",
        NotifyProvider.notifications,
        query=("channel",),
        answer=http_api.Answer.LIST,
    )
