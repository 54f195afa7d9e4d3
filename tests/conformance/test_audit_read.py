"""The batched audit reader (``audit_read.materials_batched``) gives every run the same material as
``audit.materials``, field by field, on both backends, tampered rows included, in a number of
statements that grows with the chunks, not the runs; and its chunk statements read through the run
id indexes."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import effectflow as ef
import ledgers
from effectflow.ledger import audit, audit_read
from effectflow.ledger import sqlite as sqlite_backend
from effectflow.ledger.store import LedgerStore, open_store

#: How many of the next ``ar_lost`` calls are lost after they were sent.
LOSE = {"next": 0}
#: Orders whose payment the provider refuses.
REFUSE: set[str] = set()
#: Tables each chunk reads besides ``runs``.
TABLES = ("steps", "effects", "attempts", "approvals", "operations", "decisions", "seals", "audit")
#: Runs in the ledger ``_build`` makes.
RUNS = 39
R = ef.RunStatus

# -- tools and workflows ----------------------------------------------------------------------------


@ef.tool("ar_send", effect="external_write", idempotency=ef.Idempotency(supported=True),
         effect_id="id")  # fmt: skip
def send(to: str, *, idempotency_key: str) -> dict[str, str]:
    return {"id": f"msg-{to}"}


@ef.tool("ar_lost", effect="external_write", effect_id="id")
def lost(to: str) -> dict[str, str]:
    if LOSE["next"]:
        LOSE["next"] -= 1
        raise ef.OutcomeUnknown("the answer was lost")
    return {"id": f"msg-{to}"}


@ef.tool("ar_pay", effect="financial_write", idempotency=ef.Idempotency(supported=True),
         effect_id="receipt")  # fmt: skip
def pay(order: str, *, idempotency_key: str) -> dict[str, str]:
    if order in REFUSE:
        raise ef.Rejected("card declined")
    return {"receipt": f"rcpt-{order}"}


@ef.tool("ar_release", effect="external_write", approval=False)
def release(slot_id: str) -> dict[str, str]:
    return {"released": slot_id}


@ef.tool("ar_reserve", effect="external_write", effect_id="slot_id",
         compensation=ef.Compensation(tool=release, automatic=True))  # fmt: skip
def reserve(name: str) -> dict[str, str]:
    return {"slot_id": f"slot-{name}"}


@ef.tool("ar_report", effect="pure")
def report(n: int) -> int:
    if n < 0:
        raise RuntimeError("the reporting service is down")
    return n * 2


@ef.workflow("ar_mail")
def mail(ctx: ef.Context, to: str, copies: int) -> list[Any]:
    return [ctx.call(f"send{i}", send, to=f"{to}-{i}") for i in range(copies)]


@ef.workflow("ar_lost_mail")
def lost_mail(ctx: ef.Context, to: str) -> Any:
    return ctx.call("send", lost, to=to)


@ef.workflow("ar_order")
def order(ctx: ef.Context, order: str) -> Any:
    sent = ctx.call("notify", send, to=order)
    try:
        paid = ctx.call("pay", pay, order=order)
    except ef.StepRejected:
        return {"declined": order}
    return [sent, paid]


@ef.workflow("ar_trip")
def trip(ctx: ef.Context, names: list[str]) -> Any:
    for name in names:
        ctx.call(f"reserve_{name}", reserve, name=name)
    raise ef.AbandonGoal("the trip was called off")


@ef.workflow("ar_crash")
def crash(ctx: ef.Context, to: str) -> Any:
    ctx.call("send", send, to=to)
    return ctx.call("report", report, n=-1)


# -- the ledger -------------------------------------------------------------------------------------


def _build(url: str) -> None:
    """``RUNS`` runs of every kind the audit reads: plain writes; orders approved, declined,
    refused by the provider, and one cancelled while it waited; compensations; failed runs; guarded
    calls (one a regenerated call of the same operation); in-doubt effects a person resolved with a
    pinned decision; and runs whose key bindings were purged past their retention."""
    with ef.Runtime(url) as rt:
        for i in range(4):
            rt.start(mail, run_id=f"old-{i:02d}", to=f"old{i}", copies=2)
    with ef.Runtime(url, clock=lambda: time.time() + 10**7) as rt:  # past every retention
        assert rt.purge_expired_keys() == 8
    with ef.Runtime(url) as rt:
        for i in range(12):
            rt.start(mail, run_id=f"mail-{i:02d}", to=f"m{i}", copies=1 + i % 5)
        for i in range(8):
            rid = f"order-{i:02d}"
            if i % 4 == 3:
                REFUSE.add(rid)
            assert rt.start(order, run_id=rid, order=rid).status is ef.RunStatus.PAUSED
            if i % 4 == 1:
                rt.reject(rid, "pay", by="ops", reason="not this one")
            else:
                rt.approve(rid, "pay", approver="ops-lead", approval_id=f"APR-{rid}", note="ok")
        assert rt.start(order, run_id="order-cancelled", order="x").status is ef.RunStatus.PAUSED
        rt.cancel("order-cancelled", reason="the customer left", by="ops")
        for i in range(3):
            rt.start(trip, run_id=f"trip-{i:02d}", names=["a", "b", "c"][: i + 1])
        for i in range(2):
            assert rt.start(crash, run_id=f"crash-{i:02d}", to=f"c{i}").status is R.FAILED
        for i in range(5):
            rt.guard(send, {"to": f"g{i}"}, scope=f"thread-{i % 2}", call_id=f"call-{i}")
        rt.guard(send, {"to": "g0"}, scope="thread-0", call_id="call-again")
        for i, committed in enumerate((True, False, True)):
            rid = f"lost-{i:02d}"
            LOSE["next"] = 1
            assert rt.start(lost_mail, run_id=rid, to=f"l{i}").status is R.PAUSED
            [effect] = rt.effects(run_id=rid)
            rt.resolve(effect.effect_id, committed=committed, evidence={"id": f"x-{i}"},
                       by="ops", decision_id=f"DEC-{rid}")  # fmt: skip
            rt.resume(rid)


@pytest.fixture(scope="module", params=ledgers.BACKENDS)
def ledger(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The URL of one varied ledger per backend, built once for the module (tests only read it)."""
    folder = tmp_path_factory.mktemp(f"audit_read_{request.param}")
    with ledgers.fresh(request.param, folder, prefix="ef_aread") as url:
        _build(url)
        yield url


