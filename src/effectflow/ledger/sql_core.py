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
from effectflow.ledger import expect, records, rowmap
from effectflow.ledger.store import AuditProblem, Batch, DecisionRecord, OperationBinding


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


#: Run statuses a worker executes.
RUNNING = "('running', 'cancelling')"
#: Step statuses whose outcome is not known yet.
IN_DOUBT = "('intent_recorded', 'unknown', 'needs_attention')"


class SQLReads(abc.ABC):
    """The reads both SQL ledgers answer the same way, in statements with ``?`` placeholders.

    A backend gives ``_read`` (run a statement, all its rows) and ``_TIE``: the column that orders
    rows created at the same moment (PostgreSQL's ``insert_seq``; SQLite keeps insertion order
    for equal keys of one index walk, so it needs none).
    """

    #: The tie-breaker column of equal times (empty: none).
    _TIE = ""

    @abc.abstractmethod
    def _read(self, sql: str, params: Sequence[Any]) -> list[Any]:
        """Run a read-only ``sql`` and return all its rows."""

    def _tie(self, alias: str = "", *, desc: bool = False) -> str:
        """``, <alias>insert_seq`` where the backend has a tie-breaker."""
        return f", {alias}{self._TIE}{' DESC' if desc else ''}" if self._TIE else ""

    def get_run(self, run_id: str, *, tenant: str | None = None) -> records.RunRecord | None:
        """The run, or None (None too for another tenant's run)."""
        rows = self._read("SELECT * FROM runs WHERE run_id = ?", (run_id,))
        if not rows or (tenant is not None and rows[0]["tenant"] != tenant):
            return None
        return rowmap.run(rows[0])

    def list_runs(
        self,
        *,
        tenant: str | None,
        statuses: Sequence[str] | None = None,
        limit: int = 100,
        before: float | None = None,
        scope: str | None = None,
        call_id: str | None = None,
    ) -> list[records.RunRecord]:
        """Newest first (of runs created at the same time, the last inserted first)."""
        where, params = filters(tenant=tenant, statuses=statuses)
        if before is not None:
            where.append("created_at < ?")
            params.append(before)
        for name, value in (("scope", scope), ("call_id", call_id)):
            if value is not None:
                where.append(f"{name} = ?")
                params.append(value)
        sql = "SELECT * FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY created_at DESC{self._tie(desc=True)} LIMIT ?"
        return [rowmap.run(r) for r in self._read(sql, [*params, limit])]

    def runs_to_recover(self, *, now: float, limit: int = 100) -> list[records.RunRecord]:
        """Running runs with no live lease."""
        rows = self._read(
            f"SELECT * FROM runs WHERE status IN {RUNNING} "
            "AND (lease_expires_at IS NULL OR lease_expires_at < ?) "
            f"ORDER BY created_at{self._tie()} LIMIT ?",
            (now, limit),
        )
        return [rowmap.run(r) for r in rows]

    def leased_running_runs(self, *, limit: int = 1000) -> list[records.RunRecord]:
        """Running runs that still hold a lease (the runtime checks whether the holder lives)."""
        rows = self._read(
            f"SELECT * FROM runs WHERE status IN {RUNNING} "
            f"AND lease_expires_at IS NOT NULL ORDER BY created_at{self._tie()} LIMIT ?",
            (limit,),
        )
        return [rowmap.run(r) for r in rows]

    def lease_owners(self, *, now: float) -> list[str]:
        """Owners of unexpired leases on running runs."""
        rows = self._read(
            f"SELECT DISTINCT lease_owner FROM runs WHERE status IN {RUNNING} "
            "AND lease_expires_at >= ?",
            (now,),
        )
        return [r["lease_owner"] for r in rows if r["lease_owner"] is not None]

    def steps(self, run_id: str) -> list[records.StepRecord]:
        """Steps in order."""
        rows = self._read("SELECT * FROM steps WHERE run_id = ? ORDER BY seq", (run_id,))
        return [rowmap.step(r) for r in rows]

    def attempts(self, run_id: str, step_id: str | None = None) -> list[records.AttemptRecord]:
        """Attempts in order."""
        if step_id is None:
            rows = self._read(
                f"SELECT * FROM attempts WHERE run_id = ? ORDER BY started_at, number{self._tie()}",
                (run_id,),
            )
        else:
            rows = self._read(
                "SELECT * FROM attempts WHERE run_id = ? AND step_id = ? "
                f"ORDER BY number{self._tie()}",
                (run_id, step_id),
            )
        return [rowmap.attempt(r) for r in rows]

    def effects(
        self,
        *,
        tenant: str | None,
        run_id: str | None = None,
        statuses: Sequence[str] | None = None,
        limit: int = 1000,
    ) -> list[records.EffectRecord]:
        """Effects, oldest first."""
        where, params = filters(tenant=tenant, statuses=statuses)
        if run_id is not None:
            where.append("run_id = ?")
            params.append(run_id)
        sql = "SELECT * FROM effects"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY created_at{self._tie()} LIMIT ?"
        return [rowmap.effect(r) for r in self._read(sql, [*params, limit])]

    def effects_in_doubt(
        self, *, tenant: str | None, now: float, limit: int = 1000
    ) -> list[records.EffectRecord]:
        """In-doubt effects no unexpired lease covers, oldest first."""
        mine = "e.tenant = ? AND " if tenant is not None else ""
        rows = self._read(
            "SELECT e.* FROM effects e JOIN runs r ON r.run_id = e.run_id "
            f"WHERE {mine}e.status IN {IN_DOUBT} "
            f"AND NOT (r.status IN {RUNNING} AND r.lease_expires_at IS NOT NULL "
            f"AND r.lease_expires_at >= ?) ORDER BY e.created_at{self._tie('e.')} LIMIT ?",
            (*([tenant] if tenant is not None else []), now, limit),
        )
        return [rowmap.effect(r) for r in rows]

    def get_effect(
        self, effect_id: str, *, tenant: str | None = None
    ) -> records.EffectRecord | None:
        """One effect, or None."""
        rows = self._read("SELECT * FROM effects WHERE effect_id = ?", (effect_id,))
        if not rows or (tenant is not None and rows[0]["tenant"] != tenant):
            return None
        return rowmap.effect(rows[0])

    def get_operation(self, tenant: str, logical_operation_id: str) -> OperationBinding | None:
        """The binding, or None."""
        rows = self._read(
            "SELECT * FROM operations WHERE tenant = ? AND logical_operation_id = ?",
            (tenant, logical_operation_id),
        )
        return rowmap.operation(rows[0]) if rows else None

    def get_decision(self, tenant: str, decision_id: str) -> DecisionRecord | None:
        """A pinned decision, or None."""
        rows = self._read(
            "SELECT * FROM decisions WHERE tenant = ? AND decision_id = ?", (tenant, decision_id)
        )
        return rowmap.decision(rows[0]) if rows else None

    def get_approval(self, tenant: str, approval_id: str) -> records.ApprovalRecord | None:
        """An approval by id, or None."""
        rows = self._read(
            "SELECT * FROM approvals WHERE tenant = ? AND approval_id = ?", (tenant, approval_id)
        )
        return rowmap.approval(rows[0]) if rows else None

    def approvals(self, run_id: str, step_id: str | None = None) -> list[records.ApprovalRecord]:
        """Approvals oldest first."""
        if step_id is None:
            rows = self._read(
                f"SELECT * FROM approvals WHERE run_id = ? ORDER BY approved_at{self._tie()}",
                (run_id,),
            )
        else:
            rows = self._read(
                "SELECT * FROM approvals WHERE run_id = ? AND step_id = ? "
                f"ORDER BY approved_at{self._tie()}",
                (run_id, step_id),
            )
        return [rowmap.approval(r) for r in rows]

    def audit(self, run_id: str) -> list[records.AuditEvent]:
        """The run's audit events in order."""
        rows = self._read("SELECT * FROM audit WHERE run_id = ? ORDER BY seq", (run_id,))
        return [rowmap.event(r) for r in rows]

    def audit_rows(self, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        """Rows of a read-only query (``?`` placeholders), for ``audit.verify``."""
        return [dict(r) for r in self._read(sql, params)]

    def verify_audit(self, run_id: str | None = None) -> list[AuditProblem]:
        """Recompute every run's chains (or one run's) and compare its rows with their seals
        (``audit.verify``), with the operator's audit key when the ledger is keyed."""
        key: bytes | None = getattr(self, "audit_key", None)
        found = audit_chain.verify(self, run_id, key)
        return [AuditProblem(p.run_id, p.seq, p.message) for p in found]


def filters(*, tenant: str | None, statuses: Sequence[str] | None) -> tuple[list[str], list[Any]]:
    """The WHERE terms (and their parameters) of a listing by tenant and status."""
    where: list[str] = []
    params: list[Any] = []
    if tenant is not None:
        where.append("tenant = ?")
        params.append(tenant)
    if statuses:
        where.append(f"status IN ({', '.join('?' for _ in statuses)})")
        params.extend(statuses)
    return where, params
