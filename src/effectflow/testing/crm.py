"""A simulated CRM whose "create task" is an idempotent upsert by external id.

It models the Salesforce/HubSpot pattern where the client supplies a unique external id and the
CRM creates the record once: repeating the call, however many times and from whichever process,
yields the same task. Unlike a real upsert it refuses a different payload under the same key
instead of overwriting the record, so a bug in how the caller derives keys shows up as an error
rather than as a silently edited task. Keys never expire: an external id is a field of the record.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from typing import Any, ClassVar

from effectflow.testing import _base, http_api

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS crm_tasks (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        case_id TEXT NOT NULL,
        title TEXT NOT NULL,
        owner TEXT,
        idempotency_key TEXT NOT NULL UNIQUE,
        payload_digest TEXT NOT NULL,
        created_ts REAL NOT NULL
    )""",
)

_TASK_COLUMNS = "seq, case_id, title, owner, idempotency_key, created_ts"


class CrmProvider(_base.SqliteProvider):
    """A CRM task API whose state lives in its own SQLite file (see the module docstring).

    Args:
        path: The provider's SQLite file; several objects and processes may share it.
        clock: Epoch seconds, injectable for deterministic timestamps.
    """

    KIND: ClassVar[str] = "crm"
    OPERATIONS: ClassVar[frozenset[str]] = frozenset({"upsert_task"})
    SCHEMA: ClassVar[tuple[str, ...]] = _SCHEMA

    def __init__(
        self, path: str | os.PathLike[str], *, clock: Callable[[], float] = time.time
    ) -> None:
        super().__init__(path, clock=clock)

    def upsert_task(
        self, case_id: str, title: str, *, idempotency_key: str, owner: str | None = None
    ) -> dict[str, Any]:
        """Create the task for ``idempotency_key``, or return the one already created.

        Returns:
            ``{"task_id", "case_id", "title", "owner", "created_at", "replayed"}``;
            ``replayed`` is True when the task already existed.

        Raises:
            ProviderRejected: Empty ``case_id``, ``title`` or key (code ``invalid_field``).
            IdempotencyKeyReused: The key already names a task with a different payload.
            ProviderUnavailable: Injected ``fail_before_commit``.
            ProviderTimeout: Injected ``lose_response`` (created) or ``timeout_before_commit``.
        """
        payload_digest = _base.digest({"case_id": case_id, "title": title, "owner": owner})

        def effect(conn: sqlite3.Connection, now: float) -> tuple[dict[str, Any], str]:
            for field, value in (("case_id", case_id), ("title", title), ("key", idempotency_key)):
                if not value:
                    raise _base.ProviderRejected(
                        f"{field} must not be empty", code="invalid_field", status=400
                    )
            row = conn.execute(
                f"SELECT {_TASK_COLUMNS}, payload_digest FROM crm_tasks WHERE idempotency_key = ?",
                (idempotency_key,),
            ).fetchone()
            if row is not None:
                if row[-1] != payload_digest:
                    raise _base.IdempotencyKeyReused(idempotency_key)
                return _upsert_response(row[:-1], replayed=True), "replayed"
            seq = conn.execute(
                "INSERT INTO crm_tasks (case_id, title, owner, idempotency_key, payload_digest,"
                " created_ts) VALUES (?, ?, ?, ?, ?, ?)",
                (case_id, title, owner, idempotency_key, payload_digest, now),
            ).lastrowid
            assert seq is not None
            created = (seq, case_id, title, owner, idempotency_key, now)
            return _upsert_response(created, replayed=False), "ok"

        return self._call("upsert_task", idempotency_key, effect)

    def get_task(
        self, *, idempotency_key: str | None = None, task_id: str | None = None
    ) -> dict[str, Any] | None:
        """Look a task up by its external id (key) or by its CRM id; None when absent.

        Raises:
            ValueError: Not exactly one of ``idempotency_key`` and ``task_id`` given.
        """
        if (idempotency_key is None) == (task_id is None):
            raise ValueError("give exactly one of idempotency_key and task_id")
        param: str | int
        if idempotency_key is not None:
            where, param = "idempotency_key = ?", idempotency_key
        else:
            assert task_id is not None
            seq = _base.parse_id("task", task_id)
            if seq is None:
                return None
            where, param = "seq = ?", seq
        with self._locked() as conn:
            row = conn.execute(
                f"SELECT {_TASK_COLUMNS} FROM crm_tasks WHERE {where}", (param,)
            ).fetchone()
        return None if row is None else _task(row)

    def tasks(self, *, case_id: str | None = None) -> list[dict[str, Any]]:
        """Every task ever created, oldest first: the truth a test checks.

        Each task has ``task_id``, ``case_id``, ``title``, ``owner``, ``created_at`` and
        ``idempotency_key``.
        """
        sql = f"SELECT {_TASK_COLUMNS} FROM crm_tasks"
        params: tuple[str, ...] = ()
        if case_id is not None:
            sql += " WHERE case_id = ?"
            params = (case_id,)
        with self._locked() as conn:
            rows = conn.execute(sql + " ORDER BY seq", params).fetchall()
        return [_task(row) for row in rows]


def _task(row: tuple[Any, ...]) -> dict[str, Any]:
    seq, case_id, title, owner, key, created_ts = row
    return {
        "task_id": f"task_{int(seq)}",
        "case_id": str(case_id),
        "title": str(title),
        "owner": owner,
        "created_at": _base.iso(float(created_ts)),
        "idempotency_key": str(key),
    }


def _upsert_response(row: tuple[Any, ...], *, replayed: bool) -> dict[str, Any]:
    task = _task(row)
    del task["idempotency_key"]
    task["replayed"] = replayed
    return task


class CrmApi(http_api.Table):
    """The CRM API over HTTP (``effectflow.testing.service`` routes, ``HttpCrm`` methods)."""

    KIND = CrmProvider.KIND
    upsert_task = http_api.post(
        "/crm/upsert_task",
        CrmProvider.upsert_task,
        body={"case_id": http_api.TEXT, "title": http_api.TEXT, "owner": http_api.OPTIONAL_TEXT},
        headers={"idempotency_key": "Idempotency-Key"},
        key="idempotency_key",
    )
    get_task = http_api.get(
        "/crm/task",
        CrmProvider.get_task,
        query=("idempotency_key", "task_id"),
        answer=http_api.Answer.FOUND,
    )
    tasks = http_api.get(
        "/crm/tasks", CrmProvider.tasks, query=("case_id",), answer=http_api.Answer.LIST
    )
