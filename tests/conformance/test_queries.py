"""The ledger's SQL is its named queries, one file per dialect (``ledger/queries/``), and the two files
agree: the same names, the same columns in the records' order, statuses the records know.

What each statement costs is ``test_query_plans.py``'s (it traces what the stores really run); this
module holds the files to their shape, so a statement added to one dialect and not the other, a
column list out of step with its record, or a status written as a literal in Python fails here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from effectflow.ledger import expect, queries, records, rowmap
from effectflow.ledger.store import DecisionRecord, OperationBinding

SRC = Path(__file__).resolve().parents[2] / "src" / "effectflow"
LEDGER = SRC / "ledger"


def _shared(dialect: str) -> set[str]:
    return {q.name for q in queries.load(dialect).values() if q.only is None}


def test_both_dialects_define_the_same_names() -> None:
    """Every statement not marked as one dialect's own is in both files."""
    sqlite, postgres = _shared("sqlite"), _shared("postgres")
    assert sqlite - postgres == set(), "in sqlite.sql only: add them to postgres.sql or mark them"
    assert postgres - sqlite == set(), "in postgres.sql only: add them to sqlite.sql or mark them"
    assert len(sqlite) > 40


#: How code asks for a named statement: ``SQL["x"]`` (a store's, ``store.SQL["x"]`` too),
#: ``sql["x"]`` (a dialect's statements in a local), ``_named("x"``.
_ASKS = re.compile(r'(?:\bSQL\[|\bsql\[|(?<!\w)_named\()"([a-z0-9_]+)"')


def _asking_files() -> list[Path]:
    """Every module of the ledger (its packages too, ``audit/``), and every other module of the
    package that asks for a named statement (the CLI's probe of keyed seals)."""
    ledger = set(LEDGER.rglob("*.py"))
    others = {
        p for p in SRC.rglob("*.py") if p not in ledger and _ASKS.search(p.read_text("utf-8"))
    }
    return sorted(ledger | others)


def test_the_name_scan_reads_the_audit_package_and_the_cli() -> None:
    """The scan below reads the audit package and the CLI, which ask for names too: a scan that
    missed them would pass a name no file defines."""
    scanned = {p.relative_to(SRC).as_posix() for p in _asking_files()}
    assert {"ledger/audit/verify.py", "ledger/audit/material.py", "cli/main.py"} <= scanned


def _names_in_code() -> tuple[set[str], set[str]]:
    """The names the package's code asks for (``SQL["x"]``, ``sql["x"]``, ``_named("x"``), and
    every string literal the files that ask hold (a name passed on, as the upserts' are)."""
    asked: set[str] = set()
    literals: set[str] = set()
    for path in _asking_files():
        text = path.read_text("utf-8")
        asked.update(_ASKS.findall(text))
        literals.update(re.findall(r'"([a-z0-9_]+)"', text))
    # The expectations' reads are named by their subject (``sql_core._check_txn``).
    expected = {f"expect_{subject.value}" for subject in expect.Subject}
    return asked, literals | expected


@pytest.mark.parametrize("dialect", queries.DIALECTS)
def test_every_statement_is_used_and_every_use_is_defined(dialect: str) -> None:
    """A store asks only for names its file defines, and its file holds no statement nobody runs."""
    defined = set(queries.load(dialect))
    asked, mentioned = _names_in_code()
    own_of_other = {
        q.name for d in queries.DIALECTS if d != dialect for q in queries.load(d).values() if q.only
    }
    assert asked - own_of_other - defined == set(), f"{dialect}.sql lacks them"
    assert defined - mentioned == set(), f"{dialect}.sql defines statements no store runs"


#: Each insert's columns: its record's fields in order (as ``rowmap.row_values`` sends them).
INSERTS = {
    "insert_run": [*rowmap.RUN_COLUMNS, "audit_head", "audit_count"],
    "upsert_step": [rowmap.column(f) for f in rowmap.STEP_FIELDS],
    "upsert_attempt": [rowmap.column(f) for f in rowmap.ATTEMPT_FIELDS],
    "upsert_effect": [rowmap.column(f) for f in rowmap.EFFECT_FIELDS],
    "insert_decision": rowmap.fields(DecisionRecord),
    "insert_approval": rowmap.fields(records.ApprovalRecord),
    "bind_operation": rowmap.fields(OperationBinding),
    "insert_audit": [
        "run_id",
        "step_id",
        "effect_id",
        "kind",
        "actor",
        "detail_json",
        "at",
        "prev_hash",
        "hash",
    ],
}
#: Each upsert's columns that a conflict leaves as the insert wrote them: its keys, and the
#: indexed columns a record never changes (SQLite rewrites the index entries of every SET column).
KEPT = {
    "upsert_step": {"run_id", "step_id"},
    "upsert_attempt": {"attempt_id", "run_id", "step_id", "number"},
    "upsert_effect": {"effect_id", "run_id", "step_id", "created_at", "compensates"},
}


