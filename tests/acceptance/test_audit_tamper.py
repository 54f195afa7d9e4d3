"""Tamper evidence, attacked on copies of a real ledger on both backends: `effectflow audit verify`
reports every tampering with its own exit code (4), with and without the operator's key, and says
plainly what an unkeyed ledger cannot show."""

from __future__ import annotations

import contextlib
import json
import shutil
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

import effectflow as ef
import ledgers
from effectflow import digests
from effectflow.cli import main as cli_main
from effectflow.ledger import audit

KEY = "k" * 32
SENT: list[str] = []


@ef.tool("tp_send", effect="external_write", idempotency=ef.Idempotency(supported=True),
         effect_id="id")  # fmt: skip
def send(to: str, *, idempotency_key: str) -> dict[str, str]:
    SENT.append(to)
    return {"id": f"msg-{to}"}


@ef.tool("tp_lost", effect="external_write", effect_id="id")
def lost(*, idempotency_key: str) -> dict[str, str]:
    raise ef.OutcomeUnknown("the answer was lost")


@ef.workflow("tp_case")
def case(ctx: ef.Context, to: str) -> list[Any]:
    return [ctx.call("first", send, to=to), ctx.call("second", send, to=to + "-copy")]


@ef.workflow("tp_doubt")
def doubt(ctx: ef.Context) -> Any:
    return ctx.call("lost", lost)


