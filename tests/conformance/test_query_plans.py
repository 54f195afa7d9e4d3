"""The hot path's queries use indexes on every backend, so their cost does not grow with the ledger.

The statements are the stores' own: traced from their connections while a real workload runs
(runs with effects, a person's resolution and approval, a guarded call, recovery, claiming,
heartbeats, the operator's reads), each with the values it was given; the upserts are the stores'
named queries (``ledger/queries/``). SQLite must answer ``EXPLAIN QUERY PLAN`` with no ``SCAN`` of a table.
PostgreSQL must plan it without a ``Seq Scan`` under ``enable_seqscan = off``: the test tables are
tiny, where a sequential scan is the planner's right choice, so forbidding it is the honest way to ask
whether a usable index exists at all.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import psycopg
import pytest

from effectflow.ledger import sqlite as sqlite_backend
from effectflow.ledger.store import LedgerStore

if TYPE_CHECKING:
    from conftest import Backend

#: The ledger's tables: a ``SCAN`` of one of them reads every row it holds.
TABLES = ("runs", "steps", "attempts", "effects", "operations", "decisions", "approvals", "audit")


def _sqlite_plan(path: str, sql: str, params: tuple[Any, ...]) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params)]
    finally:
        conn.close()


def _pg_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _pg_nodes(child)


def _pg_plan(url: str, sql: str, params: tuple[Any, ...] | list[Any]) -> dict[str, Any]:
    with psycopg.connect(url) as conn:
        conn.execute("SET enable_seqscan = off")
        row = conn.execute(f"EXPLAIN (FORMAT JSON) {sql}", params).fetchone()
        conn.rollback()  # EXPLAIN of an UPDATE plans it and changes nothing; roll back regardless
    assert row is not None
    value = row[0]
    document = json.loads(value) if isinstance(value, str) else value
    plan: dict[str, Any] = document[0]["Plan"]
    return plan


def _assert_pg_indexed(name: str, plan: dict[str, Any]) -> None:
    nodes = [node["Node Type"] for node in _pg_nodes(plan)]
    assert "Seq Scan" not in nodes, f"{name}: PostgreSQL has no usable index: {nodes}"


@pytest.mark.parametrize("table", ["steps", "attempts", "effects"])
def test_upserts_resolve_conflicts_through_a_unique_index(
    table: str, backend: Backend, store: LedgerStore
) -> None:
    """The step, attempt and effect upserts scan nothing: their conflict target is a unique index."""
    sql = type(store).SQL[f"upsert_{table.removesuffix('s')}"]  # the store's named query
    params = tuple(None for _ in range(sql.count("?" if backend.name == "sqlite" else "%s")))
    if backend.name == "sqlite":
        path, _ = sqlite_backend.parse_url(backend.url)
        plan = _sqlite_plan(path, sql, params)
        assert not [line for line in plan if line.startswith("SCAN")], plan
    else:
        pg_plan = _pg_plan(backend.url, sql, params)
        _assert_pg_indexed(f"{table} upsert", pg_plan)
        assert pg_plan.get("Conflict Arbiter Indexes"), pg_plan


# -- the statements a workload really runs -------------------------------------------------------

import effectflow as ef  # noqa: E402  (the workload's tools are declared here, below the copies)


@ef.tool("qp_send", effect="external_write", idempotency=ef.Idempotency(supported=True))
def _send(to: str, *, idempotency_key: str) -> dict[str, str]:
    return {"id": f"msg-{to}"}


@ef.tool("qp_lost", effect="external_write", effect_id="id")
def _lost(*, idempotency_key: str) -> dict[str, str]:
    raise ef.OutcomeUnknown("the answer was lost")


@ef.tool("qp_refund", effect="financial_write", idempotency=ef.Idempotency(supported=True))
def _refund(amount: int, *, idempotency_key: str) -> dict[str, Any]:
    return {"id": "rf-1", "amount": amount}


@ef.workflow("qp_case")
def _case(ctx: ef.Context, to: str) -> Any:
    return [ctx.call("first", _send, to=to), ctx.call("second", _send, to=to + "-2")]


@ef.workflow("qp_doubt")
def _doubt(ctx: ef.Context) -> Any:
    return ctx.call("lost", _lost)


@ef.workflow("qp_refund")
def _refund_case(ctx: ef.Context) -> Any:
    return ctx.call("refund", _refund, amount=5)


def _workload(url: str) -> None:
    """What an application does on the hot path: runs with effects, a lost answer a person
    settles, an approval, a guarded call replayed, recovery, and the operator's reads."""
    with ef.Runtime(url) as rt:
        for i in range(3):
            rt.start(_case, run_id=f"case-{i}", to=f"p{i}")
        paused = rt.start(_doubt, run_id="doubt")
        [effect] = rt.effects(run_id=paused.run_id)
        rt.resolve(
            effect.effect_id, committed=True, evidence={"id": "x"}, by="ops", decision_id="d"
        )
        rt.resume("doubt")
        waiting = rt.start(_refund_case, run_id="refund")
        [step] = [s for s in rt.steps(waiting.run_id) if s.step_id == "refund"]
        rt.approve(waiting.run_id, step.step_id, approver="ops", approval_id="a-1")
        rt.resume("refund")
        for _ in range(2):
            rt.guard(_send, {"to": "g"}, scope="thread-1", call_id="call-1")
        rt.recover()
        rt.runs(limit=10)
        rt.runs(scope="thread-1", call_id="call-1")
        rt.effects(run_id="case-0")
        rt.attempts("case-0")
        rt.audit("case-0")
        # what workers run: claiming (with a dead owner's runs), heartbeats, the keys' purge
        store: Any = rt.store
        now = time.time()
        store.claim_runnable(owner="w1", ttl=5, now=now, limit=5, dead_owners=["w0"])
        store.heartbeat([("case-0", 1)], ttl=5, now=now)
        store.purge_expired_keys(now=now)


