"""The reads both SQL ledgers answer the same way, written once: each a named query of the
backend's dialect (``ledger/queries/<dialect>.sql``), rows mapped by ``rowmap``.

A backend gives ``_read`` (run a statement, all its rows), ``_MARK`` (its placeholder), ``_in`` (a
column's term for a list of values) and ``_qmark`` (``audit``'s ``?`` statements in its dialect).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from effectflow.ledger import audit as audit_chain
from effectflow.ledger import records, rowmap
from effectflow.ledger.store import AuditProblem, DecisionRecord, OperationBinding


class SQLReads(abc.ABC):
    """The reads both SQL ledgers answer the same way, each a named query of the dialect (``SQL``).

    A backend gives ``_read`` (run a statement, all its rows), ``_MARK`` (its placeholder) and
    ``_in`` (a column's term for a list of values: ``IN (?, ?)`` or ``= ANY(%s)``).
    """

    #: The dialect's named statements (``queries.statements``).
    SQL: ClassVar[Mapping[str, str]]
    #: The dialect's placeholder.
    _MARK: ClassVar[str]

    @abc.abstractmethod
    def _read(self, sql: str, params: Sequence[Any]) -> list[Any]:
        """Run a read-only ``sql`` and return all its rows."""

    @abc.abstractmethod
    def _in(self, column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
        """The term ``column`` is one of ``values``, and its parameters."""

    @abc.abstractmethod
    def _qmark(self, sql: str) -> str:
        """A statement written with ``?`` placeholders (``audit``'s) in the dialect's."""

    def _named(self, name: str, params: Sequence[Any]) -> list[Any]:
        return self._read(self.SQL[name], params)

    def get_run(self, run_id: str, *, tenant: str | None = None) -> records.RunRecord | None:
        """The run, or None (None too for another tenant's run)."""
        rows = self._named("get_run", (run_id,))
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
        where, params = self._filters(tenant=tenant, statuses=statuses)
        mark = self._MARK
        for term, value in (
            (f"created_at < {mark}", before),
            (f"scope = {mark}", scope),
            (f"call_id = {mark}", call_id),
        ):
            if value is not None:
                where.append(term)
                params.append(value)
        sql = self.SQL["list_runs"].format(where=" AND ".join(where) or "1 = 1")
        return [rowmap.run(r) for r in self._read(sql, [*params, limit])]

    def runs_to_recover(self, *, now: float, limit: int = 100) -> list[records.RunRecord]:
        """Running runs with no live lease."""
        return [rowmap.run(r) for r in self._named("runs_to_recover", (now, limit))]

    def leased_running_runs(self, *, limit: int = 1000) -> list[records.RunRecord]:
        """Running runs that still hold a lease (the runtime checks whether the holder lives)."""
        return [rowmap.run(r) for r in self._named("leased_running_runs", (limit,))]

    def lease_owners(self, *, now: float) -> list[str]:
        """Owners of unexpired leases on running runs."""
        rows = self._named("lease_owners", (now,))
        return [r["lease_owner"] for r in rows if r["lease_owner"] is not None]

    def steps(self, run_id: str) -> list[records.StepRecord]:
        """Steps in order."""
        return [rowmap.step(r) for r in self._named("steps_of_run", (run_id,))]

    def attempts(self, run_id: str, step_id: str | None = None) -> list[records.AttemptRecord]:
        """Attempts in order."""
        if step_id is None:
            rows = self._named("attempts_of_run", (run_id,))
        else:
            rows = self._named("attempts_of_step", (run_id, step_id))
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
        where, params = self._filters(tenant=tenant, statuses=statuses)
        if run_id is not None:
            where.append(f"run_id = {self._MARK}")
            params.append(run_id)
        sql = self.SQL["list_effects"].format(where=" AND ".join(where) or "1 = 1")
        return [rowmap.effect(r) for r in self._read(sql, [*params, limit])]

    def effects_in_doubt(
        self, *, tenant: str | None, now: float, limit: int = 1000
    ) -> list[records.EffectRecord]:
        """In-doubt effects no unexpired lease covers, oldest first."""
        mine = f"e.tenant = {self._MARK} AND " if tenant is not None else ""
        rows = self._read(
            self.SQL["effects_in_doubt"].format(where=mine),
            (*([tenant] if tenant is not None else []), now, limit),
        )
        return [rowmap.effect(r) for r in rows]

    def get_effect(
        self, effect_id: str, *, tenant: str | None = None
    ) -> records.EffectRecord | None:
        """One effect, or None."""
        rows = self._named("get_effect", (effect_id,))
        if not rows or (tenant is not None and rows[0]["tenant"] != tenant):
            return None
        return rowmap.effect(rows[0])

    def get_operation(self, tenant: str, logical_operation_id: str) -> OperationBinding | None:
        """The binding, or None."""
        rows = self._named("get_operation", (tenant, logical_operation_id))
        return rowmap.operation(rows[0]) if rows else None

    def get_decision(self, tenant: str, decision_id: str) -> DecisionRecord | None:
        """A pinned decision, or None."""
        rows = self._named("get_decision", (tenant, decision_id))
        return rowmap.decision(rows[0]) if rows else None

    def get_approval(self, tenant: str, approval_id: str) -> records.ApprovalRecord | None:
        """An approval by id, or None."""
        rows = self._named("get_approval", (tenant, approval_id))
        return rowmap.approval(rows[0]) if rows else None

    def approvals(self, run_id: str, step_id: str | None = None) -> list[records.ApprovalRecord]:
        """Approvals oldest first."""
        if step_id is None:
            rows = self._named("approvals_of_run", (run_id,))
        else:
            rows = self._named("approvals_of_step", (run_id, step_id))
        return [rowmap.approval(r) for r in rows]

    def audit(self, run_id: str) -> list[records.AuditEvent]:
        """The run's audit events in order."""
        return [rowmap.event(r) for r in self._named("audit_of_run", (run_id,))]

    def audit_rows(self, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        """Rows of a read-only query, for ``audit.verify``: written with ``?`` placeholders, or one
        of the dialect's own named statements (``SQL``; PostgreSQL's hold no ``?``, so they pass
        the conversion unchanged: ``tests/conformance/test_queries.py``)."""
        return [dict(r) for r in self._read(self._qmark(sql), params)]

    def verify_audit(self, run_id: str | None = None) -> list[AuditProblem]:
        """Recompute every run's chains (or one run's) and compare its rows with their seals
        (``audit.verify``), with the operator's audit key when the ledger is keyed."""
        key: bytes | None = getattr(self, "audit_key", None)
        found = audit_chain.verify(self, run_id, key)
        return [AuditProblem(p.run_id, p.seq, p.message) for p in found]

    def _filters(
        self, *, tenant: str | None, statuses: Sequence[str] | None
    ) -> tuple[list[str], list[Any]]:
        """The WHERE terms (and their parameters) of a listing by tenant and status."""
        where: list[str] = []
        params: list[Any] = []
        if tenant is not None:
            where.append(f"tenant = {self._MARK}")
            params.append(tenant)
        if statuses:
            term, values = self._in("status", statuses)
            where.append(term)
            params.extend(values)
        return where, params