class Ledger:
    """SQL on one copy of the ledger, whatever its backend."""

    def __init__(self, url: str) -> None:
        self.url = url

    def sql(self, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        if self.url.startswith("sqlite"):
            conn = sqlite3.connect(self.url.removeprefix("sqlite:///"))
            try:
                rows = conn.execute(statement, params).fetchall()
                conn.commit()
                return rows
            finally:
                conn.close()
        with psycopg.connect(self.url, autocommit=True) as pg:
            cur = pg.execute(statement.replace("?", "%s"), params)
            return cur.fetchall() if cur.description else []

    def unprotect(self) -> None:
        """What an attacker with write access does first: the append-only triggers go."""
        for table in ("audit", "seals"):
            for what in ("update", "delete"):
                self.sql(f"DROP TRIGGER IF EXISTS {table}_no_{what}" + (
                    "" if self.url.startswith("sqlite") else f" ON {table}"))  # fmt: skip


def _build(url: str) -> None:
    """Three runs: two finished with two effects each, one whose effect a person resolved."""
    with ef.Runtime(url) as rt:
        rt.start(case, run_id="keep", to="a")
        rt.start(case, run_id="victim", to="b")
        paused = rt.start(doubt, run_id="doubt")
        assert paused.status is ef.RunStatus.PAUSED
        [effect] = rt.effects(run_id="doubt")
        rt.resolve(effect.effect_id, committed=True, evidence={"id": "x-1"}, by="ops")


@pytest.fixture(params=["unkeyed", "keyed"])
def keyed(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    if request.param == "keyed":
        monkeypatch.setenv(audit.KEY_ENV, KEY)
    else:
        monkeypatch.delenv(audit.KEY_ENV, raising=False)
    return request.param == "keyed"


@pytest.fixture(params=ledgers.BACKENDS)
def original(request: pytest.FixtureRequest, tmp_path: Path, keyed: bool) -> Iterator[str]:
    with ledgers.fresh(request.param, tmp_path / "orig", prefix="ef_tamper") as url:
        (tmp_path / "orig").mkdir(exist_ok=True)
        _build(url)
        yield url


@contextlib.contextmanager
def _copy(original: str, tmp_path: Path) -> Iterator[Ledger]:
    if original.startswith("sqlite"):
        target = tmp_path / f"copy-{uuid.uuid4().hex[:6]}.db"
        shutil.copy(original.removeprefix("sqlite:///"), target)
        yield Ledger(f"sqlite:///{target}")
        return
    name = f"ef_tcopy_{uuid.uuid4().hex[:10]}"
    source = original.rsplit("/", 1)[1]
    with psycopg.connect(ledgers.PG, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{source}"')
    try:
        yield Ledger(ledgers.PG.rsplit("/", 1)[0] + "/" + name)
    finally:
        with psycopg.connect(ledgers.PG, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _verify(url: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli_main.app, ["audit", "verify", "--db", url, *args])
    return result.exit_code, result.output


# -- the tamperings --------------------------------------------------------------------------


def _edit_effect_status(db: Ledger) -> None:
    db.sql(
        "UPDATE effects SET status = 'not_committed' WHERE run_id = 'victim' AND step_id = 'first'"
    )


def _edit_step_output(db: Ledger) -> None:
    col = "output_json"
    value = '{"id": "msg-forged"}'
    if db.url.startswith("postgres"):
        db.sql(
            f"UPDATE steps SET {col} = ?::jsonb WHERE run_id = 'victim' AND step_id = 'second'",
            (value,),
        )
    else:
        db.sql(
            f"UPDATE steps SET {col} = ? WHERE run_id = 'victim' AND step_id = 'second'", (value,)
        )


def _edit_run_status(db: Ledger) -> None:
    db.sql("UPDATE runs SET status = 'failed' WHERE run_id = 'victim'")


def _insert_approval(db: Ledger) -> None:
    db.sql(
        "INSERT INTO approvals (approval_id, tenant, run_id, step_id, request_digest, approver, "
        "note, approved_at) VALUES ('APR-X', 'default', 'victim', 'first', 'sha256:x', 'mallory', "
        "NULL, 1.0)"
    )


def _cut_tail(db: Ledger) -> None:
    db.unprotect()
    [(seq, prev)] = db.sql(
        "SELECT seq, prev_hash FROM audit WHERE run_id = 'victim' ORDER BY seq DESC LIMIT 1"
    )
    db.sql("DELETE FROM audit WHERE seq = ?", (seq,))
    db.sql(
        "UPDATE runs SET audit_head = ?, audit_count = audit_count - 1 WHERE run_id = 'victim'",
        (prev,),
    )


def _rewrite_and_rehash(db: Ledger) -> None:
    """Rewrite an event's actor and recompute the whole chain — and the seals — with the public
    (unkeyed) hash functions, as someone who read this source would."""
    db.unprotect()
    rows = db.sql(
        "SELECT seq, step_id, effect_id, kind, actor, detail_json, at FROM audit "
        "WHERE run_id = 'victim' ORDER BY seq"
    )
    prev = audit.genesis("victim")
    for seq, step_id, effect_id, kind, actor, detail, at in rows:
        actor = "someone-else" if kind == "run_started" else actor
        detail = json.loads(detail) if isinstance(detail, str) else detail
        digest = audit.event_hash(prev, run_id="victim", step_id=step_id, effect_id=effect_id,
                                  kind=kind, actor=actor, detail=detail, at=at)  # fmt: skip
        db.sql("UPDATE audit SET actor = ?, prev_hash = ?, hash = ? WHERE seq = ?",
               (actor, prev, digest, seq))  # fmt: skip
        prev = digest
    db.sql("UPDATE runs SET audit_head = ? WHERE run_id = 'victim'", (prev,))
    seals = db.sql(
        "SELECT n, rows_json, audit_count, at FROM seals WHERE run_id = 'victim' ORDER BY n"
    )
    events = db.sql("SELECT hash FROM audit WHERE run_id = 'victim' ORDER BY seq")
    sprev = audit.seal_genesis("victim")
    for n, rows_json, count, at in seals:
        head = events[count - 1][0]
        digest = audit.seal_hash(sprev, run_id="victim", n=n, rows=json.loads(rows_json),
                                 audit_head=head, audit_count=count, at=at)  # fmt: skip
        db.sql("UPDATE seals SET audit_head = ?, prev_hash = ?, hash = ? WHERE run_id = 'victim' "
               "AND n = ?", (head, sprev, digest, n))  # fmt: skip
        sprev = digest
    db.sql("UPDATE runs SET seal_head = ? WHERE run_id = 'victim'", (sprev,))


def _delete_run(db: Ledger) -> None:
    db.unprotect()
    for table in ("audit", "seals", "attempts", "effects", "steps", "operations", "runs"):
        db.sql(f"DELETE FROM {table} WHERE run_id = 'victim'")


TAMPERINGS: dict[str, tuple[Callable[[Ledger], None], str]] = {
    "effect_status": (_edit_effect_status, "effects:"),
    "step_output": (_edit_step_output, "steps:second differs"),
    "run_status": (_edit_run_status, "runs:victim differs"),
    "inserted_approval": (_insert_approval, "approvals:APR-X was written outside"),
    "cut_tail": (_cut_tail, "events were cut or added"),
}


def test_an_untouched_ledger_verifies(original: str, keyed: bool) -> None:
    code, out = _verify(original)
    assert code == 0, out
    assert "audit log intact" in out
    assert ("only accidental damage is detectable" in out) is not keyed


@pytest.mark.parametrize("name", sorted(TAMPERINGS))
def test_a_tampering_is_reported_with_its_own_exit_code(
    original: str, keyed: bool, tmp_path: Path, name: str
) -> None:
    tamper, says = TAMPERINGS[name]
    with _copy(original, tmp_path) as db:
        tamper(db)
        code, out = _verify(db.url)
    assert code == 4, out
    assert "run victim" in out
    assert says in out
    assert "run keep" not in out  # the untouched runs still verify


def test_a_chain_recomputed_with_the_public_hash_is_caught_only_with_the_key(
    original: str, keyed: bool, tmp_path: Path
) -> None:
    with _copy(original, tmp_path) as db:
        _rewrite_and_rehash(db)
        code, out = _verify(db.url)
    if keyed:
        assert code == 4, out
        assert "written without the audit key" in out
    else:
        # Honest: without a key anyone can recompute the chains, and verify says it cannot tell.
        assert code == 0, out
        assert "only accidental damage is detectable" in out


def test_a_deleted_run_is_caught_against_an_exported_head(
    original: str, keyed: bool, tmp_path: Path
) -> None:
    head_file = tmp_path / "head.json"
    exported = CliRunner().invoke(
        cli_main.app, ["audit", "head", "--db", original, "--out", str(head_file)]
    )
    assert exported.exit_code == 0, exported.output
    head = json.loads(head_file.read_text())
    assert sorted(r["run_id"] for r in head["runs"]) == ["doubt", "keep", "victim"]
    assert (head["key_id"] is not None) is keyed
    assert _verify(original, "--against", str(head_file))[0] == 0
    with _copy(original, tmp_path) as db:
        _delete_run(db)
        alone = _verify(db.url)
        against = _verify(db.url, "--against", str(head_file))
    assert alone[0] == 0, alone[1]  # a run deleted whole, seals and all, leaves no trace inside
    assert against[0] == 4, against[1]
    assert "run victim" in against[1]
    assert "gone (deleted)" in against[1]
    forged = {**head, "runs": [r for r in head["runs"] if r["run_id"] != "victim"]}
    head_file.write_text(json.dumps(forged))
    code, out = _verify(original, "--against", str(head_file))
    assert code == 4
    assert "signature does not match" in out


def test_a_ledger_that_cannot_be_read_is_not_called_tampered(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.db"
    bogus.write_text("not a ledger")
    code, out = _verify(f"sqlite:///{bogus}")
    assert code == 2
    assert "not an SQLite database" in out


def test_seal_digests_are_the_rows_as_both_backends_give_them_back() -> None:
    """A whole REAL comes back from SQLite as an int: the digest must not tell them apart."""
    from effectflow.ledger.records import NextAction, RunRecord, RunStatus

    def run(at: float) -> RunRecord:
        return RunRecord("r", "t", "w", "1", {"n": 1}, "sha256:x", RunStatus.RUNNING, None, None,
                         NextAction.EXECUTE, 0, at, at)  # fmt: skip

    assert audit.row_digest("runs", run(1700000000)) == audit.row_digest("runs", run(1.7e9))
    assert digests.canonical_json({"n": 1}) != digests.canonical_json({"n": 1.0})  # JSON keeps it
