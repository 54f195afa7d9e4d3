"""A simulated deployment API with revisions and compare-and-swap (Kubernetes/ETag-like).

What it models, because these are the behaviours a runtime gets wrong with shared state:

- Every target (``"deployment/prod"``) has a revision that each deployment bumps. A deploy may
  carry a precondition, ``expected_revision=N`` or the HTTP form ``if_match='"rN"'``; when the
  target has moved on the provider refuses with :class:`RevisionConflict` (412) and writes
  nothing, so a caller working from a stale observation cannot overwrite someone else's work.
- Other writers exist. :meth:`DeployTarget.concurrent_deploy` stands for another team's
  pipeline deploying between our observe and our deploy.
- A deploy without a precondition is allowed, as real APIs allow it, and recorded as blind, so
  :meth:`DeployTarget.overwrites` can count the lost updates it caused.
- With an idempotency key, the same request repeated is *answered*, not re-applied: the first
  response is replayed even though the revision has moved since, and a different payload under
  the key is refused. Keys never expire here (deployments are rare and a key is cheap to keep).
  Only answers are remembered: a request refused with a conflict leaves no trace under its key.

A target nobody seeded or deployed to reads as revision 1 with no image, so tests need no setup
to deploy to a fresh name.

Exception tree (beside the shared one in ``_base``)::

    ProviderError
    └── RevisionConflict        412 revision_mismatch, .target .expected .current, nothing written
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from collections.abc import Callable
from typing import Any, ClassVar, Literal

from effectflow.testing import _base, http_api

Writer = Literal["us", "other"]
"""Who made a deployment: the code under test (``us``) or :meth:`DeployTarget.concurrent_deploy`."""

#: The revision of a target before anyone seeded or deployed it.
INITIAL_REVISION = 1

_ETAG = re.compile(r'"r(\d+)"')

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS deploy_targets (
        target TEXT PRIMARY KEY,
        revision INTEGER NOT NULL,
        image TEXT
    )""",
    # based_on is the revision a deployment replaced; expected_revision is the precondition the
    # caller sent (NULL for a blind deploy). They differ only for a blind deploy.
    """CREATE TABLE IF NOT EXISTS deploy_deployments (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        target TEXT NOT NULL,
        revision INTEGER NOT NULL,
        based_on INTEGER NOT NULL,
        expected_revision INTEGER,
        image TEXT NOT NULL,
        writer TEXT NOT NULL,
        idempotency_key TEXT,
        deployed_ts REAL NOT NULL,
        UNIQUE (target, revision)
    )""",
    """CREATE TABLE IF NOT EXISTS deploy_keys (
        idempotency_key TEXT PRIMARY KEY,
        seq INTEGER NOT NULL,
        payload_digest TEXT NOT NULL,
        response TEXT NOT NULL
    )""",
)

_DEPLOYMENT_COLUMNS = (
    "seq, target, revision, based_on, expected_revision, image, writer, idempotency_key,"
    " deployed_ts"
)


class RevisionConflict(_base.ProviderError):
    """The deploy's precondition names a revision the target no longer has; nothing written.

    A definite "did not happen", like every :class:`~effectflow.testing.ProviderError`, but not
    a rejection of the request itself: the same deploy would succeed against a fresh
    observation, and whether to make it is a decision for the caller, not a retry.

    Attributes:
        target: The target deployed to.
        expected: The revision the caller expected.
        current: The revision the target has.
    """

    def __init__(self, target: str, *, expected: int, current: int) -> None:
        super().__init__(
            f"{target}: expected revision {expected}, but the target is at revision {current}",
            code="revision_mismatch",
            status=412,
        )
        self.target = target
        self.expected = expected
        self.current = current


def etag(revision: int) -> str:
    """The ETag a target at ``revision`` answers with (and ``if_match`` expects)."""
    return f'"r{revision}"'


