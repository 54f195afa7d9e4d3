"""`effectflow demo --scenario agent`, driven as a user drives it: the CLI in a subprocess.

The test reads the model's ask log, the provider files and the ledger afterwards, so it checks what
happened, not only what the demo printed.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

EFFECTFLOW = shutil.which("effectflow", path=str(Path(sys.executable).parent)) or "effectflow"


def _rows(path: Path, sql: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_agent_demo_survives_a_sigkill_without_reasking_the_model(tmp_path: Path) -> None:
    """The worker dies mid-turn; recovery asks the model only for the unrecorded turn; one refund,
    one email."""
    done = subprocess.run(
        [EFFECTFLOW, "demo", "--scenario", "agent", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "worker 1 killed by SIGKILL" in done.stdout
    assert "audit chain: intact" in done.stdout
    assert (tmp_path / "model_asks.log").read_text().splitlines() == ["turn 1", "turn 2", "turn 3"]
    assert _rows(tmp_path / "payments.db", "SELECT count(*) FROM payments_refunds") == [(1,)]
    assert _rows(tmp_path / "mail.db", "SELECT count(*) FROM mail_messages") == [(1,)]
    assert _rows(tmp_path / "effects.db", "SELECT run_id, status FROM runs") == [
        ("agent-order-17", "succeeded")
    ]
    steps = _rows(tmp_path / "effects.db", "SELECT step_id FROM steps ORDER BY seq")
    assert [s for (s,) in steps if str(s).startswith("model_turn_")] == [
        "model_turn_1",
        "model_turn_2",
        "model_turn_3",
    ]


def test_agent_demo_refuses_a_used_folder(tmp_path: Path) -> None:
    """A folder that already holds a ledger is refused with exit code 2."""
    (tmp_path / "effects.db").write_text("")
    done = subprocess.run(
        [EFFECTFLOW, "demo", "--scenario", "agent", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
