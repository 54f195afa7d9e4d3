"""``examples/openai_agents_agent.py``, run as a user runs it: a real subprocess, offline.

The example asserts on its provider's records itself (one email, two refunds, each approved under
the policy in force), so its exit code is the proof; the lines checked here are the ones
docs/integrations/openai_agents.md describes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "openai_agents_agent.py"


def test_the_openai_agents_example_sends_once_refunds_once_per_approval_and_exits_0() -> None:
    """One email through a retried turn, a refund approved and resumed twice, an approval
    outdated by a policy change and asked again; exit code 0, with no API key in sight."""
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    # (a) and (b): done once; the fresh id of the retried turn answered as already done.
    assert 'the model sees (call_1): {"happened": true' in out
    assert 'the model sees (call_2): {"happened": true, "message": "this was already done' in out
    assert "the provider's outbox: 1 email (email_1)" in out
    # (c): the interruption, the approval, the same saved state resumed twice, one refund.
    assert 'the run stopped: refund({"order":"o-17","amount_cents":4200}), call call_3' in out
    assert out.count('the model sees (call_3): {"happened": true') == 2
    assert "the provider's refunds: 1 (refund_2)" in out
    # (d): the approval under the old policy is not spent; the new call is approved under v2.
    assert '"status": "approval_outdated"' in out
    assert "the model called again (call_5): a new approval, under v2" in out
    assert 'openai-agents:order-18 ["call_4","refunds-v1"]: failed' in out
    assert 'openai-agents:order-18 ["call_5","refunds-v2"]: succeeded (approved by alice)' in out
    assert out.rstrip().endswith(
        "ok: 1 email and 2 refunds, each approved under the policy in force"
    )
