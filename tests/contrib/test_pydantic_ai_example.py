"""``examples/pydantic_ai_agent.py``, run as a user runs it: a real subprocess, offline.

The example asserts on its provider's records itself (two emails, one refund), so its exit code is
the proof; the lines checked here are the ones docs/integrations/pydantic_ai.md describes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "pydantic_ai_agent.py"


def test_the_pydantic_ai_example_sends_once_waits_for_approval_and_exits_0() -> None:
    """One email through a lost turn asked again, a refund approved through deferred tools and
    made once, one email through DBOS running the turn again, exit code 0."""
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
    assert '"status": "already_done"' in out
    assert "the provider's outbox: 1 email (email_1)" in out
    assert 'kind: "approval"' in out
    assert 'resume_with: {"approved": true, "approver": "<who>"}' in out
    assert "the provider's refunds: 1 (refund_2), approved by alice" in out
    assert out.count('"id": "email_3"') == 2, "DBOS's fork was answered with the first result"
    assert "call_4 in pydantic_ai:case-bo: succeeded" in out
    assert out.rstrip().endswith("ok: 2 emails and 1 refund, whatever ran again")
