"""A version-8 ledger upgraded to version 9, on both backends: a step that waited for an approval
as ``pending`` with the error code ``approval_required`` becomes ``awaiting_approval`` through a
sealed write of its own run, so the ledger verifies across the upgrade; the runs go on (approved,
declined) under version 9; a keyed ledger is not upgraded by a process without its key.

The ledger is ``tests/fixtures/ledger_v8_awaiting_approval.sql``: written by effectflow at the last
version-8 commit (keyed), dumped as SQL, loaded here into each backend's version-8 schema.
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

FIXTURE = Path(__file__).parent.parent / "fixtures" / "ledger_v8_awaiting_approval.sql"
#: What the refund provider did, as its own record (the tool's calls).
REFUNDS: list[int] = []


@ef.tool("v8_note", effect="external_write", idempotency=ef.Idempotency(supported=True))
def note(text: str, *, idempotency_key: str) -> dict[str, str]:
    raise AssertionError("the note of a version-8 run was confirmed before the upgrade")


@ef.tool("v8_refund", effect="financial_write", idempotency=ef.Idempotency(supported=True))
def refund(amount: int, *, idempotency_key: str) -> dict[str, Any]:
    REFUNDS.append(amount)
    return {"id": f"rf-{amount}", "amount": amount}


@ef.workflow("v8_case")
def case(ctx: ef.Context, amount: int) -> Any:
    first = ctx.call("note", note, text=f"case-{amount}")
    return [first, ctx.call("refund", refund, amount=amount)]


@pytest.fixture(params=ledgers.BACKENDS)
def v8(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    REFUNDS.clear()
    monkeypatch.setenv(audit.KEY_ENV, KEY)
    with ledger_at(request.param, tmp_path, 8, FIXTURE) as url:
        yield url


def _verify(url: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli_main.app, ["audit", "verify", "--db", url])
    return result.exit_code, result.output


def test_a_step_waiting_for_approval_is_awaiting_approval_after_the_upgrade(v8: str) -> None:
    """Both waiting steps take the new status in a sealed write (an audit event each), the
    approved run's step is left as it was, and the ledger verifies, in process and by the CLI."""
    with ef.Runtime(v8) as rt:
        assert rt.store.schema_version() >= 9  # later migrations run too
        for run_id in ("wait-a", "wait-b"):
            refund_step = {s.step_id: s for s in rt.steps(run_id)}["refund"]
            assert refund_step.status is ef.StepStatus.AWAITING_APPROVAL
            assert (refund_step.error or {}).get("code") == "approval_required"  # why, kept
            assert rt.run(run_id).status is ef.RunStatus.PAUSED
            migrated = [e for e in rt.audit(run_id) if e.kind == "step_status_migrated"]
            assert [(e.step_id, e.detail) for e in migrated] == [
                ("refund", {"was": "pending", "now": "awaiting_approval"})
            ]
        assert {s.step_id: s.status for s in rt.steps("done")}["refund"] is ef.StepStatus.CONFIRMED
        assert sorted(i.run_id for i in rt.attention() if i.kind == "approval") == [
            "wait-a",
            "wait-b",
        ]
        assert rt.store.verify_audit() == []
    code, out = _verify(v8)
    assert code == 0, out
    assert raw(v8, "SELECT count(*) FROM steps WHERE status = 'pending'") == [(0,)]


def test_the_upgraded_runs_go_on_approved_and_declined(v8: str) -> None:
    """An approval given after the upgrade sends the refund once; a decline sends nothing; the
    ledger verifies after both."""
    with ef.Runtime(v8) as rt:
        approved = rt.approve("wait-a", "refund", approver="ops", approval_id="A-wait-a")
        assert approved.status is ef.RunStatus.SUCCEEDED, approved
        declined = rt.reject("wait-b", "refund", by="ops", reason="not this one")
        assert declined.status is ef.RunStatus.FAILED, declined
        assert rt.resume("wait-a").status is ef.RunStatus.SUCCEEDED
        assert rt.store.verify_audit() == []
    assert REFUNDS == [10]
    code, out = _verify(v8)
    assert code == 0, out


def test_a_keyed_ledger_is_not_upgraded_without_its_key(
    v8: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the key the new seals could not be keyed: opening the ledger is refused, saying
    what to do, and it is left at version 8 with its rows untouched."""
    monkeypatch.delenv(audit.KEY_ENV)
    before = raw(v8, "SELECT run_id, step_id, status FROM steps ORDER BY run_id, step_id")
    with pytest.raises(ef.LedgerFileError, match="EFFECTFLOW_AUDIT_KEY") as caught:
        ef.Runtime(v8)
    assert "still at version 8" in str(caught.value)
    assert raw(v8, "SELECT max(version) FROM schema_migrations") == [(8,)]
    assert raw(v8, "SELECT run_id, step_id, status FROM steps ORDER BY run_id, step_id") == before


def test_a_migrated_step_edited_back_by_hand_is_caught(v8: str) -> None:
    """The migration's seal covers the new status: a step set back to ``pending`` by hand after
    the upgrade is reported by verify."""
    with ef.Runtime(v8) as rt:
        assert rt.store.verify_audit() == []
    if v8.startswith("sqlite"):
        conn = sqlite3.connect(v8.removeprefix("sqlite:///"))
        conn.execute(
            "UPDATE steps SET status = 'pending' WHERE run_id = 'wait-a'AND step_id = 'refund'"
        )
        conn.commit()
        conn.close()
    else:
        with psycopg.connect(v8, autocommit=True) as pg:
            pg.execute(
                "UPDATE steps SET status = 'pending' WHERE run_id = 'wait-a' AND step_id = 'refund'"
            )
    code, out = _verify(v8)
    assert code == 4, out
    assert "wait-a" in out