@pytest.fixture
def store(ledger: str) -> Iterator[LedgerStore]:
    """A store on the module's ledger."""
    opened = open_store(ledger)
    yield opened
    opened.close()


def _sql(url: str, statement: str, params: tuple[Any, ...] = ()) -> None:
    """One statement on a connection of its own, around the store (``?`` placeholders)."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(sqlite_backend.parse_url(url)[0])
        try:
            conn.execute(statement, params)
            conn.commit()
        finally:
            conn.close()
        return
    with psycopg.connect(url, autocommit=True) as pg:
        pg.execute(statement.replace("?", "%s"), params)


def _assert_same(found: dict[str, audit.Material], expected: dict[str, audit.Material]) -> None:
    """Equal materials, run for run and field by field, and equal down to each value's type (a
    whole float read back as an int would still compare equal): their ``repr``s match too. The
    order of ``rows`` is not compared (``audit.materials`` reads bindings in no order)."""
    assert list(found) == list(expected)
    for rid, material in expected.items():
        got = found[rid]
        for field in dataclasses.fields(audit.Material):
            mine, theirs = getattr(got, field.name), getattr(material, field.name)
            assert mine == theirs, f"{rid}: {field.name} differs"
            if isinstance(theirs, dict):
                assert {k: repr(v) for k, v in mine.items()} == {
                    k: repr(v) for k, v in theirs.items()
                }, f"{rid}: {field.name}"
            elif isinstance(theirs, list):
                assert [repr(v) for v in mine] == [repr(v) for v in theirs], f"{rid}: {field.name}"
            elif not isinstance(theirs, set):
                assert repr(mine) == repr(theirs), f"{rid}: {field.name}"


def _problems(materials: dict[str, audit.Material]) -> list[audit.Problem]:
    """What ``verify_run`` finds in each material (unkeyed)."""
    return [
        problem
        for material in materials.values()
        for problem in audit.verify_run(material, None, sealed_since=None, shards_since=None)
    ]


# -- the same materials -----------------------------------------------------------------------------


def test_the_ledger_holds_every_kind_of_row(store: LedgerStore) -> None:
    """The ledger has rows in every table the audit reads, purged bindings, pinned decisions,
    guarded calls and every end state, and it verifies."""
    count = {t: store.audit_rows(f"SELECT count(*) AS n FROM {t}", ())[0]["n"] for t in TABLES}
    assert store.audit_rows("SELECT count(*) AS n FROM runs", ())[0]["n"] == RUNS
    assert all(count[t] > 0 for t in TABLES), count
    runs = store.list_runs(tenant=None, limit=1000)
    statuses = {r.status for r in runs}
    assert {R.SUCCEEDED, R.FAILED, R.COMPENSATED, R.CANCELLED_WITH_EFFECTS} <= statuses
    assert any(r.workflow == "effectflow.guarded_call" for r in runs)
    materials = audit.materials(store)
    assert sum(bool(m.purgeable) for m in materials.values()) == 4
    assert sum(any(k.startswith("decisions:") for k in m.rows) for m in materials.values()) == 3
    assert audit.verify(store, None, None) == []


@pytest.mark.parametrize("chunk", [500, 1, 7, RUNS, RUNS - 1])
def test_every_run_reads_the_same_as_run_by_run(store: LedgerStore, chunk: int) -> None:
    """Every run's material equals ``audit.materials``', whatever the chunk size."""
    found = dict(audit_read.materials_batched(store, chunk=chunk))
    _assert_same(found, audit.materials(store))


def test_the_runs_come_in_run_id_order(store: LedgerStore) -> None:
    """Runs are yielded in run id order, each once."""
    ids = [rid for rid, _ in audit_read.materials_batched(store, chunk=5)]
    assert ids == sorted(ids)
    assert len(ids) == len(set(ids)) == RUNS


@pytest.mark.parametrize(
    "rid", ["lost-01", "order-01", "order-03", "order-cancelled", "trip-02", "crash-00", "old-00"]
)
def test_one_run_reads_the_same(store: LedgerStore, rid: str) -> None:
    """``run_id=`` gives that run's material alone, as ``audit.materials(store, run_id)``."""
    found = dict(audit_read.materials_batched(store, rid))
    assert list(found) == [rid]
    _assert_same(found, audit.materials(store, rid))


