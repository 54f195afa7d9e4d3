"""``examples/langgraph_agent.py``, run as a user runs it: a real subprocess, offline.

The example asserts on its provider's records itself (one email, one refund, whatever the host
replayed), so its exit code is the proof; the lines checked here are the ones the README and
docs/integrations/langgraph.md describe.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "langgraph_agent.py"


def test_the_langgraph_example_sends_once_waits_for_approval_and_exits_0() -> None:
    """One email through two replays, a refund paused for approval and resumed, exit code 0."""
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
    # (a) and (b): done once, the same id replayed, a fresh id answered as already done.
    assert out.count('the model sees (call_1): {"happened": true') == 2
    assert 'the model sees (call_2): {"happened": true, "message": "this was already done' in out
    assert '"status": "already_done"}' in out
    assert "the provider's outbox: 1 email (email_1)" in out
    # (c): the interrupt payload, the resume, the refund made once.
    assert 'kind: "approval"' in out
    assert 'next_action: "approve"' in out
    assert 'for_model: "this needs a person\'s approval before it is done; do not repeat it"' in out
    assert 'resume_with: {"approved": true, "approver": "<who>"}' in out
    assert "Command(resume={'approved': True, 'approver': 'alice@support'})" in out
    assert "the provider's refunds: 1 (refund_2)" in out
    # The ledger: one guarded call per (scope, tool-call id).
    assert "langgraph:ada:tools call_1: succeeded" in out
    assert "langgraph:ada:tools call_2: succeeded" in out
    assert "langgraph:order-17:tools call_3: succeeded" in out
    assert out.rstrip().endswith("ok: 1 email and 1 refund, whatever the host replayed")