def _columns(sql: str) -> list[str]:
    found = re.search(r"INSERT INTO \w+ \(([^)]*)\)", sql)
    assert found, sql
    return [c.strip() for c in found.group(1).split(",")]


@pytest.mark.parametrize("dialect", queries.DIALECTS)
@pytest.mark.parametrize("name", sorted(INSERTS))
def test_insert_columns_follow_the_record(dialect: str, name: str) -> None:
    """An insert names its record's columns in field order, with one placeholder each."""
    sql = queries.statements(dialect)[name]
    assert _columns(sql) == INSERTS[name]
    values = re.search(r"VALUES\s*\(([^)]*)\)", sql)
    assert values, sql
    marks = [v.strip() for v in values.group(1).split(",")]
    mark = "?" if dialect == "sqlite" else "%s"
    sent = len(INSERTS[name]) - (1 if name == "insert_run" else 0)  # audit_count starts at 0
    assert marks.count(mark) == sent


@pytest.mark.parametrize("dialect", queries.DIALECTS)
@pytest.mark.parametrize("name", sorted(KEPT))
def test_upserts_update_every_column_but_their_keys(dialect: str, name: str) -> None:
    """A conflict updates every column the record may change, and none it must keep."""
    sql = queries.statements(dialect)[name]
    updated = re.findall(r"(\w+) = excluded\.(\w+)", sql)
    assert all(a == b for a, b in updated)
    assert {a for a, _ in updated} == set(INSERTS[name]) - KEPT[name]


def test_the_dialects_statements_differ_only_where_the_dialects_do() -> None:
    """Written with each dialect's placeholders, the shared write path's statements are the same
    text: a change made to one file and not the other shows here."""
    sqlite, postgres = queries.statements("sqlite"), queries.statements("postgres")
    same = [
        "insert_run", "update_run", "expect_run", "expect_step", "expect_effect",
        "expect_unapproved", "insert_decision", "insert_approval", "bind_operation",
        "operation_bound", "upsert_step", "upsert_attempt", "upsert_effect", "insert_audit",
        "insert_seal", "update_shard", "used_shards", "claim", "purge_expired_keys",
        "insert_purge_record", "checkpoint_outcome", "get_run", "steps_of_run", "get_effect",
        "get_operation", "get_decision", "get_approval", "audit_of_run", "applied_migrations",
        "schema_version",
    ]  # fmt: skip
    for name in same:
        assert sqlite[name].replace("?", "%s") == postgres[name], name
    # The fence moves the lease forward only, each dialect with its own function (SQLite has no
    # GREATEST; its two-argument max is NULL when either is, so its placeholder comes twice).
    assert "GREATEST(lease_expires_at, %s)" in postgres["fence_run"]
    assert "COALESCE(max(lease_expires_at, ?1), lease_expires_at, ?1)" in sqlite["fence_run"]
    tail = sqlite["fence_run"].split("\n", 1)[1].replace("?2", "%s").replace("?3", "%s")
    assert tail == postgres["fence_run"].split("\n", 1)[1]


#: Verification's statements that are one text in both dialects (placeholders aside).
AUDIT_SAME = [
    "migration_applied_at", "run_heads", "run_head", "operations_of_run", "decisions_of_effect",
    "seals_of_run", "purge_records", "shard_rows", "chained_seals", "chained_seals_of_shard",
    "exported_shard_heads", "orphan_runs", "orphan_decisions", "keyed_seal", "chunk_first_runs",
    "chunk_next_runs", "chunk_steps", "chunk_operations", "chunk_seals", "chunk_audit",
]  # fmt: skip
#: Verification's chunk reads that PostgreSQL ends with its tie-breaker, and the tie-breaker.
AUDIT_TIE_BROKEN = {
    "chunk_effects": "insert_seq",
    "chunk_attempts": "insert_seq",
    "chunk_approvals": "insert_seq",
    "chunk_decisions": "e.insert_seq",
}


def _flat(sql: str) -> str:
    return " ".join(sql.split())