#: Statements that read a whole (small or one-off) table on purpose.
_WHOLE_TABLE_ON_PURPOSE = (
    "schema_migrations",  # the migration runner, once a process
    "audit_shards",  # 65 rows, read by primary key
)


def _captured_sqlite(url: str) -> list[str]:
    seen: list[str] = []
    original = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = original(*args, **kwargs)
        conn.set_trace_callback(seen.append)  # the statements with their values expanded
        return conn

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sqlite3, "connect", connect)
        _workload(url)
    return seen


def _captured_postgres(url: str) -> list[tuple[str, Any]]:
    seen: list[tuple[str, Any]] = []
    execute, executemany = psycopg.Cursor.execute, psycopg.Cursor.executemany

    def traced(self: Any, query: Any, params: Any = None, *args: Any, **kwargs: Any) -> Any:
        seen.append((str(query), params))
        return execute(self, query, params, *args, **kwargs)

    def traced_many(self: Any, query: Any, params_seq: Any, *args: Any, **kwargs: Any) -> Any:
        rows = list(params_seq)
        if rows:
            seen.append((str(query), rows[0]))
        return executemany(self, query, rows, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(psycopg.Cursor, "execute", traced)
        patch.setattr(psycopg.Cursor, "executemany", traced_many)
        _workload(url)
    return seen


def _touches_a_ledger_table(sql: str) -> bool:
    words = re.findall(r"\b(FROM|INTO|UPDATE|JOIN)\s+(\w+)", sql, re.IGNORECASE)
    return any(table in TABLES for _, table in words) and not any(
        table in sql for table in _WHOLE_TABLE_ON_PURPOSE
    )


def test_every_statement_the_hot_path_runs_uses_an_index(
    backend: Backend, store: LedgerStore
) -> None:
    """Not copies: the statements the stores run for a real workload (traced from their
    connections, with the values they were given) each find their rows through an index."""
    store.close()
    if backend.name == "sqlite":
        path, _ = sqlite_backend.parse_url(backend.url)
        statements = {s for s in _captured_sqlite(backend.url) if _touches_a_ledger_table(s)}
        assert len(statements) > 20, statements  # the workload ran through the store
        for sql in sorted(statements):
            plain_insert = sql.lstrip().upper().startswith("INSERT") and not (
                "SELECT" in sql.upper() or "ON CONFLICT" in sql.upper()
            )
            if plain_insert:
                continue  # it reads nothing
            plan = _sqlite_plan(path, sql, ())
            scans = [line for line in plan if re.match(rf"SCAN ({'|'.join(TABLES)})\b", line)]
            assert not scans, f"SQLite scans a whole table for {sql}: {plan}"
    else:
        captured = _captured_postgres(backend.url)
        distinct = {sql: params for sql, params in captured if _touches_a_ledger_table(sql)}
        assert len(distinct) > 20, distinct
        for sql, params in sorted(distinct.items()):
            if sql.lstrip().upper().startswith("INSERT") and "SELECT" not in sql.upper():
                continue
            if sql.lstrip().upper().startswith("DECLARE"):
                continue  # a server-side cursor: verify's stream of seals, a whole scan on purpose
            _assert_pg_indexed(sql, _pg_plan(backend.url, sql, params or ()))
