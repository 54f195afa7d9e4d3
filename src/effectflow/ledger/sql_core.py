"""What both SQL ledgers do the same way, written once: a batch applied inside a transaction.

A batch is applied in the backend's transaction on its connection. The run's row is locked first,
by the fence (``UPDATE ... WHERE lease_token = ... RETURNING`` on PostgreSQL; on SQLite, whose
``BEGIN IMMEDIATE`` has locked the file already, a read ``WHERE lease_token = ...``), by the insert
of a new run, or by a plain read that the backend locks (``FOR UPDATE`` on PostgreSQL). Then the
batch's expectations are checked, its operation bindings, decisions and approvals inserted (a taken
id refuses the batch on its own, ``IdempotencyConflict``), its steps, effects and attempts
upserted, its audit events chained onto the run's head, its seal made, and the run's row updated
once (on SQLite with the lease's extension the fence did not write). The seal itself is appended by the
backend once every batch of the transaction is written (``audit.chain_shards``).

Every statement is a named query of the backend's dialect (``SQL``, from
``ledger/queries/<dialect>.sql``), so what differs between the dialects (placeholders, ``FOR
UPDATE``, tie-breakers) is in their files, not here. A backend supplies four hooks: ``_one`` (run,
read one row), ``_exec`` (run, nothing to read: PostgreSQL's pipeline sends it with the next round
trip), ``_many`` (one statement over many rows), and ``_wrote`` (after a batch: PostgreSQL's
NOTIFY); and ``_MARK``, its placeholder, for the few statements whose terms only the call knows.
"""

from __future__ import annotations

import abc
import dataclasses
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar

from effectflow import digests, errors
from effectflow.ledger import audit as audit_chain
from effectflow.ledger import expect, records, rowmap
from effectflow.ledger.store import (
    Applied,
    Batch,
    Claimed,
    OperationBinding,
)

#: The channel a transaction that leaves a run for workers announces it on (PostgreSQL's
#: ``NOTIFY``; SQLite's workers poll); the payload is the run id.
CHANNEL = "effectflow_runnable"


@dataclasses.dataclass(frozen=True)
class Composed:
    """A batch composed on its run's head (``SQLCore._compose``): what its statements send."""

    #: The column values of its steps, effects and attempts, by table (in the batch's order).
    written: dict[str, list[list[Any]]]
    #: Its audit rows, chained onto the head (``insert_audit``'s values).
    events: list[tuple[Any, ...]]
    #: What it sets on the run (fields, and the chains' heads and lengths).
    changes: dict[str, Any]
    #: Its seal's values without their place in the shard's chain (None: nothing to seal).
    seal: list[Any] | None
    #: The run's control request after the batch.
    control: dict[str, Any] | None


