"""What both SQL ledgers do the same way, written once: a batch applied inside a transaction.

A batch is applied in the backend's transaction on its connection. The run's row is locked first,
by the fence (``UPDATE ... WHERE lease_token = ... RETURNING``), by the insert of a new run, or by
a plain read that the backend locks (``FOR UPDATE`` on PostgreSQL, where SQLite's ``BEGIN
IMMEDIATE`` has locked the file already). Then the batch's expectations are checked, its operation
bindings, decisions and approvals inserted (a taken id refuses the batch on its own,
``IdempotencyConflict``), its steps, effects and attempts upserted, its audit events chained onto
the run's head, its seal made, and the run's row updated. The seal itself is appended by the
backend once every batch of the transaction is written (``audit.chain_shards``).

A backend supplies four hooks, each taking statements with ``?`` placeholders: ``_one`` (run, read
one row), ``_exec`` (run, nothing to read: PostgreSQL's pipeline sends it with the next round
trip), ``_many`` (one statement over many rows), and ``_wrote`` (after a batch: PostgreSQL's
NOTIFY). ``_LOCK_RUN`` is what locks a run's row for a batch without a fence.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

from effectflow import digests, errors
from effectflow.ledger import audit as audit_chain
from effectflow.ledger import expect, rowmap
from effectflow.ledger.store import Batch, OperationBinding


class SQLCore(abc.ABC):
    """The write path shared by ``SQLiteStore`` and ``PostgresStore`` (see the module)."""

    #: The operator's audit key (None: unkeyed); set by the backend.
    audit_key: bytes | None
    #: What locks a run's row for a batch without a fence, after ``SELECT ... WHERE run_id = ?``.
    _LOCK_RUN = ""

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
            if self._one(conn, rowmap.INSERT_DECISION, values) is None:
                raise errors.IdempotencyConflict(
                    f"decision {decision.decision_id} is taken already; nothing was recorded",
                    run_id=batch.run_id,
                    effect_id=decision.effect_id,
                )
        for approval in batch.approvals:
            values = rowmap.row_values(approval, rowmap.APPROVAL_FIELDS)
            if self._one(conn, rowmap.INSERT_APPROVAL, values) is None:
                raise errors.IdempotencyConflict(
                    f"approval {approval.approval_id} is taken already; nothing was recorded",
                    run_id=batch.run_id,
                    step_id=approval.step_id,
                )
        written: dict[str, list[list[Any]]] = {}
        for table, sql, names, found in (
            ("steps", rowmap.UPSERT_STEP, rowmap.STEP_FIELDS, batch.steps),
            ("effects", rowmap.UPSERT_EFFECT, rowmap.EFFECT_FIELDS, batch.effects),
            ("attempts", rowmap.UPSERT_ATTEMPT, rowmap.ATTEMPT_FIELDS, batch.attempts),
        ):
            if found:
                values = written[table] = [rowmap.row_values(r, names) for r in found.values()]
                self._many(conn, sql, values)
        changes = dict(batch.run_changes)
        if batch.audit:
            events, changes["audit_head"], changes["audit_count"] = chain_events(
                batch, head["audit_head"], head["audit_count"], self.audit_key
            )
            self._many(conn, rowmap.INSERT_AUDIT, events)
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
            assignments = ", ".join(f"{rowmap.column(k)} = ?" for k in changes)
            self._exec(
                conn,
                f"UPDATE runs SET {assignments} WHERE run_id = ?",
                [*(rowmap.value(k, v) for k, v in changes.items()), batch.run_id],
            )
        self._wrote(conn, batch, changes)
        seal = None if sealed is None else sealed[0]
        if "control" in changes:
            return changes["control"], seal
        return rowmap.loads(head["control_json"]), seal

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
            head = self._one(conn, rowmap.INSERT_RUN, [*values, audit_chain.genesis(run.run_id)])
            if head is None:
                raise errors.IdempotencyConflict(
                    f"run id {run.run_id!r} is taken; nothing of this batch was written",
                    run_id=run.run_id,
                )
        if batch.lease_token is not None:
            head = self._one(
                conn,
                "UPDATE runs SET lease_expires_at = ? WHERE run_id = ? AND lease_token = ? "
                f"RETURNING {rowmap.HEAD}",
                (now + lease_ttl, batch.run_id, batch.lease_token),
            )
            if head is None:
                raise errors.LeaseLost(
                    f"run {batch.run_id}: lease token {batch.lease_token} is no longer current; "
                    "another worker owns the run, so this process writes nothing",
                    run_id=batch.run_id,
                )
        elif head is None:
            head = self._one(
                conn,
                f"SELECT {rowmap.HEAD} FROM runs WHERE run_id = ?{self._LOCK_RUN}",
                (batch.run_id,),
            )
            if head is None:
                raise errors.RunNotFound(f"run {batch.run_id} does not exist", run_id=batch.run_id)
        return head

    def _check_txn(self, conn: Any, run_id: str, expectation: expect.Expectation) -> None:
        """Refuse the batch (``StaleState``) unless ``expectation`` holds, read under the run's
        lock (so no other writer of the run can change it before the batch commits)."""
        row = self._one(conn, expect.QUERIES[expectation.subject], expectation.params(run_id))
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
        if self._one(conn, rowmap.BIND_OPERATION, rowmap.row_values(op, rowmap.OPERATION_FIELDS)):
            return
        row = self._one(
            conn,
            "SELECT request_digest, run_id, step_id FROM operations "
            "WHERE tenant = ? AND logical_operation_id = ?",
            (op.tenant, op.logical_operation_id),
        )
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
        digest = audit_chain.event_hash(
            prev,
            run_id=batch.run_id,
            step_id=draft.step_id,
            effect_id=draft.effect_id,
            kind=draft.kind,
            actor=draft.actor,
            detail=draft.detail,
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
                digests.canonical_json(draft.detail),
                draft.at,
                prev,
                digest,
            )
        )
        prev = digest
        count += 1
    return rows, prev, count