class DeployTarget(_base.SqliteProvider):
    """A deployment API whose state lives in its own SQLite file (see the module docstring).

    Args:
        path: The provider's SQLite file; several objects and processes may share it.
        clock: Epoch seconds, injectable for deterministic timestamps.
    """

    KIND: ClassVar[str] = "deploy"
    OPERATIONS: ClassVar[frozenset[str]] = frozenset({"deploy"})
    SCHEMA: ClassVar[tuple[str, ...]] = _SCHEMA

    def __init__(
        self, path: str | os.PathLike[str], *, clock: Callable[[], float] = time.time
    ) -> None:
        super().__init__(path, clock=clock)

    def seed(self, target: str, image: str | None, *, revision: int = INITIAL_REVISION) -> None:
        """Give a fresh target its starting state, as if deployed before the test began.

        Seeding is test setup, not a call: it takes no faults, is not logged and leaves no
        history, so :meth:`history` shows only what happened during the test.

        Raises:
            ValueError: The target already has state (seeded or deployed), or ``revision < 1``.
        """
        if revision < INITIAL_REVISION:
            raise ValueError(f"revision must be >= {INITIAL_REVISION}")
        with self._locked() as conn, self._transaction(conn):
            if self._state_txn(conn, target, create=False) is not None:
                raise ValueError(f"{target!r} already has state; seed only fresh targets")
            conn.execute(
                "INSERT INTO deploy_targets (target, revision, image) VALUES (?, ?, ?)",
                (target, revision, image),
            )

    def observe(self, target: str) -> dict[str, Any]:
        """Read a target: ``{"target", "revision", "image", "etag"}``.

        The ``etag`` is what ``if_match`` takes to deploy on exactly this observation.
        """
        with self._locked() as conn:
            state = self._state_txn(conn, target, create=False)
        revision, image = state if state is not None else (INITIAL_REVISION, None)
        return {"target": target, "revision": revision, "image": image, "etag": etag(revision)}

    def deploy(
        self,
        target: str,
        image: str,
        *,
        expected_revision: int | None = None,
        if_match: str | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Deploy ``image``, only if the target is still at the expected revision when one is given.

        ``expected_revision`` and ``if_match`` are two spellings of one precondition; giving
        neither deploys blindly over whatever is there.

        Returns:
            ``{"target", "revision", "previous_revision", "image", "deployment_id", "etag",
            "replayed"}`` where ``revision`` is the new one. A replay (same key and payload)
            returns the first answer with ``replayed=True`` and deploys nothing.

        Raises:
            RevisionConflict: The target is not at the expected revision; nothing written.
            ProviderRejected: Empty target or image (``invalid_field``, 400), an ``if_match``
                that is not an ETag of ours, or one that disagrees with ``expected_revision``
                (``invalid_precondition``, 400). Nothing written.
            IdempotencyKeyReused: The key was used with a different payload; nothing written.
            ProviderUnavailable: Injected ``fail_before_commit``.
            ProviderTimeout: Injected ``lose_response`` (deployed) or ``timeout_before_commit``.
        """

        def effect(conn: sqlite3.Connection, now: float) -> tuple[dict[str, Any], str]:
            for field, value in (("target", target), ("image", image)):
                if not value:
                    raise _base.ProviderRejected(
                        f"{field} must not be empty", code="invalid_field", status=400
                    )
            expected = _precondition(expected_revision, if_match)
            payload_digest = _base.digest(
                {"target": target, "image": image, "expected_revision": expected}
            )
            if idempotency_key is not None:
                row = conn.execute(
                    "SELECT payload_digest, response FROM deploy_keys WHERE idempotency_key = ?",
                    (idempotency_key,),
                ).fetchone()
                if row is not None:
                    if row[0] != payload_digest:
                        raise _base.IdempotencyKeyReused(idempotency_key)
                    return {**json.loads(row[1]), "replayed": True}, "replayed"
            response = self._apply_txn(conn, now, target, image, expected, "us", idempotency_key)
            if idempotency_key is not None:
                conn.execute(
                    "INSERT INTO deploy_keys (idempotency_key, seq, payload_digest, response)"
                    " VALUES (?, ?, ?, ?)",
                    (
                        idempotency_key,
                        _base.parse_id("dep", response["deployment_id"]),
                        payload_digest,
                        json.dumps(response),
                    ),
                )
            return {**response, "replayed": False}, "ok"

        return self._call("deploy", idempotency_key, effect)

    def concurrent_deploy(self, target: str, image: str) -> dict[str, Any]:
        """Another team's pipeline deploys ``image`` blindly on whatever revision is current.

        Use it between an observe and a deploy to make the observation stale. It takes no
        injected faults (the other team's network is not under test) but appears in
        :meth:`calls` as ``concurrent_deploy``, so the interleaving can be read back.

        Returns:
            The same shape as :meth:`deploy`, with ``replayed=False``.
        """

        def effect(conn: sqlite3.Connection, now: float) -> tuple[dict[str, Any], str]:
            response = self._apply_txn(conn, now, target, image, None, "other", None)
            return {**response, "replayed": False}, "ok"

        return self._call("concurrent_deploy", None, effect)

    def _apply_txn(
        self,
        conn: sqlite3.Connection,
        now: float,
        target: str,
        image: str,
        expected: int | None,
        writer: Writer,
        idempotency_key: str | None,
    ) -> dict[str, Any]:
        """Check the precondition against the current revision and, if it holds, deploy."""
        state = self._state_txn(conn, target, create=True)
        assert state is not None
        current = state[0]
        if expected is not None and expected != current:
            raise RevisionConflict(target, expected=expected, current=current)
        revision = current + 1
        conn.execute(
            "UPDATE deploy_targets SET revision = ?, image = ? WHERE target = ?",
            (revision, image, target),
        )
        seq = conn.execute(
            "INSERT INTO deploy_deployments (target, revision, based_on, expected_revision,"
            " image, writer, idempotency_key, deployed_ts) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (target, revision, current, expected, image, writer, idempotency_key, now),
        ).lastrowid
        assert seq is not None
        return {
            "target": target,
            "revision": revision,
            "previous_revision": current,
            "image": image,
            "deployment_id": f"dep_{seq}",
            "etag": etag(revision),
        }

    @staticmethod
    def _state_txn(
        conn: sqlite3.Connection, target: str, *, create: bool
    ) -> tuple[int, str | None] | None:
        """The target's ``(revision, image)``; a missing target is None, or created when asked."""
        row = conn.execute(
            "SELECT revision, image FROM deploy_targets WHERE target = ?", (target,)
        ).fetchone()
        if row is not None:
            return int(row[0]), row[1]
        if not create:
            return None
        conn.execute(
            "INSERT INTO deploy_targets (target, revision, image) VALUES (?, ?, NULL)",
            (target, INITIAL_REVISION),
        )
        return INITIAL_REVISION, None

    # -- lookups and truth -----------------------------------------------------------------------

    def get_deployment_by_idempotency_key(self, idempotency_key: str) -> dict[str, Any] | None:
        """The deployment made under ``idempotency_key`` (see :meth:`history`), or None.

        This is the lookup a reconciler uses after a timeout. It answers whether *this* request
        was applied, which :meth:`observe` cannot: the image may be there because another
        writer deployed the same one.
        """
        with self._locked() as conn:
            row = conn.execute(
                f"SELECT {_DEPLOYMENT_COLUMNS} FROM deploy_deployments WHERE seq ="
                " (SELECT seq FROM deploy_keys WHERE idempotency_key = ?)",
                (idempotency_key,),
            ).fetchone()
        return None if row is None else _deployment(row)

    def history(self, target: str) -> list[dict[str, Any]]:
        """Every deployment to ``target``, oldest first: the truth a test checks.

        Each entry has ``deployment_id``, ``target``, ``revision`` (the one it created),
        ``based_on`` (the one it replaced), ``expected_revision`` (the precondition sent, None
        when blind), ``image``, ``writer`` (``"us"`` or ``"other"``), ``idempotency_key`` and
        ``deployed_at``. Seeded state is not a deployment and does not appear.
        """
        with self._locked() as conn:
            rows = conn.execute(
                f"SELECT {_DEPLOYMENT_COLUMNS} FROM deploy_deployments WHERE target = ?"
                " ORDER BY seq",
                (target,),
            ).fetchall()
        return [_deployment(row) for row in rows]

    def overwrites(self, target: str) -> int:
        """How many of our deployments to ``target`` destroyed a revision we had not seen.

        A deployment with a precondition counts when its expected revision is not the one it
        replaced, which compare-and-swap makes impossible, so under CAS this is always 0. A
        blind deployment records nothing of what its caller had observed, so it counts
        whenever the revision it replaced was written by another writer: that is the lost
        update CAS exists to prevent. Replacing seeded state or our own revision never counts.
        """
        with self._locked() as conn:
            (count,) = conn.execute(
                "SELECT COUNT(*) FROM deploy_deployments AS d"
                " LEFT JOIN deploy_deployments AS p"
                " ON p.target = d.target AND p.revision = d.based_on"
                " WHERE d.target = ? AND d.writer = 'us' AND ("
                " (d.expected_revision IS NOT NULL AND d.expected_revision != d.based_on)"
                " OR (d.expected_revision IS NULL AND p.writer = 'other'))",
                (target,),
            ).fetchone()
        return int(count)


def _precondition(expected_revision: int | None, if_match: str | None) -> int | None:
    """The revision the caller requires, from either spelling, or None for a blind deploy."""
    if if_match is None:
        return expected_revision
    match = _ETAG.fullmatch(if_match)
    if match is None:
        raise _base.ProviderRejected(
            f"If-Match {if_match!r} is not an ETag of this API (expected like '\"r3\"')",
            code="invalid_precondition",
            status=400,
        )
    from_etag = int(match.group(1))
    if expected_revision is not None and expected_revision != from_etag:
        raise _base.ProviderRejected(
            f"expected_revision {expected_revision} and If-Match {if_match} disagree",
            code="invalid_precondition",
            status=400,
        )
    return from_etag


def _deployment(row: tuple[Any, ...]) -> dict[str, Any]:
    seq, target, revision, based_on, expected, image, writer, key, deployed_ts = row
    return {
        "deployment_id": f"dep_{int(seq)}",
        "target": str(target),
        "revision": int(revision),
        "based_on": int(based_on),
        "expected_revision": None if expected is None else int(expected),
        "image": str(image),
        "writer": str(writer),
        "idempotency_key": key,
        "deployed_at": _base.iso(float(deployed_ts)),
    }


class DeployApi(http_api.Table):
    """The deploy API over HTTP (``effectflow.testing.service`` routes, ``HttpDeploy`` methods).

    A target may contain slashes (``deployment/prod``), so the routes with a suffix come before
    ``GET /deploy/{target}``, and a target whose last segment is ``history`` or ``overwrites``
    cannot be observed over HTTP.
    """

    KIND = DeployTarget.KIND
    get_deployment_by_idempotency_key = http_api.get(
        "/deploy",
        DeployTarget.get_deployment_by_idempotency_key,
        query=("idempotency_key",),
        answer=http_api.Answer.ZERO_OR_ONE,
    )
    deploy = http_api.post(
        "/deploy/{target:path}/deploy",
        DeployTarget.deploy,
        body={"image": http_api.TEXT, "expected_revision": http_api.OPTIONAL_INT},
        headers={"if_match": "If-Match", "idempotency_key": "Idempotency-Key"},
        key="idempotency_key",
    )
    seed = http_api.post(
        "/deploy/{target:path}/seed",
        DeployTarget.seed,
        body={"image": http_api.OPTIONAL_TEXT, "revision": http_api.OPTIONAL_INT},
        answer=http_api.Answer.NONE,
    )
    concurrent_deploy = http_api.post(
        "/deploy/{target:path}/concurrent_deploy",
        DeployTarget.concurrent_deploy,
        body={"image": http_api.TEXT},
    )
    history = http_api.get(
        "/deploy/{target:path}/history", DeployTarget.history, answer=http_api.Answer.LIST
    )
    overwrites = http_api.get(
        "/deploy/{target:path}/overwrites", DeployTarget.overwrites, answer=http_api.Answer.COUNT
    )
    #: The target's state, with its ETag in the ``ETag`` header too.
    observe = http_api.get(
        "/deploy/{target:path}", DeployTarget.observe, answer=http_api.Answer.TAGGED
    )