class SQLCore(abc.ABC):
    """The write path shared by ``SQLiteStore`` and ``PostgresStore`` (see the module)."""

    #: The operator's audit key (None: unkeyed); set by the backend.
    audit_key: bytes | None
    #: The dialect's name (``queries.DIALECTS``): which named queries, which batched reader.
    DIALECT: ClassVar[str]
    #: The dialect's named statements (``queries.statements``).
    SQL: ClassVar[Mapping[str, str]]
    #: The dialect's placeholder.
    _MARK: ClassVar[str]

    # -- the backend's hooks ------------------------------------------------------------------

    @abc.abstractmethod
    def _one(self, conn: Any, sql: str, params: Sequence[Any]) -> rowmap.Row | None:
        """Run ``sql`` (``?`` placeholders) and read its first row (None: no row)."""

    @abc.abstractmethod
    def _exec(self, conn: Any, sql: str, params: Sequence[Any]) -> None:
        """Run ``sql`` whose result is not read."""

    @abc.abstractmethod
    def _many(self, conn: Any, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run ``sql`` once per row of ``rows``."""

    @abc.abstractmethod
    def _wrote(self, conn: Any, batch: Batch, changes: dict[str, Any]) -> None:
        """After a batch's writes, in its transaction (PostgreSQL wakes waiting workers)."""

    @abc.abstractmethod
    def _rows(self, conn: Any, sql: str, params: Sequence[Any]) -> Sequence[rowmap.Row]:
        """Run ``sql`` and read all its rows."""

    @abc.abstractmethod
    def _seal_txn(self, conn: Any, seals: list[list[Any]]) -> None:
        """Append a transaction's seals, each chained into its shard (last in the transaction)."""

    @abc.abstractmethod
    def _batch_txn(self, *, deferrable: bool = False) -> AbstractContextManager[Any]:
        """The transaction a batch (or a group of them) is applied in: SQLite's ``BEGIN
        IMMEDIATE`` (``deferrable``: its outcome may commit at NORMAL), PostgreSQL's pipelined
        transaction (``deferrable``: an asynchronous commit); its connection."""

    def _riding_txn(self) -> AbstractContextManager[Any]:
        """The transaction of a batch that rides the run's next flushed commit (``Batch.rides``):
        SQLite commits it at NORMAL; by default it is flushed like any other (PostgreSQL)."""
        return self._batch_txn()

    def _txn_for(self, batches: Sequence[Batch]) -> AbstractContextManager[Any]:
        """The transaction ``batches`` commit in: one that rides when every batch rides (a run's
        start, or the starts of runs begun together on asyncio); else flushed, or deferred when
        every batch may be (a start grouped with deferrable batches defers with them)."""
        if all(b.rides for b in batches):
            return self._riding_txn()
        return self._batch_txn(deferrable=all(b.deferrable or b.rides for b in batches))

    @abc.abstractmethod
    def _plain_txn(self) -> AbstractContextManager[Any]:
        """A transaction whose statements run one after the other (no pipeline)."""

    @abc.abstractmethod
    def _write_rows(self, sql: str, params: Sequence[Any] | Mapping[str, Any]) -> Sequence[Any]:
        """One writing statement in a transaction of its own; its rows."""

    def _claim_rows(self, or_dead: str, params: dict[str, Any]) -> Sequence[Any]:
        """The claimed runs' rows, each with the ``previous_owner`` of its lease: one statement
        where the dialect can return a row's old values with its new ones."""
        return self._write_rows(self.SQL["claim_runnable"].format(or_dead=or_dead), params)

    @abc.abstractmethod
    def _in_named(
        self, column: str, name: str, values: Sequence[Any]
    ) -> tuple[str, dict[str, Any]]:
        """The term ``column`` is one of ``values``, with named parameters under ``name``."""

    #: Group commit locks runs in run-id order (PostgreSQL: two transactions sharing runs cannot
    #: deadlock); SQLite's one writer needs no order.
    _ORDER_BY_RUN: ClassVar[bool] = False
    #: The columns that order claimed runs created at the same moment, after ``created_at``.
    _TIE_COLUMNS: ClassVar[tuple[str, ...]] = ()
    #: A fenced batch checks its token by a read (``fence_read``) and extends the lease in its
    #: one UPDATE of the run at the end (SQLite: ``BEGIN IMMEDIATE`` holds the file's write lock,
    #: so nothing can move the token between the two); otherwise ``fence_run``'s UPDATE takes the
    #: row's lock first (PostgreSQL) and the run is updated a second time for the batch's changes.
    _FENCE_BY_READ: ClassVar[bool] = False

    def _savepoint(self, conn: Any) -> None:
        """Open the savepoint one batch of a group runs in."""
        conn.execute("SAVEPOINT batch")

    def _rollback_savepoint(self, conn: Any) -> None:
        """Undo what one refused batch of a group wrote."""
        conn.execute("ROLLBACK TO SAVEPOINT batch")

    # -- transactions -------------------------------------------------------------------------

    def apply(self, batch: Batch, *, lease_ttl: float, now: float) -> dict[str, Any] | None:
        """Commit one batch in one transaction (see ``LedgerStore.apply``)."""
        with self._txn_for((batch,)) as conn:
            control, seal = self._apply_txn(conn, batch, lease_ttl=lease_ttl, now=now)
            self._seal_txn(conn, [seal] if seal else [])
            return control

    def apply_many(
        self, batches: Sequence[Batch], *, lease_ttl: float, now: float
    ) -> list[Applied]:
        """Group commit: every batch in one transaction, each inside a savepoint so one refused
        batch does not sink the others; the seals are appended last."""
        results: list[Applied | None] = [None] * len(batches)
        order = list(range(len(batches)))
        if self._ORDER_BY_RUN:
            # Stable: batches of one run keep their order.
            order.sort(key=lambda i: batches[i].run_id)
        seals: list[list[Any]] = []
        with self._txn_for(batches) as conn:
            for i in order:
                self._savepoint(conn)
                try:
                    control, seal = self._apply_txn(conn, batches[i], lease_ttl=lease_ttl, now=now)
                except (
                    errors.LeaseLost,
                    errors.IdempotencyConflict,
                    errors.RunNotFound,
                    errors.StaleState,
                ) as exc:
                    self._rollback_savepoint(conn)
                    results[i] = Applied(error=exc)
                else:
                    results[i] = Applied(control=control)
                    if seal:
                        seals.append(seal)
                conn.execute("RELEASE SAVEPOINT batch")
            self._seal_txn(conn, seals)
        return [r for r in results if r is not None]

    # -- leases -------------------------------------------------------------------------------

    def claim_runnable(
        self,
        *,
        owner: str,
        ttl: float,
        now: float,
        limit: int,
        dead_owners: Sequence[str] = (),
    ) -> list[Claimed]:
        """Lease the oldest runnable runs, and those a dead owner held (see
        ``LedgerStore.claim_runnable``); rows another claimer is taking are never taken twice
        (SQLite: one writer; PostgreSQL: ``FOR UPDATE SKIP LOCKED``)."""
        params: dict[str, Any] = {"owner": owner, "expires": now + ttl, "now": now, "limit": limit}
        or_dead = ""
        dead = list(dict.fromkeys(dead_owners))
        if dead:
            term, named = self._in_named("lease_owner", "dead", dead)
            or_dead = f" OR {term}"
            params.update(named)
        rows = list(self._claim_rows(or_dead, params))
        rows.sort(key=lambda r: (r["created_at"], *(r[c] for c in self._TIE_COLUMNS)))
        return [Claimed(rowmap.run(r), r["previous_owner"]) for r in rows]

    def claim(
        self, run_id: str, *, owner: str, expected_token: int, ttl: float, now: float
    ) -> records.RunRecord | None:
        """Take the lease by compare-and-swap on the token (see ``LedgerStore.claim``)."""
        rows = self._write_rows(self.SQL["claim"], (owner, now + ttl, run_id, expected_token))
        return rowmap.run(rows[0]) if rows else None

    def release(self, run_id: str, *, token: int) -> None:
        """Give the lease up (PostgreSQL announces a run still to execute to waiting workers)."""
        self._write_rows(
            self.SQL["release"], {"run_id": run_id, "token": token, "channel": CHANNEL}
        )

    def purge_expired_keys(self, *, now: float) -> int:
        """Drop bindings past retention whose step is settled, each leaving a hashed purge record
        (``purged_keys``) that ``verify`` accepts as why a sealed binding is gone."""
        with self._plain_txn() as conn:
            purged = self._rows(conn, self.SQL["purge_expired_keys"], (now,))
            gone = [
                (r["tenant"], r["logical_operation_id"], r["run_id"], r["key_expires_at"])
                for r in purged
            ]
            kept = audit_chain.tombstones(gone, now, self.audit_key)
            if kept:
                self._many(conn, self.SQL["insert_purge_record"], kept)
            return len(purged)

    # -- migrations ---------------------------------------------------------------------------

    @abc.abstractmethod
    def _migrations(self) -> list[tuple[int, str, str]]:
        """The backend's packaged migrations, ``(version, name, sql)`` in order."""

    @abc.abstractmethod
    def _run_script(self, conn: Any, sql: str) -> None:
        """Run one migration's SQL script."""

    @abc.abstractmethod
    def _describe(self) -> str:
        """How messages name this ledger (its file, or "this PostgreSQL ledger")."""

    @abc.abstractmethod
    def _lock_migrations(self, conn: Any) -> None:
        """Make processes that open the ledger at once apply each migration once."""

    def migrate(self) -> list[int]:
        """Apply the migrations this ledger has not seen, in one transaction; returns the
        versions applied.

        Raises:
            errors.LedgerFileError: the ledger is newer than this effectflow (nothing changed).
        """
        applied: list[int] = []
        with self._plain_txn() as conn:
            self._lock_migrations(conn)
            self._exec(conn, self.SQL["create_migrations_table"], ())
            rows = self._rows(conn, self.SQL["applied_migrations"], ())
            done = {int(r["version"]) for r in rows}
            known = self._migrations()[-1][0]
            if done and max(done) > known:
                import effectflow

                raise errors.LedgerFileError(
                    f"{self._describe()} is at schema version {max(done)}; this effectflow "
                    f"({effectflow.__version__}) knows versions up to {known}. Upgrade effectflow "
                    "to open it (pip install -U effectflow); nothing was changed"
                )
            for version, name, sql in self._migrations():
                if version in done:
                    continue
                self._run_script(conn, sql)
                self._after_migration(conn, version)
                self._exec(conn, self.SQL["record_migration"], (version, name))
                applied.append(version)
            # Steps through the write path write with today's statements, so they run once every
            # script is applied (version 9 re-seals steps with the column version 11 added).
            for version in applied:
                self._through_write_path(conn, version)
        return applied

    def _after_migration(self, conn: Any, version: int) -> None:  # noqa: B027 - a hook
        """What a migration does right after its SQL, in its transaction: nothing both dialects
        share (PostgreSQL overrides it for its version 8)."""

    def _through_write_path(self, conn: Any, version: int) -> None:
        """What a migration does through the write path, once every pending script ran."""
        if version == 9:
            self._migrate_awaiting_approval(conn)

    def _migrate_awaiting_approval(self, conn: Any) -> None:
        """Migration 9: each step waiting for an approval as ``pending`` + ``approval_required``
        becomes ``awaiting_approval`` in a batch of its run (a sealed, chained write with the
        event ``step_status_migrated``), so the audit chains verify across the upgrade.

        Raises:
            errors.LedgerFileError: the ledger is keyed and this process has no audit key, so the
                new seals could not be keyed; nothing was changed.
        """
        waiting = [rowmap.step(r) for r in self._rows(conn, self.SQL["legacy_approval_waits"], ())]
        if not waiting:
            return
        keyed = self._rows(conn, self.SQL["keyed_seal"], (audit_chain.KEYED + "%",))
        if keyed and self.audit_key is None:
            raise errors.LedgerFileError(
                f"this ledger is keyed, and upgrading it to version 9 re-seals {len(waiting)} "
                "step(s) waiting for an approval: set EFFECTFLOW_AUDIT_KEY to the ledger's audit "
                "key and open it again. Nothing was changed (it is still at version 8)"
            )
        now = time.time()
        seals = []
        for step in waiting:
            batch = Batch(step.run_id, lease_token=None)
            batch.step(
                dataclasses.replace(
                    step, status=records.StepStatus.AWAITING_APPROVAL, updated_at=now
                )
            )
            batch.event(
                "step_status_migrated",
                now,
                step_id=step.step_id,
                actor="effectflow (ledger migration 9)",
                was=records.StepStatus.PENDING.value,
                now=records.StepStatus.AWAITING_APPROVAL.value,
            )
            _, seal = self._apply_txn(conn, batch, lease_ttl=0.0, now=now)
            if seal:
                seals.append(seal)
        self._seal_txn(conn, seals)

    # -- one batch ----------------------------------------------------------------------------

    def _apply_txn(
        self, conn: Any, batch: Batch, *, lease_ttl: float, now: float
    ) -> tuple[dict[str, Any] | None, list[Any] | None]:
        """Write one batch in the caller's transaction; returns the run's control request and the
        batch's seal, which the caller appends once the transaction's batches are written."""
        head = self._lock_run(conn, batch, lease_ttl=lease_ttl, now=now)
        # The run's row is locked now (by the fence, the insert or the read): every other writer
        # of the run waits, and each statement from here reads what the last one committed.
        for expectation in batch.expectations:
            self._check_txn(conn, batch.run_id, expectation)
        for op in batch.operations:
            self._bind_operation_txn(conn, op)
        for decision in batch.decisions:
            values = rowmap.row_values(decision, rowmap.DECISION_FIELDS)
            if self._one(conn, self.SQL["insert_decision"], values) is None:
                raise errors.IdempotencyConflict(
                    f"decision {decision.decision_id} is taken already; nothing was recorded",
                    run_id=batch.run_id,
                    effect_id=decision.effect_id,
                )
        for approval in batch.approvals:
            values = rowmap.row_values(approval, rowmap.APPROVAL_FIELDS)
            if self._one(conn, self.SQL["insert_approval"], values) is None:
                raise errors.IdempotencyConflict(
                    f"approval {approval.approval_id} is taken already; nothing was recorded",
                    run_id=batch.run_id,
                    step_id=approval.step_id,
                )
        composed = self._compose(batch, head, now=now)
        for table, sql in (
            ("steps", "upsert_step"),
            ("effects", "upsert_effect"),
            ("attempts", "upsert_attempt"),
        ):
            if table in composed.written:
                self._many(conn, self.SQL[sql], composed.written[table])
        if composed.events:
            self._many(conn, self.SQL["insert_audit"], composed.events)
        self._update_run(conn, batch, composed.changes, lease_ttl=lease_ttl, now=now)
        self._wrote(conn, batch, composed.changes)
        return composed.control, composed.seal

    def _compose(self, batch: Batch, head: rowmap.Row, *, now: float) -> Composed:
        """What a batch writes once its run's head is known: its rows' column values, its audit
        events chained onto the head, its seal, and the run's changes. No statement: PostgreSQL
        composes a batch on the head it expects and sends it whole (``postgres.PostgresStore``)."""
        written: dict[str, list[list[Any]]] = {}
        for table, names, found in (
            ("steps", rowmap.STEP_FIELDS, batch.steps),
            ("effects", rowmap.EFFECT_FIELDS, batch.effects),
            ("attempts", rowmap.ATTEMPT_FIELDS, batch.attempts),
        ):
            if found:
                written[table] = [rowmap.row_values(r, names) for r in found.values()]
        changes = dict(batch.run_changes)
        events: list[tuple[Any, ...]] = []
        if batch.audit:
            events, changes["audit_head"], changes["audit_count"] = chain_events(
                batch, head["audit_head"], head["audit_count"], self.audit_key
            )
        sealed = audit_chain.seal_batch(
            batch,
            rowmap.run_state(head),
            head["seal_head"],
            head["seal_count"],
            changes,
            changes.get("audit_head", head["audit_head"]),
            changes.get("audit_count", head["audit_count"]),
            now,
            self.audit_key,
            written,
        )
        if sealed is not None:
            changes["seal_head"], changes["seal_count"] = sealed[1], sealed[2]
        if changes:
            changes.setdefault("updated_at", now)
        control = changes["control"] if "control" in changes else rowmap.loads(head["control_json"])
        return Composed(written, events, changes, None if sealed is None else sealed[0], control)

    def _update_run(
        self, conn: Any, batch: Batch, changes: dict[str, Any], *, lease_ttl: float, now: float
    ) -> None:
        """The batch's one UPDATE of its run: its changes, and, when the fence was a read and the
        batch renews its lease (``Batch.renews_lease``), the lease's extension, never back — unless
        the batch changes the lease itself (a run ending gives it up), whose change is kept."""
        values = {rowmap.column(k): rowmap.value(k, v) for k, v in changes.items()}
        assignments = [f"{column} = {self._MARK}" for column in values]
        params = list(values.values())
        renews = self._FENCE_BY_READ and batch.lease_token is not None and batch.renews_lease
        if renews and "lease_expires_at" not in values:
            # Forward only (SQLite's two-argument max; NULL-safe): a heartbeat that read a later
            # clock may have renewed it already.
            mark = self._MARK
            assignments.insert(
                0, f"lease_expires_at = COALESCE(max(lease_expires_at, {mark}), {mark})"
            )
            params[:0] = [now + lease_ttl, now + lease_ttl]
        if not assignments:
            return
        self._exec(
            conn,
            self.SQL["update_run"].format(assignments=", ".join(assignments)),
            [*params, batch.run_id],
        )

    def _lock_run(self, conn: Any, batch: Batch, *, lease_ttl: float, now: float) -> rowmap.Row:
        """Insert the batch's new run, or fence its lease, or lock its row: its head either way.

        Raises:
            errors.IdempotencyConflict: the new run's id is taken.
            errors.LeaseLost: the batch's lease token is no longer current.
            errors.RunNotFound: an unfenced batch names no run.
        """
        head = None
        if batch.new_run is not None:
            run = batch.new_run
            values = rowmap.row_values(run, rowmap.RUN_FIELDS)
            head = self._one(
                conn, self.SQL["insert_run"], [*values, audit_chain.genesis(run.run_id)]
            )
            if head is None:
                raise errors.IdempotencyConflict(
                    f"run id {run.run_id!r} is taken; nothing of this batch was written",
                    run_id=run.run_id,
                )
        if batch.lease_token is not None:
            if self._FENCE_BY_READ:
                head = self._one(conn, self.SQL["fence_read"], (batch.run_id, batch.lease_token))
            else:
                until = now + lease_ttl if batch.renews_lease else None  # None: left as it is
                head = self._one(
                    conn, self.SQL["fence_run"], (until, batch.run_id, batch.lease_token)
                )
            if head is None:
                raise errors.LeaseLost(
                    f"run {batch.run_id}: lease token {batch.lease_token} is no longer current; "
                    "another worker owns the run, so this process writes nothing",
                    run_id=batch.run_id,
                )
        elif head is None:
            head = self._one(conn, self.SQL["lock_run"], (batch.run_id,))
            if head is None:
                raise errors.RunNotFound(f"run {batch.run_id} does not exist", run_id=batch.run_id)
        return head

    def _check_txn(self, conn: Any, run_id: str, expectation: expect.Expectation) -> None:
        """Refuse the batch (``StaleState``) unless ``expectation`` holds, read under the run's
        lock (so no other writer of the run can change it before the batch commits)."""
        sql = self.SQL[f"expect_{expectation.subject.value}"]
        row = self._one(conn, sql, expectation.params(run_id))
        found: Any = None
        if row is not None:
            found = rowmap.EXPECTED_ROW[expectation.subject](row)
        refused = expect.refusal(expectation, run_id, found)
        if refused is not None:
            raise refused

    def _bind_operation_txn(self, conn: Any, op: OperationBinding) -> None:
        """Bind a logical operation to its request and step, once.

        ON CONFLICT without a target also covers the key's own uniqueness: a key bound to another
        operation finds no row below and is refused too. (RETURNING, not rowcount: in
        PostgreSQL's pipeline only a fetched result is known.)

        Raises:
            errors.IdempotencyConflict: the operation is bound to another request, or another
                step is making it at this moment (that step answers this one).
        """
        values = rowmap.row_values(op, rowmap.OPERATION_FIELDS)
        if self._one(conn, self.SQL["bind_operation"], values):
            return
        row = self._one(conn, self.SQL["operation_bound"], (op.tenant, op.logical_operation_id))
        if row is None or row["request_digest"] != op.request_digest:
            raise errors.IdempotencyConflict(
                f"logical operation {op.logical_operation_id!r} is already bound to another "
                "request; a new request needs a new operation id",
                run_id=op.run_id,
                step_id=op.step_id,
                idempotency_key=op.idempotency_key,
            )
        if (row["run_id"], row["step_id"]) != (op.run_id, op.step_id):
            # Two steps reached the intent of one operation at the same moment: one makes it.
            raise errors.IdempotencyConflict(
                f"logical operation {op.logical_operation_id!r} is being made by run "
                f"{row['run_id']} (step {row['step_id']}); this step is answered by it",
                run_id=op.run_id,
                step_id=op.step_id,
                idempotency_key=op.idempotency_key,
            )


def chain_events(
    batch: Batch, prev: str, count: int, key: bytes | None
) -> tuple[list[tuple[Any, ...]], str, int]:
    """The batch's audit rows chained onto ``prev``; returns them with the new head and length."""
    rows = []
    for draft in batch.audit:
        detail_json = digests.canonical_json(draft.detail)  # printed once: hashed and stored
        digest = audit_chain.event_hash_of_text(
            prev,
            run_id=batch.run_id,
            step_id=draft.step_id,
            effect_id=draft.effect_id,
            kind=draft.kind,
            actor=draft.actor,
            detail_json=detail_json,
            at=draft.at,
            key=key,
        )
        rows.append(
            (
                batch.run_id,
                draft.step_id,
                draft.effect_id,
                draft.kind,
                draft.actor,
                detail_json,
                draft.at,
                prev,
                digest,
            )
        )
        prev = digest
        count += 1
    return rows, prev, count
