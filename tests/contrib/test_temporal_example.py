"""``examples/temporal_agent.py``, run as a user runs it: a real subprocess, offline.

The example asserts on its provider's records itself (one email, one refund), so its exit code is
the proof; the lines checked here are the ones docs/integrations/temporal.md describes.
"""

from __future__ import annotations

import asyncio
import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "temporal_agent.py"


def test_the_temporal_example_sends_once_waits_for_a_person_and_exits_0() -> None:
    """One email through a retry and a regenerated activity id, a refund that ends its attempt
    with NEEDS_PERSON and is made once by the decision activity, exit code 0."""
    done = subprocess.run(
        [sys.executable, "-W", "error", str(EXAMPLE)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert out.count("returned: {'id': 'email_1'") == 3
    assert "the provider's outbox: 1 email (email_1)" in out
    assert "type=EffectflowNeedsPerson non_retryable=True" in out
    assert 'kind: "approval"' in out
    assert "the provider's refunds: 1 (refund_2)" in out
    assert '"state": "call"' in out
    heartbeats = out.split("heartbeats:")[1].splitlines()[0]
    assert "ada@example.com" not in heartbeats
    assert "Shipped" not in heartbeats
    assert "temporal:case-ada:run-1 1: succeeded" in out
    assert out.rstrip().endswith("ok: 1 email and 1 refund, whatever Temporal retried")


def test_the_examples_workflow_passes_temporals_sandbox_validation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``SupportCase`` loads in Temporal's workflow sandbox, which imports the example's module
    afresh with effectflow in it: the check a ``Worker`` runs on its workflows when it starts (its
    run is not executed: no server)."""
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))
    try:
        module = importlib.import_module(EXAMPLE.stem)
        definition = workflow._Definition.must_from_class(module.SupportCase)

        async def validate() -> None:
            SandboxedWorkflowRunner().prepare_workflow(definition)

        asyncio.run(validate())
        assert definition.name == "support_case"
        assert set(definition.signals) == {"decide"}
    finally:
        sys.modules.pop(EXAMPLE.stem, None)