def test_a_guarded_call_reads_the_same(store: LedgerStore) -> None:
    """Each guarded call's run reads the same alone: the five that bound an operation, and the
    regenerated call that found its operation bound by another run."""
    runs = store.list_runs(tenant=None, limit=1000)
    guarded = [r.run_id for r in runs if r.workflow == "effectflow.guarded_call"]
    bound = 0
    for rid in guarded:
        material = dict(audit_read.materials_batched(store, rid))
        bound += any(k.startswith("operations:") for k in material[rid].rows)
        _assert_same(material, audit.materials(store, rid))
    assert (len(guarded), bound) == (6, 5)


def test_an_unknown_run_reads_nothing(store: LedgerStore) -> None:
    """A run id no run has gives no material, as ``audit.materials``."""
    assert list(audit_read.materials_batched(store, "no-such-run")) == []
    assert audit.materials(store, "no-such-run") == {}


@pytest.mark.parametrize("backend", ledgers.BACKENDS)
def test_an_empty_ledger_reads_nothing(backend: str, tmp_path: Path) -> None:
    """An empty ledger gives no material."""
    with ledgers.fresh(backend, tmp_path, prefix="ef_aread") as url:
        opened = open_store(url)
        try:
            assert list(audit_read.materials_batched(opened)) == []
            assert audit.materials(opened) == {}
        finally:
            opened.close()


