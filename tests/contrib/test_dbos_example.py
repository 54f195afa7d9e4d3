"""``examples/dbos_agent.py``, run as a user runs it: a real subprocess, offline.

The example asserts on its provider's records itself (one email, one refund), so its exit code is
the proof; the lines checked here are the ones docs/integrations/dbos.md describes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "dbos_agent.py"


def test_the_dbos_example_sends_once_waits_for_approval_and_exits_0() -> None:
    """One email through DBOS running the workflow twice, a refund approved through DBOS's
    messages and made once, exit code 0."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert out.count("the workflow got: {'id': 'email_1'") == 2
    assert "the provider's outbox: 1 email (email_1)" in out
    assert 'kind: "approval"' in out
    assert 'resume_with: {"approved": true, "approver": "<who>"}' in out
    assert "the provider's refunds: 1 (refund_2)" in out
    assert "dbos:case-ada step-2: succeeded" in out
    assert out.rstrip().endswith("ok: 1 email and 1 refund, whatever DBOS ran again")