def test_verifications_statements_differ_only_by_postgres_tie_breakers() -> None:
    """What ``verify`` reads is the same text in both dialects, but for the ``insert_seq`` that
    PostgreSQL's orders end with (its tables have it; SQLite's index walks keep insertion order)."""
    sqlite, postgres = queries.statements("sqlite"), queries.statements("postgres")
    for name in AUDIT_SAME:
        assert _flat(sqlite[name]).replace("?", "%s") == _flat(postgres[name]), name
    for name, tie in AUDIT_TIE_BROKEN.items():
        assert f"{_flat(sqlite[name]).replace('?', '%s')}, {tie}" == _flat(postgres[name]), name


def _order(sql: str) -> str:
    found = re.search(r"ORDER BY (.*?)(?: LIMIT \S+)?$", _flat(sql))
    assert found, sql
    return found.group(1)


#: Each chunk read and the reader of one run whose order it keeps (after the run id).
CHUNK_READERS = {
    "chunk_steps": "steps_of_run",
    "chunk_effects": "list_effects",
    "chunk_attempts": "attempts_of_run",
    "chunk_approvals": "approvals_of_run",
    "chunk_seals": "seals_of_run",
    "chunk_audit": "audit_of_run",
}


@pytest.mark.parametrize("dialect", queries.DIALECTS)
def test_a_chunk_read_orders_a_runs_rows_as_its_reader_of_one_run(dialect: str) -> None:
    """The batched reader builds the materials the run-by-run one does only if each table's rows
    of a run come in the same order: each chunk read orders by the run id, then by its one-run
    reader's order (decisions by their effects', through the join)."""
    sql = queries.statements(dialect)
    for chunk, reader in CHUNK_READERS.items():
        assert _order(sql[chunk]) == f"run_id, {_order(sql[reader])}", chunk
    effects = ", ".join(f"e.{c}" for c in _order(sql["list_effects"]).split(", "))
    assert _order(sql["chunk_decisions"]) == f"e.run_id, {effects}"


def test_postgres_statements_hold_no_question_mark() -> None:
    """A PostgreSQL statement passes ``audit_rows``' conversion of ``?`` placeholders unchanged
    (the audit code hands the store its own named statements through it)."""
    assert [n for n, sql in queries.statements("postgres").items() if "?" in sql] == []


#: A data statement's start: what the ledger's Python must not hold as a string.
_DATA_STATEMENT = re.compile(r"\b(?:SELECT\s|INSERT\s+INTO\s|UPDATE\s+\S+\s+SET\s|DELETE\s+FROM\s)")
#: The ledger's Python that may hold SQL, by module and function, each with why.
SQL_IN_PYTHON = {
    ("upgrades.py", "canonical_json_columns"): (
        "migration 8's rewrite of every JSON column: a read and an update built over the tables "
        "and their JSON columns, run once when the migration is applied"
    ),
    ("postgres.py", "_from_json"): (
        "the one-round-trip function's statements are the named inserts and upserts themselves, "
        "their VALUES made a read of the batch's JSON rows (queries/postgres_apply.sql's marks)"
    ),
}