class _Proxy:
    """A store of neither backend (here: one that hands every call to a real one)."""

    def __init__(self, store: LedgerStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def test_a_store_of_neither_backend_is_read_run_by_run(store: LedgerStore) -> None:
    """Another kind of store gets no dialect and is read through its own readers, run by run:
    still the same materials, in chunks of runs."""
    proxy = _Proxy(store)
    assert audit_read.dialect_of(proxy) is None
    assert audit_read.dialect_of(store) is not None
    _assert_same(dict(audit_read.materials_batched(proxy, chunk=7)), audit.materials(store))


@pytest.mark.parametrize("chunk", [0, -1, 2.5, True, "7"])
def test_a_bad_chunk_is_refused_at_the_call(store: LedgerStore, chunk: Any) -> None:
    """A chunk size that is not a positive integer is an ArgumentError, before anything is read."""
    with pytest.raises(ef.ArgumentError, match="chunk must be a positive integer"):
        audit_read.materials_batched(store, chunk=chunk)


@pytest.mark.parametrize("backend", ledgers.BACKENDS)
def test_tampered_rows_read_the_same_and_verify_the_same(backend: str, tmp_path: Path) -> None:
    """Rows edited, inserted and deleted behind the ledger's back, and rows of a run that does
    not exist sorting inside a chunk, read as ``audit.materials`` reads them: ``verify_run``
    reports the same problems over either."""
    with ledgers.fresh(backend, tmp_path, prefix="ef_aread") as url:
        with ef.Runtime(url) as rt:
            for i in range(6):
                rt.start(mail, run_id=f"t-{i}", to=f"t{i}", copies=2)
        _sql(url, "UPDATE effects SET status = 'not_committed' WHERE run_id = 't-1'")
        _sql(url, "DELETE FROM steps WHERE run_id = 't-3' AND step_id = 'send0'")
        for rid, approval_id in (("t-2", "APR-X"), ("t-2x", "APR-ORPHAN")):
            _sql(url, "INSERT INTO approvals (approval_id, tenant, run_id, step_id, request_digest, "
                 "approver, note, approved_at) VALUES (?, 'default', ?, 'send0', 'sha256:x', "
                 "'mallory', NULL, 1.0)", (approval_id, rid))  # fmt: skip
        _sql(url, "INSERT INTO audit (run_id, step_id, effect_id, kind, actor, detail_json, at, "
             "prev_hash, hash) VALUES ('t-2x', NULL, NULL, 'forged', 'mallory', '{}', 1.0, 'p', "
             "'h')")  # fmt: skip
        opened = open_store(url)
        try:
            expected = audit.materials(opened)
            for chunk in (1, 2, 500):
                found = dict(audit_read.materials_batched(opened, chunk=chunk))
                _assert_same(found, expected)
                problems = _problems(found)
                assert problems == _problems(expected)
                assert {p.run_id for p in problems} == {"t-1", "t-2", "t-3"}
        finally:
            opened.close()


# -- statements -------------------------------------------------------------------------------------


@pytest.fixture
def counted(store: LedgerStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every statement the store sends its database, counted below its API (SQLite: the
    connection's trace; PostgreSQL: the one method every read of the store goes through)."""
    seen: list[str] = []
    conn = getattr(store, "_conn", None)
    if isinstance(conn, sqlite3.Connection):
        conn.set_trace_callback(seen.append)
        yield seen
        conn.set_trace_callback(None)
        return
    statement = store._statement  # type: ignore[attr-defined]

    def counting(sql: str, params: Any = ()) -> Any:
        seen.append(sql)
        return statement(sql, params)

    monkeypatch.setattr(store, "_statement", counting)
    yield seen


def _refuse_per_run_readers(store: LedgerStore, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the batched reader used a per-run reader")

    for name in ("get_run", "steps", "effects", "attempts", "approvals", "audit"):
        monkeypatch.setattr(store, name, refuse)


@pytest.mark.parametrize("chunk", [1, 7, 13, 500])
def test_statements_grow_with_chunks_not_runs(
    store: LedgerStore, counted: list[str], monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """Per chunk, one statement for its runs rows and one per table (none through the store's
    per-run readers); when the last chunk is full, one more finds the end."""
    _refuse_per_run_readers(store, monkeypatch)
    assert len(list(audit_read.materials_batched(store, chunk=chunk))) == RUNS
    chunks = math.ceil(RUNS / chunk)
    end = RUNS % chunk == 0
    assert len(counted) == (1 + len(TABLES)) * chunks + end, counted
    assert sum(" FROM runs " in sql for sql in counted) == chunks + end


def test_one_run_takes_one_statement_per_table(
    store: LedgerStore, counted: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A single run: its runs row, then one statement per table."""
    _refuse_per_run_readers(store, monkeypatch)
    assert len(list(audit_read.materials_batched(store, "mail-03"))) == 1
    assert len(counted) == 1 + len(TABLES)


def test_run_by_run_takes_statements_per_run(store: LedgerStore, counted: list[str]) -> None:
    """What the batched reader saves: ``audit.materials`` sends at least eight a run (this test
    fails if that changes, and the reader's reason with it)."""
    audit.materials(store)
    assert len(counted) >= 8 * RUNS


# -- query plans ------------------------------------------------------------------------------------

FIRST, LAST = "mail-00", "mail-09"


def _statements(backend: str) -> dict[str, str]:
    dialect = audit_read.sqlite_dialect() if backend == "sqlite" else audit_read.postgres_dialect()
    return {
        "runs (first chunk)": "SELECT * FROM runs ORDER BY run_id LIMIT ?",
        "runs (next chunk)": "SELECT * FROM runs WHERE run_id > ? ORDER BY run_id LIMIT ?",
        **audit_read.chunk_statements(dialect),
    }


def _params(name: str) -> tuple[Any, ...]:
    first_chunks = {"runs (first chunk)": (500,), "runs (next chunk)": (FIRST, 500)}
    return first_chunks.get(name, (FIRST, LAST))


def _sqlite_plan(url: str, sql: str, params: tuple[Any, ...]) -> list[str]:
    conn = sqlite3.connect(sqlite_backend.parse_url(url)[0])
    try:
        return [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params)]
    finally:
        conn.close()


def _pg_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _pg_nodes(child)


def _pg_plan(url: str, sql: str, params: tuple[Any, ...]) -> list[str]:
    """The node types of the plan with sequential scans forbidden: the test tables are tiny, where
    a scan is the planner's right choice, so forbidding it asks whether a usable index exists."""
    with psycopg.connect(url) as conn:
        conn.execute("SET enable_seqscan = off")
        row = conn.execute(f"EXPLAIN (FORMAT JSON) {sql.replace('?', '%s')}", params).fetchone()
        conn.rollback()
    assert row is not None
    document = json.loads(row[0]) if isinstance(row[0], str) else row[0]
    return [node["Node Type"] for node in _pg_nodes(document[0]["Plan"])]


@pytest.mark.parametrize("name", list(_statements("sqlite")))
def test_a_chunk_statement_reads_through_an_index(ledger: str, name: str) -> None:
    """Each chunk statement finds its rows through an index (SQLite: no ``SCAN`` of a table but
    the first chunk's walk of the primary key, in order, to its LIMIT; PostgreSQL: no ``Seq Scan``):
    ``operations`` and ``decisions`` too, through the indexes of ledger version 8."""
    backend = "sqlite" if ledger.startswith("sqlite") else "postgres"
    sql = _statements(backend)[name]
    if backend == "sqlite":
        plan = _sqlite_plan(ledger, sql, _params(name))
        assert not [line for line in plan if re.fullmatch(r"SCAN \w+", line)], (sql, plan)
    else:
        nodes = _pg_plan(ledger, sql, _params(name))
        assert "Seq Scan" not in nodes, (sql, nodes)
