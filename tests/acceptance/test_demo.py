"""The demo, driven as a user drives it: the CLI in a subprocess."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

EFFECTFLOW = shutil.which("effectflow", path=str(Path(sys.executable).parent)) or "effectflow"


def test_demo_recovers_from_sigkill_with_exactly_one_effect_each(tmp_path: Path) -> None:
    """`effectflow demo` kills its worker after S2, recovers, and the providers hold one of each."""
    done = subprocess.run(
        [EFFECTFLOW, "demo", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "worker 1 killed by SIGKILL" in done.stdout
    assert "audit chain: intact" in done.stdout
    with sqlite3.connect(tmp_path / "mail.db") as mail:
        assert mail.execute("SELECT count(*) FROM mail_messages").fetchone()[0] == 1
    with sqlite3.connect(tmp_path / "crm.db") as crm:
        assert crm.execute("SELECT count(*) FROM crm_tasks").fetchone()[0] == 1
    with sqlite3.connect(tmp_path / "effects.db") as ledger:
        statuses = ledger.execute("SELECT status FROM steps ORDER BY seq").fetchall()
        run = ledger.execute("SELECT status FROM runs").fetchone()
    assert [s for (s,) in statuses] == ["confirmed"] * 4
    assert run == ("succeeded",)


@pytest.mark.parametrize("tamper", ["edit", "delete"])
def test_audit_verify_command_detects_tampering(tmp_path: Path, tamper: str) -> None:
    """`effectflow audit verify` exits 0 on the demo's ledger and 4 once a row is edited or removed."""
    subprocess.run([EFFECTFLOW, "demo", "--dir", str(tmp_path)], capture_output=True, check=True)
    db = f"sqlite:///{tmp_path / 'effects.db'}"
    intact = subprocess.run(
        [EFFECTFLOW, "audit", "verify", "--db", db], capture_output=True, text=True, check=False
    )
    assert intact.returncode == 0, intact.stderr
    with sqlite3.connect(tmp_path / "effects.db") as ledger:
        ledger.execute("DROP TRIGGER audit_no_update")
        ledger.execute("DROP TRIGGER audit_no_delete")
        if tamper == "edit":
            ledger.execute('UPDATE audit SET detail_json = \'{"outcome":"x"}\' WHERE seq = 4')
        else:
            ledger.execute("DELETE FROM audit WHERE seq = 4")
    broken = subprocess.run(
        [EFFECTFLOW, "audit", "verify", "--db", db], capture_output=True, text=True, check=False
    )
    assert broken.returncode == 4  # tampered: its own code, not a failure to read
    assert "customer-case-92" in broken.stderr