def _strings(tree: ast.AST) -> list[tuple[str, str, int]]:
    """Every string of a module that is not a docstring, ``(text, enclosing function, line)``;
    an f-string as its text with ``{}`` for each value."""
    found: list[tuple[str, str, int]] = []

    def text(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            return "".join(text(v) or "{}" for v in node.values)
        return None

    def visit(node: ast.AST, function: str) -> None:
        body = getattr(node, "body", None)
        docstring = None
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            if body and isinstance(body[0], ast.Expr):
                docstring = body[0].value
            if not isinstance(node, (ast.Module, ast.ClassDef)):
                function = node.name
        for child in ast.iter_child_nodes(node):
            if child is docstring or (isinstance(child, ast.Expr) and child.value is docstring):
                continue
            value = text(child)
            if value is not None:
                found.append((value, function, child.lineno))  # type: ignore[attr-defined]
            elif not isinstance(child, ast.FormattedValue):
                visit(child, function)

    visit(tree, "")
    return found


def test_no_data_statement_in_the_ledgers_python() -> None:
    """Every SELECT, INSERT, UPDATE and DELETE the ledger runs (its packages too: ``audit/``) is a
    named query of its dialect files, but the few listed in ``SQL_IN_PYTHON`` with the reason.
    Transaction control (``BEGIN``, ``SAVEPOINT``, ``COMMIT``) is not a statement of that kind;
    the simulated providers under ``testing/`` are not the ledger, and keep their own tables."""
    found: list[str] = []
    allowed_hit: set[tuple[str, str]] = set()
    for path in sorted(LEDGER.rglob("*.py")):
        where = path.relative_to(LEDGER).as_posix()
        for value, function, line in _strings(ast.parse(path.read_text("utf-8"))):
            if not _DATA_STATEMENT.search(value):
                continue
            if (where, function) in SQL_IN_PYTHON:
                allowed_hit.add((where, function))
            else:
                found.append(f"ledger/{where}:{line} ({function or 'module'}): {value[:60]!r}")
    assert found == [], "move them into ledger/queries/<dialect>.sql as named queries"
    assert allowed_hit == set(SQL_IN_PYTHON), "an exception no longer needed: drop it"


def test_the_scan_for_data_statements_sees_them() -> None:
    """The scan above finds a statement written as a string, an f-string or one split over
    literals, and passes a docstring that names SQL."""
    source = (
        '"""A module: SELECT words FROM a docstring."""\n'
        "A = 'SELECT * FROM runs'\n"
        "def f(t):\n"
        '    """UPDATE x SET y in a docstring."""\n'
        "    return f'UPDATE {t} SET n = ?'\n"
        "B = ('DELETE ' 'FROM audit')\n"
    )
    hits = [(v, f) for v, f, _ in _strings(ast.parse(source)) if _DATA_STATEMENT.search(v)]
    assert hits == [
        ("SELECT * FROM runs", ""),
        ("UPDATE {} SET n = ?", "f"),
        ("DELETE FROM audit", ""),
    ]


_STATUSES = {s.value for s in records.RunStatus} | {s.value for s in records.StepStatus}


@pytest.mark.parametrize("dialect", queries.DIALECTS)
def test_statuses_in_the_queries_are_statuses_the_records_know(dialect: str) -> None:
    """Every status a statement names as a literal is a run or step status of the records."""
    named = set()
    for sql in queries.statements(dialect).values():
        for group in re.findall(r"status\s+IN\s*\(([^)]*)\)", sql):
            named.update(re.findall(r"'([a-z_]+)'", group))
    assert named, "the statements name statuses"
    assert named - _STATUSES == set()


def test_no_status_literal_in_python_sql() -> None:
    """A status is written as SQL only in the named queries: no ``status IN ('...')`` or
    ``status = '...'`` in the package's Python (the simulated providers' own tables aside)."""
    pattern = re.compile(r"status\s*(?:IN\s*\(\s*|=\s*)'(" + "|".join(sorted(_STATUSES)) + r")'")
    found = []
    for path in SRC.rglob("*.py"):
        if "testing" in path.relative_to(SRC).parts:
            continue
        for number, line in enumerate(path.read_text("utf-8").splitlines(), start=1):
            if pattern.search(line):
                found.append(f"{path.relative_to(SRC)}:{number}: {line.strip()}")
    assert found == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("SELECT 1;", "a statement before any '-- name:' line"),
        ("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;", "query 'a' is defined twice"),
        ("-- name: a\n-- why\n", "query 'a' has no statement"),
        ("-- name: a\nSELECT 1; SELECT 2;", "query 'a' holds more than one statement"),
    ],
)
def test_a_broken_query_file_says_where(text: str, message: str) -> None:
    """A query file that breaks the format is refused with its line and what is wrong."""
    with pytest.raises(queries.QueryFileError, match=re.escape(message)) as caught:
        queries.parse(text, "x.sql")
    assert str(caught.value).startswith("x.sql:")


def test_a_query_keeps_its_doc_and_drops_comments_inside() -> None:
    """The comment under a name is its doc; comments inside the statement are not sent."""
    found = queries.parse(
        "-- name: get_it (sqlite only)\n-- Why it is so.\nSELECT 1\n-- inside\nFROM t;\n", "x.sql"
    )
    query = found["get_it"]
    assert (query.sql, query.doc, query.only, query.line) == (
        "SELECT 1\nFROM t",
        "Why it is so.",
        "sqlite",
        1,
    )


def test_the_one_trip_function_runs_the_named_statements() -> None:
    """PostgreSQL's one-round-trip function (``queries/postgres_apply.sql``) writes a batch's rows
    with the named inserts and upserts of ``postgres.sql``, their VALUES read from the batch's
    JSON rows: a column added to a named statement is written by the function too."""
    from effectflow.ledger import postgres

    function = _flat(postgres.apply_function())
    sql = queries.statements("postgres")
    for name in ("insert_run", "bind_operation", "upsert_step", "upsert_effect", "upsert_attempt",
                 "insert_audit", "insert_seal"):  # fmt: skip
        columns = ", ".join(_columns(sql[name]))
        assert f"({columns}) SELECT {columns} FROM json_populate_recordset(" in function, name
        tail = _flat(sql[name]).split(" RETURNING ")[0]
        if " ON CONFLICT " in tail:
            assert tail[tail.index(" ON CONFLICT ") :] + ";" in function, name
    assert "@" not in function.split("$fn$")[1], "a mark the template did not fill"
