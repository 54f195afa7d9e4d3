"""The hot path's queries use indexes on every backend, so their cost does not grow with the ledger.

Each statement below is the one a backend runs (copied from ``ledger/sqlite.py`` and
``ledger/postgres.py``; the upserts are imported, being generated there), with representative
parameters. SQLite must answer ``EXPLAIN QUERY PLAN`` with a ``SEARCH`` and no ``SCAN`` of a table.
PostgreSQL must plan it without a ``Seq Scan`` under ``enable_seqscan = off``: the test tables are
tiny, where a sequential scan is the planner's right choice, so forbidding it is the honest way to ask
whether a usable index exists at all.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import psycopg
import pytest

from effectflow.ledger import rowmap
from effectflow.ledger import sqlite as sqlite_backend
from effectflow.ledger.store import LedgerStore

if TYPE_CHECKING:
    from conftest import Backend

#: The ledger's tables: a ``SCAN`` of one of them reads every row it holds.
TABLES = ("runs", "steps", "attempts", "effects", "operations", "decisions", "approvals", "audit")

NOW = 1_700_000_000.0

#: name -> (SQLite statement, PostgreSQL statement, parameters shared by both).
STATEMENTS: dict[str, tuple[str, str, tuple[Any, ...]]] = {
    "fenced run update": (
        "UPDATE runs SET lease_expires_at = ? WHERE run_id = ? AND lease_token = ? "
        "RETURNING audit_head, audit_count, control_json",
        "UPDATE runs SET lease_expires_at = %s WHERE run_id = %s AND lease_token = %s "
        "RETURNING audit_head, audit_count, control_json",
        (NOW + 300, "run-1", 3),
    ),
    "unfenced run head": (
        "SELECT audit_head, audit_count, control_json FROM runs WHERE run_id = ?",
        "SELECT audit_head, audit_count, control_json FROM runs WHERE run_id = %s FOR UPDATE",
        ("run-1",),
    ),
    "run changes": (
        "UPDATE runs SET status = ?, updated_at = ? WHERE run_id = ?",
        "UPDATE runs SET status = %s, updated_at = %s WHERE run_id = %s",
        ("succeeded", NOW, "run-1"),
    ),
    "step upsert lookup": (
        "SELECT 1 FROM steps WHERE run_id = ? AND step_id = ?",
        "SELECT 1 FROM steps WHERE run_id = %s AND step_id = %s",
        ("run-1", "s1"),
    ),
    "steps(run_id)": (
        "SELECT * FROM steps WHERE run_id = ? ORDER BY seq",
        "SELECT * FROM steps WHERE run_id = %s ORDER BY seq",
        ("run-1",),
    ),
    "attempts(run_id)": (
        "SELECT * FROM attempts WHERE run_id = ? ORDER BY started_at, number",
        "SELECT * FROM attempts WHERE run_id = %s ORDER BY started_at, number, insert_seq",
        ("run-1",),
    ),
    "attempts(run_id, step_id)": (
        "SELECT * FROM attempts WHERE run_id = ? AND step_id = ? ORDER BY number",
        "SELECT * FROM attempts WHERE run_id = %s AND step_id = %s ORDER BY number, insert_seq",
        ("run-1", "s1"),
    ),
    "get_run": (
        "SELECT * FROM runs WHERE run_id = ?",
        "SELECT * FROM runs WHERE run_id = %s",
        ("run-1",),
    ),
    "get_effect": (
        "SELECT * FROM effects WHERE effect_id = ?",
        "SELECT * FROM effects WHERE effect_id = %s",
        ("eff-1",),
    ),
    "get_operation": (
        "SELECT * FROM operations WHERE tenant = ? AND logical_operation_id = ?",
        "SELECT * FROM operations WHERE tenant = %s AND logical_operation_id = %s",
        ("acme", "op-1"),
    ),
    "claim_runnable subquery": (
        "SELECT run_id FROM runs WHERE status IN ('running', 'cancelling') "
        "AND (lease_expires_at IS NULL OR lease_expires_at < ?) ORDER BY created_at LIMIT ?",
        "SELECT run_id FROM runs WHERE status IN ('running', 'cancelling') "
        "AND (lease_expires_at IS NULL OR lease_expires_at < %s) "
        "ORDER BY created_at, insert_seq LIMIT %s FOR UPDATE SKIP LOCKED",
        (NOW, 10),
    ),
    "claim_runnable subquery with dead owners": (
        "SELECT run_id FROM runs WHERE status IN ('running', 'cancelling') "
        "AND (lease_expires_at IS NULL OR lease_expires_at < ? OR lease_owner IN (?)) "
        "ORDER BY created_at LIMIT ?",
        "SELECT run_id FROM runs WHERE status IN ('running', 'cancelling') "
        "AND (lease_expires_at IS NULL OR lease_expires_at < %s "
        "OR lease_owner = ANY(%s::text[])) "
        "ORDER BY created_at, insert_seq LIMIT %s FOR UPDATE SKIP LOCKED",
        (NOW, "host:1:dead", 10),
    ),
    "lease_owners": (
        "SELECT DISTINCT lease_owner FROM runs WHERE status IN ('running', 'cancelling') "
        "AND lease_expires_at >= ?",
        "SELECT DISTINCT lease_owner FROM runs WHERE status IN ('running', 'cancelling') "
        "AND lease_expires_at >= %s",
        (NOW,),
    ),
    "effects_in_doubt": (
        "SELECT e.* FROM effects e JOIN runs r ON r.run_id = e.run_id "
        "WHERE e.tenant = ? AND e.status IN ('intent_recorded', 'unknown', 'needs_attention') "
        "AND NOT (r.status IN ('running', 'cancelling') AND r.lease_expires_at IS NOT NULL "
        "AND r.lease_expires_at >= ?) ORDER BY e.created_at LIMIT ?",
        "SELECT e.* FROM effects e JOIN runs r ON r.run_id = e.run_id "
        "WHERE e.tenant = %s AND e.status IN ('intent_recorded', 'unknown', 'needs_attention') "
        "AND NOT (r.status IN ('running', 'cancelling') AND r.lease_expires_at IS NOT NULL "
        "AND r.lease_expires_at >= %s) ORDER BY e.created_at, e.insert_seq LIMIT %s",
        ("acme", NOW, 500),
    ),
    "runs_to_recover": (
        "SELECT * FROM runs WHERE status IN ('running', 'cancelling') "
        "AND (lease_expires_at IS NULL OR lease_expires_at < ?) ORDER BY created_at LIMIT ?",
        "SELECT * FROM runs WHERE status IN ('running', 'cancelling') "
        "AND (lease_expires_at IS NULL OR lease_expires_at < %s) "
        "ORDER BY created_at, insert_seq LIMIT %s",
        (NOW, 100),
    ),
    "leased_running_runs": (
        "SELECT * FROM runs WHERE status IN ('running', 'cancelling') "
        "AND lease_expires_at IS NOT NULL ORDER BY created_at LIMIT ?",
        "SELECT * FROM runs WHERE status IN ('running', 'cancelling') "
        "AND lease_expires_at IS NOT NULL ORDER BY created_at, insert_seq LIMIT %s",
        (100,),
    ),
    "list_runs(tenant, statuses)": (
        "SELECT * FROM runs WHERE tenant = ? AND status IN (?, ?) "
        "ORDER BY created_at DESC, rowid DESC LIMIT ?",
        "SELECT * FROM runs WHERE tenant = %s AND status = ANY(%s::text[]) "
        "ORDER BY created_at DESC, insert_seq DESC LIMIT %s",
        ("acme", "running", "failed", 100),
    ),
    "effects(tenant, run_id)": (
        "SELECT * FROM effects WHERE tenant = ? AND run_id = ? ORDER BY created_at LIMIT ?",
        "SELECT * FROM effects WHERE tenant = %s AND run_id = %s "
        "ORDER BY created_at, insert_seq LIMIT %s",
        ("acme", "run-1", 1000),
    ),
    "approvals(run_id, step_id)": (
        "SELECT * FROM approvals WHERE run_id = ? AND step_id = ? ORDER BY approved_at",
        "SELECT * FROM approvals WHERE run_id = %s AND step_id = %s "
        "ORDER BY approved_at, insert_seq",
        ("run-1", "s1"),
    ),
    "audit(run_id)": (
        "SELECT * FROM audit WHERE run_id = ? ORDER BY seq",
        "SELECT * FROM audit WHERE run_id = %s ORDER BY seq",
        ("run-1",),
    ),
}


def _params(name: str, backend: str) -> tuple[Any, ...]:
    params = STATEMENTS[name][2]
    if backend == "postgres" and name == "list_runs(tenant, statuses)":
        return (params[0], list(params[1:3]), params[3])
    if backend == "postgres" and name == "claim_runnable subquery with dead owners":
        return (params[0], [params[1]], params[2])
    return params


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


def _assert_sqlite_indexed(name: str, plan: list[str]) -> None:
    scans = [line for line in plan if re.match(rf"SCAN ({'|'.join(TABLES)})\b", line)]
    assert not scans, f"{name}: SQLite scans a whole table: {plan}"
    assert any(line.startswith("SEARCH") for line in plan), f"{name}: no index search in {plan}"


def _assert_pg_indexed(name: str, plan: dict[str, Any]) -> None:
    nodes = [node["Node Type"] for node in _pg_nodes(plan)]
    assert "Seq Scan" not in nodes, f"{name}: PostgreSQL has no usable index: {nodes}"


@pytest.mark.parametrize("name", list(STATEMENTS))
def test_hot_path_statement_uses_an_index(name: str, backend: Backend, store: LedgerStore) -> None:
    """Each hot-path statement finds its rows through an index, never by reading a whole table."""
    sqlite_sql, pg_sql, _ = STATEMENTS[name]
    params = _params(name, backend.name)
    if backend.name == "sqlite":
        path, _ = sqlite_backend.parse_url(backend.url)
        _assert_sqlite_indexed(name, _sqlite_plan(path, sqlite_sql, params))
    else:
        _assert_pg_indexed(name, _pg_plan(backend.url, pg_sql, params))


def test_claim_runnable_uses_an_index(backend: Backend, store: LedgerStore) -> None:
    """The whole claiming statement (its subquery and the update it feeds) reads through indexes."""
    if backend.name == "sqlite":
        path, _ = sqlite_backend.parse_url(backend.url)
        sql = (
            "UPDATE runs SET lease_owner = ?, lease_token = lease_token + 1, "
            "lease_expires_at = ? WHERE run_id IN (SELECT run_id FROM runs "
            "WHERE status IN ('running', 'cancelling') "
            "AND (lease_expires_at IS NULL OR lease_expires_at < ?) "
            "ORDER BY created_at LIMIT ?) RETURNING *"
        )
        _assert_sqlite_indexed("claim_runnable", _sqlite_plan(path, sql, ("w", NOW, NOW, 10)))
    else:
        sql = (
            "WITH picked AS (SELECT run_id FROM runs "
            "WHERE status IN ('running', 'cancelling') "
            "AND (lease_expires_at IS NULL OR lease_expires_at < %s) "
            "ORDER BY created_at, insert_seq LIMIT %s FOR UPDATE SKIP LOCKED) "
            "UPDATE runs SET lease_owner = %s, lease_token = runs.lease_token + 1, "
            "lease_expires_at = %s FROM picked WHERE runs.run_id = picked.run_id "
            "RETURNING runs.*"
        )
        _assert_pg_indexed("claim_runnable", _pg_plan(backend.url, sql, (NOW, 10, "w", NOW)))


@pytest.mark.parametrize("table", ["steps", "attempts", "effects"])
def test_upserts_resolve_conflicts_through_a_unique_index(
    table: str, backend: Backend, store: LedgerStore
) -> None:
    """The step, attempt and effect upserts scan nothing: their conflict target is a unique index."""
    sql = getattr(rowmap, f"UPSERT_{table.upper().removesuffix('S')}")  # what both stores run
    if backend.name == "postgres":
        sql = sql.replace("?", "%s")
    params = tuple(None for _ in range(sql.count("?" if backend.name == "sqlite" else "%s")))
    if backend.name == "sqlite":
        path, _ = sqlite_backend.parse_url(backend.url)
        plan = _sqlite_plan(path, sql, params)
        assert not [line for line in plan if line.startswith("SCAN")], plan
    else:
        pg_plan = _pg_plan(backend.url, sql, params)
        _assert_pg_indexed(f"{table} upsert", pg_plan)
        assert pg_plan.get("Conflict Arbiter Indexes"), pg_plan
