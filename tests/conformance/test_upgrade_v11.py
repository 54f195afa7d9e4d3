"""A version-10 ledger upgraded to version 11, on both backends: each step gains an
``arguments_json`` column, NULL for the steps written before it; the rows sealed before the column
existed still verify, and the ones written after are sealed with it; an old step shows no
arguments without error; the runs go on (an approval answered, a guarded call replayed and
regenerated) under version 11.

The ledger is ``tests/fixtures/ledger_v10_arguments.sql``: written by effectflow at the last
version-10 commit (keyed), dumped as SQL, loaded here into each backend's version-10 schema.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from test_upgrade_v8 import KEY, ledger_at, raw
from typer.testing import CliRunner

import effectflow as ef
import ledgers
from effectflow.cli import main as cli_main
from effectflow.ledger import audit

FIXTURE = Path(__file__).parent.parent / "fixtures" / "ledger_v10_arguments.sql"
ARCHIVE = FIXTURE.parent / "archive_v10.jsonl"
#: What the providers did after the upgrade (the tools' calls).
CALLS: list[tuple[str, Any]] = []


@ef.tool("v10_note", effect="external_write", idempotency=ef.Idempotency(supported=True))
def note(text: str, *, idempotency_key: str) -> dict[str, str]:
    CALLS.append(("note", text))
    return {"id": f"n-{text}"}


@ef.tool("v10_refund", effect="financial_write", idempotency=ef.Idempotency(supported=True))
def refund(amount: int, *, idempotency_key: str) -> dict[str, Any]:
    CALLS.append(("refund", amount))
    return {"id": f"rf-{amount}", "amount": amount}


@ef.tool("v10_send", effect="external_write", idempotency=ef.Idempotency(supported=True))
def send(to: str, *, idempotency_key: str) -> dict[str, str]:
    CALLS.append(("send", to))
    return {"id": f"m-{to}"}


@ef.workflow("v10_case")
def case(ctx: ef.Context, amount: int) -> Any:
    first = ctx.call("note", note, text=f"case-{amount}")
    return [first, ctx.call("refund", refund, amount=amount)]


@pytest.fixture(params=ledgers.BACKENDS)
def v10(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    CALLS.clear()
    monkeypatch.setenv(audit.KEY_ENV, KEY)
    with ledger_at(request.param, tmp_path, 10, FIXTURE) as url:
        yield url


def _cli(url: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli_main.app, [*args, "--db", url])
    return result.exit_code, result.output


def test_the_upgraded_ledger_verifies_and_its_old_steps_show_no_arguments(v10: str) -> None:
    """After the upgrade every step has the column, NULL; the seals written before it verify (in
    process and by the CLI); show, the store and the step records read the old steps as None."""
    with ef.Runtime(v10) as rt:
        assert rt.store.schema_version() == 11
        assert rt.verify_audit() == []
        steps = rt.store.steps("done")
        assert [s.step_id for s in steps] == ["note", "refund"]
        assert all(s.arguments is None for s in steps)
    assert raw(v10, "SELECT count(*) FROM steps WHERE arguments_json IS NOT NULL") == [(0,)]
    assert raw(v10, "SELECT count(*) FROM steps")[0][0] == 5
    code, out = _cli(v10, "audit", "verify")
    assert code == 0, out
    code, out = _cli(v10, "show", "done")
    assert code == 0, out
    assert "refund" in out
    assert "arguments {" not in out  # none recorded, none shown


def test_an_old_row_given_arguments_by_hand_is_caught(v10: str) -> None:
    """A NULL is digested as the row was before the column: a value written there by hand, on a
    row sealed without it, is an edit."""
    with ef.Runtime(v10) as rt:
        assert rt.verify_audit() == []
    _exec(v10, "UPDATE steps SET arguments_json = '{\"amount\":5}' WHERE run_id = 'done'")
    with ef.Runtime(v10) as rt:
        found = [p.message for p in rt.verify_audit()]
    assert any("steps:note differs" in m or "steps:refund differs" in m for m in found), found


def _exec(url: str, sql: str) -> None:
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            conn.execute(sql)
            conn.commit()
        finally:
            conn.close()
    else:
        with psycopg.connect(url) as pg:
            pg.execute(sql)


def test_the_runs_go_on_and_new_rows_are_sealed_with_their_arguments(v10: str) -> None:
    """The waiting refund, approved after the upgrade, is sent once and records its arguments;
    the guarded call recorded before (its input without a request digest) replays to its result
    and a regenerated copy is the same operation; the ledger verifies throughout."""
    with ef.Runtime(v10) as rt:
        ended = rt.approve("wait", "refund", approver="ops", approval_id="A-wait")
        assert ended.status is ef.RunStatus.SUCCEEDED
        assert CALLS == [("refund", 7)]
        refund_step = next(s for s in rt.store.steps("wait") if s.step_id == "refund")
        assert refund_step.arguments == {"amount": 7}
        again = rt.guard(send, {"to": "ann"}, scope="s1", call_id="c1")
        assert again.value == {"id": "m-ann"}
        copy = rt.guard(send, {"to": "ann"}, scope="s1", call_id="c2")
        assert copy.value == {"id": "m-ann"}
        assert copy.deduplicated
        assert CALLS == [("refund", 7)]  # neither guarded call was made again
        assert rt.verify_audit() == []
    code, out = _cli(v10, "audit", "verify")
    assert code == 0, out


def test_an_archive_file_written_at_version_10_still_verifies() -> None:
    """``tests/fixtures/archive_v10.jsonl`` (run done, archived by effectflow at the last
    version-10 commit, unkeyed) has no step arguments: its rows read them as NULL and it verifies
    on its own."""
    result = CliRunner().invoke(cli_main.app, ["audit", "verify", "--archive", str(ARCHIVE)])
    assert result.exit_code == 0, result.output
    assert "intact" in result.output
