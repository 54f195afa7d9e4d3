"""The refund and deploy demos, driven as a user drives them: the CLI in a subprocess.

Each test reads the ledger and the provider files afterwards, so it checks what happened in the
world and what the ledger says about it, not only what the demo printed.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

from effectflow import testing

EFFECTFLOW = shutil.which("effectflow", path=str(Path(sys.executable).parent)) or "effectflow"


def _demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [EFFECTFLOW, "demo", *args], capture_output=True, text=True, timeout=60, check=False
    )


def _rows(path: Path, sql: str, *params: object) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def test_refund_demo_refunds_once_then_cancels_it_under_a_second_approval(tmp_path: Path) -> None:
    """`demo --scenario refund`: one refund, cancelled once; the ledger links cancel to refund."""
    done = _demo("--scenario", "refund", "--dir", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "audit chain: intact" in done.stdout

    payments = tmp_path / "payments.db"
    assert _rows(payments, "SELECT seq, status FROM payments_refunds") == [(1, "canceled")]
    calls = _rows(payments, "SELECT operation, fault, outcome FROM provider_calls ORDER BY call_id")
    assert calls == [
        ("create_refund", "lose_response", "ok"),
        ("create_refund", None, "replayed"),
        ("cancel_refund", None, "ok"),
    ]
    assert _rows(tmp_path / "mail.db", "SELECT count(*) FROM mail_messages") == [(1,)]

    ledger = tmp_path / "effects.db"
    assert _rows(ledger, "SELECT run_id, status FROM runs") == [
        ("refund-case-117", "cancelled_with_effects")
    ]
    effects = {
        step_id: (effect_id, status, compensation, compensates, approval, external_id)
        for step_id, effect_id, status, compensation, compensates, approval, external_id in _rows(
            ledger,
            "SELECT step_id, effect_id, status, compensation_status, compensates, approval_id,"
            " external_effect_id FROM effects WHERE run_id = ?",
            "refund-case-117",
        )
    }
    assert set(effects) == {"create_refund", "compensate:create_refund", "email_customer"}
    refund_id, *refund = effects["create_refund"]
    assert refund == ["confirmed", "compensated", None, "APR-1", "re_1"]
    assert effects["compensate:create_refund"][1:] == (
        "confirmed",
        "not_required",
        refund_id,
        "APR-2",
        "re_1",
    )
    assert effects["email_customer"][1:3] == ("confirmed", "kept")
    approvals = _rows(ledger, "SELECT approval_id, step_id, approver FROM approvals ORDER BY 1")
    assert approvals == [
        ("APR-1", "create_refund", "ops-lead"),
        ("APR-2", "compensate:create_refund", "finance"),
    ]


def test_deploy_demo_reobserves_after_a_conflict_and_overwrites_nothing(tmp_path: Path) -> None:
    """`demo --scenario deploy`: a 412, a re-observation, and our revision on top of theirs."""
    done = _demo("--scenario", "deploy", "--dir", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reobserve" in done.stdout

    history = _rows(
        tmp_path / "deploy.db",
        "SELECT writer, revision, based_on, expected_revision FROM deploy_deployments"
        " WHERE target = 'web' ORDER BY seq",
    )
    assert history == [("other", 2, 1, None), ("us", 3, 2, 2)]
    with testing.DeployTarget(tmp_path / "deploy.db") as target:
        assert target.overwrites("web") == 0

    ledger = tmp_path / "effects.db"
    assert _rows(ledger, "SELECT status FROM runs WHERE run_id = 'deploy-web-42'") == [
        ("succeeded",)
    ]
    effects = _rows(
        ledger,
        "SELECT status, external_effect_id, logical_operation_id FROM effects"
        " WHERE run_id = 'deploy-web-42' ORDER BY created_at",
    )
    assert [(status, ext) for status, ext, _ in effects] == [
        ("conflict", None),
        ("confirmed", "dep_2"),
    ]
    assert effects[0][2] != effects[1][2], "each step revision is its own logical operation"
    revisions = _rows(
        ledger,
        "SELECT step_id, step_revision FROM steps WHERE run_id = 'deploy-web-42' ORDER BY seq",
    )
    assert revisions == [("observe", 2), ("deploy", 2)]
    reobserve = _rows(
        ledger,
        "SELECT detail_json FROM audit WHERE run_id = 'deploy-web-42' AND kind = 'reobserve'",
    )
    assert [json.loads(str(d))["observe_revision"] for (d,) in reobserve] == [2]


def test_unknown_scenario_is_a_usage_error(tmp_path: Path) -> None:
    """`demo --scenario nope` exits 2 and names the scenarios there are."""
    done = _demo("--scenario", "nope", "--dir", str(tmp_path))
    assert done.returncode == 2
    for name in ("customer_case", "refund", "deploy"):
        assert name in done.stderr
    assert not (tmp_path / "effects.db").exists()


def test_customer_case_is_the_default_and_can_be_named(tmp_path: Path) -> None:
    """`demo --scenario customer_case` runs the same demo as plain `demo`."""
    done = _demo("--scenario", "customer_case", "--dir", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "worker 1 killed by SIGKILL" in done.stdout
    assert _rows(tmp_path / "effects.db", "SELECT run_id, status FROM runs") == [
        ("customer-case-92", "succeeded")
    ]


def test_a_scenario_refuses_a_folder_that_holds_a_ledger(tmp_path: Path) -> None:
    """A second `demo --scenario deploy` in the same folder exits 2 and changes nothing."""
    assert _demo("--scenario", "deploy", "--dir", str(tmp_path)).returncode == 0
    again = _demo("--scenario", "deploy", "--dir", str(tmp_path))
    assert again.returncode == 2
    assert "give --dir an empty folder" in again.stdout
    assert len(_rows(tmp_path / "deploy.db", "SELECT * FROM deploy_deployments")) == 2
